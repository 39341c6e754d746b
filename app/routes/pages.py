"""The dashboard's pages: thin handlers that parse the form, call one function, and render a page
or, for htmx, the block of it that changed (see ``app.web.render``)."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import RedirectResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from sqlmodel import Session
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData, QueryParams

from app import auth_browser
from app.deps import SessionDep, get_launcher
from app.errors import AppError, render_error
from app.models import Run, RunCreate, RunStatus
from app.run_form import (
    ATTENTION_HELP,
    FIELDS,
    FormError,
    form_to_spec_data,
    grouped_fields,
    issues_by_field,
    spec_to_form_values,
)
from app.run_view import (
    CHARTS,
    MAX_MEMORY_MB,
    REWARD_KEYS,
    STEP_TIME_S,
    TOKENS_PER_S,
    RunView,
    aligned_series,
    apply_event,
    eager_settings,
    fold,
    format_eta,
    max_of,
    mean_of,
    role_badges,
    series,
    spec_differences,
)
from app.services import checkpoints as checkpoints_service
from app.services import events as events_service
from app.services import runs as runs_service
from app.services import tokens as tokens_service
from app.services.auth import Principal, current_principal
from app.services.feeds import RunFeed
from app.services.probes import NodeProbe, latest_node_probe
from app.web import STATIC_DIR, add_security_headers, render, templates
from worker.attention.resolution import Resolution, resolve
from worker.core.environment import PROFILES, Environment
from worker.core.roles import SETTINGS, Role
from worker.interop.specfile import detect_format
from worker.interop.verl import VerlImportError, export_command, export_yaml, import_command, import_yaml
from worker.spec import PASSTHROUGH_NOTE, Issue, RunSpec, SpecError, check_spec, flatten, parse_spec

router = APIRouter(tags=["pages"], include_in_schema=False)


class LoginRequired(Exception):
    """A page that needs a principal was asked for anonymously: the browser goes to /login."""


def page_user(request: Request, session: SessionDep) -> Principal:
    """Who is looking (bearer token or session cookie), and the CSRF token the page embeds."""
    principal = current_principal(request, session, request.app.state.authenticators)
    request.state.principal = principal
    request.state.csrf_token = auth_browser.csrf_token_for(request)
    if request.app.state.settings.REQUIRE_TOKEN_FOR_READS and not principal.can("read"):
        raise LoginRequired()
    return principal


PageUser = Annotated[Principal, Depends(page_user)]
CSRF = [Depends(auth_browser.check_csrf)]


def require_page_write(principal: Principal) -> None:
    if principal.kind == "anonymous":
        raise LoginRequired()
    if not principal.can("write"):
        raise AppError(403, "forbidden", f"{principal.kind} {principal.name!r} is read only: launching, cancelling "
                       "and retrying need a token with the write scope", field="scope",
                       value=sorted(principal.scopes), valid=["write"])

DEFAULT_ENV = "cpu"


def starting_spec() -> RunSpec:
    """The spec a new form starts from: the tiny CPU preset when the worker provides it."""
    try:
        from worker.spec.presets import tiny_cpu_spec
    except ImportError:  # the presets module lands with the worker; verl's defaults until then
        return RunSpec()
    return tiny_cpu_spec()


def _multi(data: FormData | QueryParams) -> dict[str, list[str]]:
    return {key: [v for v in data.getlist(key) if isinstance(v, str)] for key in data}


PROBE_ENV = "probe"


def _environment(name: str, probe: NodeProbe | None = None) -> Environment:
    if name == PROBE_ENV and probe is not None:
        return probe.environment
    return PROFILES.get(name) or PROFILES[DEFAULT_ENV]


class FormState:
    """What the form page shows: values, the spec if it parsed, issues per input, the preview.

    ``probe``: the newest probe of a worker node (``NodeProbe``), offered as the ``probe`` environment."""

    def __init__(self, form: dict[str, list[str]] | None = None, *, spec: RunSpec | None = None,
                 probe: NodeProbe | None = None):
        self.errors: dict[str, list[Issue]] = {}
        self.warnings: list[Issue] = []
        self.spec: RunSpec | None = spec
        self.name = ""
        self.env_name = DEFAULT_ENV
        self.probe = probe
        if form is not None:
            self.name = (form.get("name") or [""])[-1].strip()
            self.env_name = (form.get("env") or [DEFAULT_ENV])[-1]
            try:
                self.spec = parse_spec(form_to_spec_data(form))
            except (FormError, SpecError) as exc:
                self.errors = issues_by_field(exc.issues)
            valid = [*PROFILES, *([PROBE_ENV] if probe is not None else [])]
            if form.get("env") and self.env_name not in valid:
                why = " (no worker node has been probed yet: a run's env_probe event provides one)" \
                    if self.env_name == PROBE_ENV else ""
                self.errors.setdefault("env", []).append(
                    Issue("env", self.env_name, f"unknown environment {self.env_name!r}{why}; valid: {', '.join(valid)}"))
        if self.spec is not None:
            for issue in check_spec(self.spec):
                if issue.severity == "error":
                    for key, found in issues_by_field([issue]).items():
                        self.errors.setdefault(key, []).extend(found)
                else:
                    self.warnings.append(issue)
        self.values = spec_to_form_values(self.spec) if self.spec is not None and not self.errors else \
            _raw_values(form or {})

    @property
    def resolution(self) -> Resolution | None:
        if self.spec is None or self.errors:
            return None
        return resolve(self.spec, _environment(self.env_name, self.probe))

    @property
    def environment(self) -> str | dict[str, Any]:
        """What a launched run records as its target environment: a profile name, or the probe's fields."""
        if self.env_name == PROBE_ENV and self.probe is not None:
            return self.probe.environment.to_dict()
        return self.env_name

    def context(self, **extra: Any) -> dict[str, Any]:
        return {
            "groups": grouped_fields(),
            "values": self.values,
            "errors": self.errors,
            "error_count": sum(len(v) for v in self.errors.values()),
            "field_ids": {f.key: f.input_id for f in FIELDS},
            "warnings": self.warnings,
            "resolution": self.resolution,
            "name": self.name,
            "env_name": self.env_name,
            "profiles": list(PROFILES.values()),
            "probe_available": self.probe is not None,
            "probe_label": self.probe.label if self.probe is not None else None,
            "attention_help": ATTENTION_HELP,
            "export": None,
            "passthrough": self.spec.verl_passthrough if self.spec is not None and not self.errors else {},
            "passthrough_note": PASSTHROUGH_NOTE,
            **extra,
        }


