"""The live run page (``run.html``) and its server-sent event stream, and the page's actions: cancel,
retry (as it was, or with eager on one role) and resume from a checkpoint."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse
from sqlmodel import Session
from starlette.concurrency import run_in_threadpool

from app.deps import CSRF, PageUser, SessionDep, get_launcher, open_session, require_page_write
from app.errors import AppError
from app.models import Run
from app.services import checkpoints as checkpoints_service
from app.services import events as events_service
from app.services import runs as runs_service
from app.services.feeds import RunFeed
from app.views.live_run import (
    checkpoint_context,
    duration_s,
    eager_remedy_of,
    eager_roles,
    load_view,
    passthrough_of,
    spec_overview,
    trimmed,
)
from app.views.run_view import CHARTS, RunView, apply_event, fold, format_eta, metrics_csv
from app.web import add_security_headers, page_context, redirect, render, templates
from worker.core.roles import SETTINGS
from worker.interop.verl import export_command, export_yaml
from worker.spec import PASSTHROUGH_NOTE
from worker.troubleshoot.classify import eager_remedy

router = APIRouter(tags=["pages"], include_in_schema=False)


def _run_context(request: Request, session: Session, run: Run) -> dict[str, Any]:
    view = load_view(session, run)
    return {**page_context(request), "run": run, "view": view, "charts": CHARTS, "eta": format_eta(view.eta_seconds),
            "eager_remedy": eager_remedy_of(eager_roles(run, view)), "passthrough": passthrough_of(run),
            "passthrough_note": PASSTHROUGH_NOTE, "spec": spec_overview(run),
            "duration": format_eta(duration_s(run, datetime.now(UTC))), **_checkpoints(request, run, view)}


def _checkpoints(request: Request, run: Run, view: RunView) -> dict[str, Any]:
    return checkpoint_context(request.app.state.settings.checkpoint_root, run, view)


@router.get("/runs/{run_id}")
def run_page(request: Request, run_id: int, _: PageUser, session: SessionDep) -> Response:
    run = runs_service.get_run(session, run_id=run_id)
    return render(request, "run.html", _run_context(request, session, run), block="status")


@router.get("/runs/{run_id}/waiting")
def waiting(request: Request, run_id: int, _: PageUser, session: SessionDep) -> Response:
    """What a queued run waits for (the scheduler's ``status_reason``, which no event carries), polled by its
    page; once the run has left the queue, nothing and htmx's "stop polling" status (286)."""
    run = runs_service.get_run(session, run_id=run_id)
    if run.status != "queued":
        return Response(status_code=286)
    return render(request, "run.html", _run_context(request, session, run), block="waiting")


def _download(body: str | Iterator[str], media_type: str, filename: str) -> Response:
    headers = {"Content-Disposition": f'attachment; filename="{filename}"'}
    if isinstance(body, str):
        return add_security_headers(Response(body, media_type=media_type, headers=headers))
    return add_security_headers(StreamingResponse(body, media_type=media_type, headers=headers))


@router.get("/runs/{run_id}/export/command")
def export_run_command(run_id: int, _: PageUser, session: SessionDep) -> Response:
    """The run's spec as a verl command line (text, to copy or save)."""
    run = runs_service.get_run(session, run_id=run_id)
    return _download(export_command(runs_service.run_spec(run)).text + "\n", "text/plain", f"run-{run.id}.sh")


@router.get("/runs/{run_id}/export.yaml")
def export_run_yaml(run_id: int, _: PageUser, session: SessionDep) -> Response:
    run = runs_service.get_run(session, run_id=run_id)
    return _download(export_yaml(runs_service.run_spec(run)).text, "application/yaml", f"run-{run.id}.yaml")


@router.get("/runs/{run_id}/events.jsonl")
def download_events(request: Request, run_id: int, _: PageUser, session: SessionDep) -> Response:
    """Every event of the run (its worker log, attention reports, metrics, status changes), one JSON object a
    line, oldest first: ``{"seq", "kind", "ts", "payload"}``."""
    runs_service.get_run(session, run_id=run_id)

    def lines() -> Iterator[str]:
        after = 0
        with open_session(request) as s:
            while True:
                batch, _ = events_service.events_since(s, run_id=run_id, after_seq=after, limit=1000)
                for ev in batch:
                    yield json.dumps({"seq": ev.seq, "kind": ev.kind,
                                      "ts": ev.ts.isoformat() if ev.ts else None, "payload": ev.payload},
                                     separators=(",", ":"), default=str) + "\n"
                if len(batch) < 1000:
                    return
                after = batch[-1].seq

    return _download(lines(), "application/x-ndjson", f"run-{run_id}-events.jsonl")


@router.get("/runs/{run_id}/metrics.csv")
def download_metrics(run_id: int, _: PageUser, session: SessionDep) -> Response:
    """The run's metrics: one row per step, one column per metric."""
    run = runs_service.get_run(session, run_id=run_id)
    return _download(metrics_csv(load_view(session, run).metrics), "text/csv", f"run-{run_id}-metrics.csv")


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


@router.get("/runs/{run_id}/stream")
async def run_stream(request: Request, run_id: int, _: PageUser, after: int = 0) -> Response:
    """Server-sent events from seq > Last-Event-ID (or ?after=): each event's `id:` is its seq, so a
    reconnect resumes exactly. The events come from the run's feed (``app.services.feeds``: one read of
    the database per batch of new events, for every stream of the run), a comment line keeps a quiet
    stream open, and the stream ends (event `end`) once the run is terminal and every event has been sent."""
    header = request.headers.get("last-event-id", "")
    start = int(header) if header.isdigit() else max(0, after)

    def load() -> tuple[Run, RunView]:
        with open_session(request) as s:
            run = runs_service.get_run(s, run_id=run_id)
            events: list[Any] = []
            last = 0
            while last < start:
                batch, _ = events_service.events_since(s, run_id=run_id, after_seq=last, limit=min(1000, start - last))
                if not batch:
                    break
                events.extend(batch)
                last = batch[-1].seq
            return run, trimmed(fold(events, total_steps=run.total_steps))

    run, view = await run_in_threadpool(load)
    base = {"run": run, "charts": CHARTS, "principal": request.state.principal, "csrf_token": request.state.csrf_token}
    feeds = request.app.state.run_feeds

    def render(feed: RunFeed, ev: Any) -> list[str]:
        """The messages one event makes, after folding it into this stream's view; what does not depend on
        the viewer is rendered once per event for every stream of the run (``RunFeed.rendered``)."""
        trimmed(apply_event(view, seq=ev.seq, kind=ev.kind, payload=ev.payload, ts=ev.ts))

        def context(**extra: Any) -> dict[str, Any]:
            return {**base, "view": view, "eta": format_eta(view.eta_seconds), "entry": None,
                    "eager_remedy": eager_remedy_of(eager_roles(run, view)), "resume_from": None, **extra}

        def shared(event: str, block: str, seq: int | None = None, **extra: Any) -> str:
            return feed.rendered(ev.seq, event, lambda: _sse(event, _block(request, block, context(**extra)), seq))

        out: list[str] = []
        saved = ev.kind == "log" and isinstance(ev.payload, dict) and "checkpoint" in ev.payload
        ended = ev.kind == "status" and view.terminal
        if saved or ev.kind == "restart" or ended:  # the checkpoints table, read from the run's folder once
            out.append(feed.rendered(ev.seq, "checkpoints", lambda: _sse("checkpoints", _block(
                request, "checkpoints", context(**_checkpoints(request, run, view))))))
        if ev.kind == "metric":  # the progress, the charts' point, then the step's line in the worker log
            # (no id of its own: the browser takes the metric's, so a reconnect does not show the line twice)
            stepped = view.logs and view.logs[-1].seq == ev.seq
            step_log = [shared("log", "log_row", None, entry=view.logs[-1])] if stepped else []
            return [*out, shared("status", "status"),
                    feed.rendered(ev.seq, "metric", lambda: _sse("metric", json.dumps(view.metrics[-1])
                                                                 if view.metrics else "{}", ev.seq)), *step_log]
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
            resume = _checkpoints(request, run, view) if ended else {}
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
    """Retry as it was, or with eager on the roles named (``eager_on=critic``, ``eager_on=actor``, repeatable): the
    guide's second step, one patch over every setting they use (``eager_remedy``), so one retry recovers them."""
    require_page_write(principal)
    form = await request.form()
    roles = [str(r) for r in form.getlist("eager_on") if r]
    settings = [setting.value for setting in SETTINGS]
    for role in roles:
        if role not in settings:
            raise AppError(422, "invalid_request", f"eager_on {role!r} is not a role with its own attention setting",
                           field="eager_on", value=role, valid=settings)
    patch = eager_remedy(roles).patch if roles else {}
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