def _raw_values(form: dict[str, list[str]]) -> dict[str, Any]:
    """Echo what was typed when it does not parse, so nothing the user wrote is lost."""
    values: dict[str, Any] = {}
    for f in FIELDS:
        given = form.get(f.key) or [""]
        values[f.key] = given[-1] == "true" if f.widget == "checkbox" else given[-1]
    return values


def page_context(request: Request) -> dict[str, Any]:
    """What every page's layout needs: the principal and the CSRF token (see ``app.auth_browser``)."""
    return {
        "principal": getattr(request.state, "principal", None),
        "csrf_token": getattr(request.state, "csrf_token", ""),
    }


# --------------------------------------------------------------------------------------------
# New run


@router.get("/runs/new")
def new_run(request: Request, _: PageUser, session: SessionDep) -> Response:
    state = FormState(spec=starting_spec(), probe=latest_node_probe(session))
    return render(request, "run_new.html", {**page_context(request), **state.context()})


@router.post("/runs/preview", dependencies=CSRF)
async def preview(request: Request, _: PageUser, session: SessionDep) -> Response:
    form = _multi(await request.form())
    state = FormState(form, probe=await run_in_threadpool(latest_node_probe, session))
    return render(request, "run_new.html", {**page_context(request), **state.context()}, block="preview")


@router.post("/runs/import", dependencies=CSRF)
async def import_verl(request: Request, _: PageUser) -> Response:
    form = _multi(await request.form())
    text = (form.get("verl_text") or [""])[-1]
    importer = import_yaml if detect_format(text) == "yaml" else import_command
    try:
        result = importer(text)
    except VerlImportError as exc:
        state = FormState(spec=starting_spec())
        issues = list(exc.issues) or [Issue("verl_text", exc.token, str(exc))]
        state.errors = {"(import)": issues}
        return render(request, "run_new.html",
                      {**page_context(request), **state.context(verl_text=text, import_open=True)},
                      block="form_area", status_code=422)
    state = FormState(spec=result.spec)
    notes = [f"{len(result.overrides)} setting{'s' if len(result.overrides) != 1 else ''} imported", *result.warnings]
    return render(request, "run_new.html",
                  {**page_context(request), **state.context(verl_text=text, import_notes=notes, import_open=True)},
                  block="form_area")


# --------------------------------------------------------------------------------------------
# Export of the current form


@router.get("/runs/export/command")
def export_form_command(request: Request, _: PageUser, session: SessionDep) -> Response:
    state = FormState(_multi(request.query_params), probe=latest_node_probe(session))
    if state.spec is None or state.errors:
        return render(request, "run_new.html", {**page_context(request), **state.context()}, block="preview",
                      status_code=422)
    return render(request, "run_new.html", {**page_context(request), **state.context(export=export_command(state.spec))},
                  block="export")


@router.get("/runs/export.yaml")
def export_form_yaml(request: Request, _: PageUser, session: SessionDep) -> Response:
    state = FormState(_multi(request.query_params), probe=latest_node_probe(session))
    if state.spec is None or state.errors:
        return render(request, "run_new.html", {**page_context(request), **state.context()}, status_code=422)
    result = export_yaml(state.spec)
    filename = "".join(c if c.isalnum() or c in "-_" else "-" for c in (state.name or "run")) + ".yaml"
    return add_security_headers(Response(result.text, media_type="application/yaml",
                                         headers={"Content-Disposition": f'attachment; filename="{filename}"'}))


def redirect(url: str) -> RedirectResponse:
    return RedirectResponse(url, status_code=303)


# --------------------------------------------------------------------------------------------
# Launch


@router.post("/runs", dependencies=CSRF)
async def launch(request: Request, principal: PageUser, session: SessionDep) -> Response:
    require_page_write(principal)
    form = _multi(await request.form())
    state = FormState(form, probe=await run_in_threadpool(latest_node_probe, session))
    if state.spec is None or state.errors:
        return render(request, "run_new.html", {**page_context(request), **state.context()}, status_code=422)
    data = RunCreate(name=state.name or state.spec.trainer.experiment_name or None,
                     spec=state.spec.model_dump(mode="json"), environment=state.environment)
    run = await run_in_threadpool(runs_service.create_run, session, data=data, launcher=get_launcher(request))
    return redirect(f"/runs/{run.id}")


# --------------------------------------------------------------------------------------------
# Login


@router.get("/login")
def login_page(request: Request, next: str = "/") -> Response:
    request.state.csrf_token = auth_browser.csrf_token_for(request)
    return render(request, "login.html", {"csrf_token": request.state.csrf_token, "principal": None,
                                          "next": auth_browser.safe_next(next), "error": None})


@router.post("/login", dependencies=CSRF)
async def login(request: Request, session: SessionDep) -> Response:
    form = await request.form()
    token = str(form.get("token") or "").strip()
    target = auth_browser.safe_next(str(form.get("next") or "/"))
    row = await run_in_threadpool(tokens_service.authenticate_token, session, token=token) if token else None
    if row is None:
        request.state.csrf_token = auth_browser.csrf_token_for(request)
        message = "enter an API token (atb_...)" if not token else "unknown or revoked token"
        return render(request, "login.html", {"csrf_token": request.state.csrf_token, "principal": None,
                                              "next": target, "error": message}, status_code=401)
    response = redirect(target)
    auth_browser.start_session(request, response, row)
    return response


@router.post("/logout", dependencies=CSRF)
def logout() -> Response:
    response = redirect("/login")
    auth_browser.end_session(response)
    return response


# --------------------------------------------------------------------------------------------
# Runs list

PAGE_SIZE = 25


@router.get("/")
def runs_list(request: Request, _: PageUser, session: SessionDep, status: str = "", q: str = "", page: int = 1) -> Response:
    statuses = [RunStatus(s) for s in status.split(",") if s in RunStatus.__members__]
    page = max(1, page)
    rows, total = runs_service.list_runs(session, status=statuses or None, name=q.strip() or None,
                                         limit=PAGE_SIZE, offset=(page - 1) * PAGE_SIZE)
    events = events_service.attention_events(session, run_ids=[r.id for r in rows if r.id is not None])
    badges = {run_id: role_badges(found) for run_id, found in events.items()}
    return render(request, "runs.html", {**page_context(request), "runs": rows, "total": total, "page": page,
                                         "pages": max(1, -(-total // PAGE_SIZE)), "status": status, "q": q,
                                         "statuses": [s.value for s in RunStatus], "badges": badges,
                                         "eager": {run_id: eager_settings(b) for run_id, b in badges.items()}},
                  block="runs")


# --------------------------------------------------------------------------------------------
# Live run page and its event stream


def _load_view(session: Session, run: Run) -> RunView:
    events: list[Any] = []
    after = 0
    while True:
        batch, _ = events_service.events_since(session, run_id=run.id, after_seq=after, limit=1000)
        events.extend(batch)
        if len(batch) < 1000:
            break
        after = batch[-1].seq
    return fold(events, total_steps=run.total_steps, status=run.status)


def _run_context(request: Request, session: Session, run: Run) -> dict[str, Any]:
    view = _load_view(session, run)
    return {**page_context(request), "run": run, "view": view, "charts": CHARTS, "eta": format_eta(view.eta_seconds),
            "eager_roles": eager_roles(run, view), "passthrough": passthrough_of(run),
            "passthrough_note": PASSTHROUGH_NOTE, **checkpoint_context(request, run, view)}


def checkpoint_context(request: Request, run: Run, view: RunView) -> dict[str, Any]:
    """The run's checkpoints (read from its folder) and, for a failed or cancelled run, the one a "Resume
    from checkpoint" button resumes from."""
    root = request.app.state.settings.checkpoint_root
    listed = checkpoints_service.run_checkpoints(run, root)
    resumable = [c for c in listed.data if c.resumable]
    offer = view.status in checkpoints_service.RESUMABLE_STATUSES and resumable
    return {"checkpoints": listed, "resume_from": resumable[-1] if offer else None}


def passthrough_of(run: Run) -> dict[str, Any]:
    """The run's verl keys that attnboard does not run (its stored spec's ``verl_passthrough``)."""
    value = run.spec.get("verl_passthrough") if isinstance(run.spec, dict) else None
    return value if isinstance(value, dict) else {}


def eager_roles(run: Run, view: RunView) -> list[str]:
    """The settings a "retry with eager on ..." button is offered for: those whose role fell back or did
    not load, the critic only when the run trains one (gae)."""
    has_critic = (run.spec.get("algorithm") or {}).get("adv_estimator", "gae") == "gae"
    return [role for role in view.eager_retry_roles() if role != Role.critic.value or has_critic]


@router.get("/runs/{run_id}")
def run_page(request: Request, run_id: int, _: PageUser, session: SessionDep) -> Response:
    run = runs_service.get_run(session, run_id=run_id)
    return render(request, "run.html", _run_context(request, session, run), block="status")


STREAM_BLOCKS = {"status": "status", "attention": "attention", "env_probe": "probe", "fallback": "trouble_row",
                 "error": "trouble_row", "attention_mismatch": "trouble_row", "log": "log_row",
                 "restart": "trouble_row"}
SSE_NAMES = {"fallback": "trouble", "error": "trouble", "attention_mismatch": "trouble", "restart": "trouble"}
HEARTBEAT_S = 15.0


def _sse(event: str, data: str, seq: int | None = None) -> str:
    lines = [f"event: {event}"] + ([f"id: {seq}"] if seq is not None else [])
    lines += [f"data: {line}" for line in data.splitlines() or [""]]
    return "\n".join(lines) + "\n\n"


def _block(request: Request, name: str, ctx: dict[str, Any]) -> str:
    template = templates.env.get_template("run.html")
    return "".join(template.blocks[name](template.new_context({**ctx, "request": request}))).strip()


def _session_for(request: Request) -> Session:
    return Session(request.app.state.engine, expire_on_commit=False)


def _trimmed(view: RunView) -> RunView:
    """A stream's view keeps the newest metric point and log line, not their history: the stream renders
    only those (the page it was opened from holds the rest), and 200 streams of a long run held 200 copies
    of it, which the garbage collector walked through on every full collection."""
    del view.metrics[:-1]
    del view.logs[:-1]
    return view


@router.get("/runs/{run_id}/stream")
async def run_stream(request: Request, run_id: int, _: PageUser, after: int = 0) -> Response:
    """Server-sent events from seq > Last-Event-ID (or ?after=): each event's `id:` is its seq, so a
    reconnect resumes exactly. The events come from the run's feed (``app.services.feeds``: one read of
    the database per batch of new events, for every stream of the run), a comment line keeps a quiet
    stream open, and the stream ends (event `end`) once the run is terminal and every event has been sent."""
    header = request.headers.get("last-event-id", "")
    start = int(header) if header.isdigit() else max(0, after)

    def load() -> tuple[Run, RunView]:
        with _session_for(request) as s:
            run = runs_service.get_run(s, run_id=run_id)
            events: list[Any] = []
            last = 0
            while last < start:
                batch, _ = events_service.events_since(s, run_id=run_id, after_seq=last, limit=min(1000, start - last))
                if not batch:
                    break
                events.extend(batch)
                last = batch[-1].seq
            return run, _trimmed(fold(events, total_steps=run.total_steps))

    run, view = await run_in_threadpool(load)
    base = {"run": run, "charts": CHARTS, "principal": request.state.principal, "csrf_token": request.state.csrf_token}
    feeds = request.app.state.run_feeds

    def render(feed: RunFeed, ev: Any) -> list[str]:
        """The messages one event makes, after folding it into this stream's view; what does not depend on
        the viewer is rendered once per event for every stream of the run (``RunFeed.rendered``)."""
        _trimmed(apply_event(view, seq=ev.seq, kind=ev.kind, payload=ev.payload, ts=ev.ts))

        def context(**extra: Any) -> dict[str, Any]:
            return {**base, "view": view, "eta": format_eta(view.eta_seconds), "entry": None,
                    "eager_roles": eager_roles(run, view), "resume_from": None, **extra}

        def shared(event: str, block: str, seq: int | None = None, **extra: Any) -> str:
            return feed.rendered(ev.seq, event, lambda: _sse(event, _block(request, block, context(**extra)), seq))

        out: list[str] = []
        saved = ev.kind == "log" and isinstance(ev.payload, dict) and "checkpoint" in ev.payload
        ended = ev.kind == "status" and view.terminal
        if saved or ev.kind == "restart" or ended:  # the checkpoints table, read from the run's folder once
            out.append(feed.rendered(ev.seq, "checkpoints", lambda: _sse("checkpoints", _block(
                request, "checkpoints", context(**checkpoint_context(request, run, view))))))
        if ev.kind == "metric":
            return [*out, shared("status", "status"),
                    feed.rendered(ev.seq, "metric", lambda: _sse("metric", json.dumps(view.metrics[-1])
                                                                 if view.metrics else "{}", ev.seq))]
        name = STREAM_BLOCKS.get(ev.kind)
        if name is None:
            return [*out, _sse("other", "", ev.seq)]
        entry = None
        if name in ("trouble_row", "log_row"):
            entry = (view.trouble if ev.kind != "log" else view.logs)[-1]
        out.append(shared(SSE_NAMES.get(ev.kind, ev.kind), name, ev.seq, entry=entry))
        if ev.kind == "error":  # a role that could not load gets its row in the attention table
            out.append(shared("attention", "attention"))
        if ev.kind == "restart":  # the status widget says how often the run restarted
            out.append(shared("status", "status"))
        if ev.kind in ("fallback", "error", "attention", "status"):  # retry offers (the viewer's CSRF token)
            resume = checkpoint_context(request, run, view) if ended else {}
            out.append(_sse("actions", _block(request, "actions", context(**resume))))
        return out

    async def messages() -> AsyncIterator[str]:
        yield "retry: 1000\n\n"
        async with feeds.follow(run_id, view.last_seq) as feed:
            async for batch in feed.after(view.last_seq, heartbeat_s=HEARTBEAT_S):
                # One chunk per batch: each chunk is a write of its own to the connection.
                chunk = [message for ev in batch.events for message in render(feed, ev)]
                if batch.finished:
                    chunk.append(_sse("end", "done"))
                yield "".join(chunk) or ": keep-alive\n\n"
                if batch.finished:
                    return

    return StreamingResponse(messages(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


@router.post("/runs/{run_id}/cancel", dependencies=CSRF)
def cancel(request: Request, run_id: int, principal: PageUser, session: SessionDep) -> Response:
    require_page_write(principal)
    runs_service.cancel_run(session, run_id=run_id, launcher=get_launcher(request))
    return redirect(f"/runs/{run_id}")


@router.post("/runs/{run_id}/retry", dependencies=CSRF)
async def retry(request: Request, run_id: int, principal: PageUser, session: SessionDep) -> Response:
    """Retry as it was, or with eager on one role (``eager_on=critic|actor``): the seed's first remedy."""
    require_page_write(principal)
    form = await request.form()
    role = str(form.get("eager_on") or "")
    keys = {setting.value: setting.attention_key for setting in SETTINGS}
    if role and role not in keys:
        raise AppError(422, "invalid_request", f"eager_on {role!r} is not a role with its own attention setting",
                       field="eager_on", value=role, valid=list(keys))
    patch = {keys[role]: "eager"} if role else {}
    new = await run_in_threadpool(runs_service.retry_run, session, run_id=run_id, patch=patch,
                                  launcher=get_launcher(request))
    return redirect(f"/runs/{new.id}")


@router.post("/runs/{run_id}/resume", dependencies=CSRF)
async def resume(request: Request, run_id: int, principal: PageUser, session: SessionDep) -> Response:
    """Resume a failed or cancelled run from its newest checkpoint: a new run (``retry_of`` this one)."""
    require_page_write(principal)
    run = runs_service.get_run(session, run_id=run_id)
    new = await run_in_threadpool(checkpoints_service.resume_run, session, run=run,
                                  root=request.app.state.settings.checkpoint_root, launcher=get_launcher(request))
    return redirect(f"/runs/{new.id}")


# --------------------------------------------------------------------------------------------
# Compare


@router.get("/compare")
def compare(request: Request, _: PageUser, session: SessionDep) -> Response:
    """``?ids=1,2`` (typed) or ``?ids=1&ids=2`` (the runs list's checkboxes): at most 8 runs."""
    ids = ",".join(request.query_params.getlist("ids"))
    wanted = [int(x) for x in re.findall(r"\d+", ids)][:8]
    runs = [runs_service.get_run(session, run_id=i) for i in dict.fromkeys(wanted)]
    views = [_load_view(session, r) for r in runs]
    diffs = spec_differences([flatten(r.spec) for r in runs])
    curves = [(f"#{r.id} {r.name}", series(v, REWARD_KEYS)) for r, v in zip(runs, views, strict=True)]
    summary = [{"run": r, "view": v, "tokens_per_s": mean_of(v, TOKENS_PER_S), "step_time": mean_of(v, STEP_TIME_S),
                "peak_memory": max_of(v, MAX_MEMORY_MB), "badges": v.role_badges()} for r, v in zip(runs, views, strict=True)]
    return render(request, "compare.html", {**page_context(request), "runs": runs, "summary": summary, "diffs": diffs,
                                            "reward": aligned_series(curves), "ids": ids,
                                            "recent": runs_service.list_runs(session, limit=20)[0]})


# --------------------------------------------------------------------------------------------
# Wiring


def install(app: FastAPI) -> None:
    """Add the dashboard to an app: pages, static files, the session authenticator, HTML errors."""
    app.include_router(router)
    if not any(getattr(r, "name", None) == "static" for r in app.routes):
        app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    authenticators = getattr(app.state, "authenticators", None)
    if authenticators is None:
        app.state.authenticators = authenticators = []
    if auth_browser.session_authenticator not in authenticators:
        authenticators.append(auth_browser.session_authenticator)

    async def login_required(request: Request, exc: LoginRequired) -> Response:
        return redirect(f"/login?next={request.url.path}")

    async def app_error(request: Request, exc: AppError) -> Response:
        if request.url.path.startswith("/api") or ("text/html" not in request.headers.get("accept", "") \
                and request.headers.get("HX-Request") != "true"):
            return render_error(request, exc)
        if not hasattr(request.state, "csrf_token"):
            request.state.csrf_token = auth_browser.csrf_token_for(request)
        return render(request, "error.html", {"error": exc, "principal": getattr(request.state, "principal", None),
                                              "csrf_token": request.state.csrf_token}, status_code=exc.status,
                      headers=exc.headers)

    app.add_exception_handler(LoginRequired, login_required)  # type: ignore[arg-type]
    app.add_exception_handler(AppError, app_error)  # type: ignore[arg-type]
