"""The new-run page: the form, its preview fragment, verl import and export, and the launch."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response
from sqlmodel import Session
from starlette.concurrency import run_in_threadpool

from app.deps import CSRF, ModelRoots, PageUser, SessionDep, get_launcher, require_page_write
from app.errors import AppError
from app.models import RunCreate
from app.routes.login import sign_in_keeping
from app.services import interop
from app.services import runs as runs_service
from app.services.auth import Principal
from app.services.probes import latest_node_probe
from app.views.new_run import DEFAULT_ENV, FormState, multi, starting_spec
from app.views.run_form import issues_by_field
from app.web import add_security_headers, page_context, redirect, render
from worker.core.environment import PROFILES
from worker.interop.verl import export_command, export_yaml
from worker.spec import SpecError

router = APIRouter(tags=["pages"], include_in_schema=False)


async def _form_state(request: Request, form: dict[str, list[str]], roots: list[Path], session: Session) -> FormState:
    """The posted form's state, off the event loop: the probe is a query, the preview reads config.json,
    preflight looks for the files and asks Ray what the cluster has."""
    return await run_in_threadpool(lambda: FormState(form, model_roots=roots, probe=latest_node_probe(session),
                                                     launcher=get_launcher(request)))


RESTORE = "restore"
"""``GET /runs/new?restore=1&<the form's fields>``: the form as it was when a logged-out Launch asked to sign in."""


@router.get("/runs/new")
def new_run(request: Request, _: PageUser, session: SessionDep, roots: ModelRoots,
            from_run: Annotated[int | None, Query(alias="from", description="a run whose spec fills the form")] = None
            ) -> Response:
    """The form: the tiny CPU preset; ``?from=ID``: that run's spec, name and target (edit and relaunch);
    ``?restore=1&...``: the form as it was when a logged-out Launch asked to sign in."""
    if RESTORE in request.query_params:  # back from the sign-in a logged-out Launch asked for: the same form
        fields = {k: v for k, v in multi(request.query_params).items() if k != RESTORE}
        state = FormState(fields, model_roots=roots, probe=latest_node_probe(session), launcher=get_launcher(request))
        return render(request, "run_new.html", {**page_context(request), **state.context()})
    run = runs_service.get_run(session, run_id=from_run) if from_run is not None else None
    spec = runs_service.run_spec(run) if run is not None else starting_spec()
    target = run.environment if run is not None and isinstance(run.environment, str) else DEFAULT_ENV
    state = FormState(spec=spec, model_roots=roots, probe=latest_node_probe(session), name=run.name if run else "",
                      env_name=target if target in PROFILES else DEFAULT_ENV, launcher=get_launcher(request))
    return render(request, "run_new.html", {**page_context(request), **state.context()})


def _signed_out(principal: Principal) -> bool:
    """Pages that parse what a user typed (preview, import, launch) need a signed-in user (issue 18)."""
    return principal.kind == "anonymous"


@router.post("/runs/preview", dependencies=CSRF)
async def preview(request: Request, principal: PageUser, session: SessionDep, roots: ModelRoots) -> Response:
    if _signed_out(principal):
        return render(request, "_sign_in_preview.html", page_context(request))
    state = await _form_state(request, multi(await request.form()), roots, session)
    return render(request, "run_new.html", {**page_context(request), **state.context(oob_counts=True)}, block="preview")


@router.post("/runs/adapt", dependencies=CSRF)
async def adapt(request: Request, principal: PageUser, session: SessionDep, roots: ModelRoots) -> Response:
    """"Adapt to this target" (``apply=all``: every suggested value of the preflight) or the attention remedy
    alone (``apply=remedy``), in one click: the form again, filled with the adapted spec, saying what changed."""
    form = multi(await request.form())
    if _signed_out(principal):  # sign in, then back to this very form, filled
        return sign_in_keeping(request, {k: v for k, v in form.items() if k != "apply"})
    only_remedy = (form.get("apply") or ["all"])[-1] == "remedy"
    state = await _form_state(request, form, roots, session)
    patch = state.adaptation(only_remedy=only_remedy)
    try:
        adapted = state.adapted(patch)
    except SpecError as exc:
        state.errors = issues_by_field(exc.issues)
        adapted = None
    if adapted is None:
        return render(request, "run_new.html", {**page_context(request), **state.context()},
                      block="form_area" if request.headers.get("HX-Request") == "true" else None)
    new = await run_in_threadpool(lambda: FormState(spec=adapted, model_roots=roots, probe=latest_node_probe(session),
                                                    launcher=get_launcher(request)))
    new.name, new.env_name = state.name, state.env_name
    notes = [f"{key} = {value}" for key, value in patch.items()]
    htmx = request.headers.get("HX-Request") == "true"
    return render(request, "run_new.html",
                  {**page_context(request), **new.context(adapt_notes=notes, adapted_to=state.env_name)},
                  block="form_area" if htmx else None)


@router.post("/runs/import", dependencies=CSRF)
async def import_verl(request: Request, principal: PageUser, roots: ModelRoots) -> Response:
    form = multi(await request.form())
    text = (form.get("verl_text") or [""])[-1]
    try:  # the API's import (POST /api/import): its guards, its errors, its child process and wall clock
        if _signed_out(principal):
            raise AppError(401, "sign_in_required", "text: sign in to import a script (Log in, top right); the text "
                           "is kept here", field="text", valid="a signed-in user")
        _, result = await run_in_threadpool(interop.import_spec_isolated, request.app.state.imports, text=text)
    except AppError as exc:
        state = FormState(spec=starting_spec(), model_roots=roots)
        issues = exc.issues or [{"field": exc.field, "message": exc.message.removeprefix(f"{exc.field}: ")}]
        state.errors = {"(import)": [{**i, "field": "verl_text" if i.get("field") == "text" else i.get("field")}
                                     for i in issues]}
        return render(request, "run_new.html",
                      {**page_context(request), **state.context(verl_text=text, import_open=True)},
                      block="form_area", status_code=401 if exc.status == 401 else 422)
    state = await run_in_threadpool(lambda: FormState(spec=result.spec, model_roots=roots, launcher=get_launcher(request)))
    notes = [f"{len(result.overrides)} setting{'s' if len(result.overrides) != 1 else ''} imported", *result.warnings]
    return render(request, "run_new.html",
                  {**page_context(request), **state.context(verl_text=text, import_notes=notes, import_open=True)},
                  block="form_area")


@router.get("/runs/export/command")
def export_form_command(request: Request, _: PageUser, session: SessionDep, roots: ModelRoots) -> Response:
    state = FormState(multi(request.query_params), model_roots=roots, probe=latest_node_probe(session),
                      launcher=get_launcher(request))
    if state.spec is None or state.errors:
        return render(request, "run_new.html", {**page_context(request), **state.context()}, block="preview",
                      status_code=422)
    return render(request, "run_new.html", {**page_context(request), **state.context(export=export_command(state.spec))},
                  block="export")


@router.get("/runs/export.yaml")
def export_form_yaml(request: Request, _: PageUser, session: SessionDep, roots: ModelRoots) -> Response:
    state = FormState(multi(request.query_params), model_roots=roots, probe=latest_node_probe(session))
    if state.spec is None or state.errors:
        return render(request, "run_new.html", {**page_context(request), **state.context()}, status_code=422)
    result = export_yaml(state.spec)
    filename = "".join(c if c.isalnum() or c in "-_" else "-" for c in (state.name or "run")) + ".yaml"
    return add_security_headers(Response(result.text, media_type="application/yaml",
                                         headers={"Content-Disposition": f'attachment; filename="{filename}"'}))


@router.post("/runs", dependencies=CSRF)
async def launch(request: Request, principal: PageUser, session: SessionDep, roots: ModelRoots) -> Response:
    form = multi(await request.form())
    if _signed_out(principal):  # sign in, then back to this very form, filled (nothing lost)
        return sign_in_keeping(request, form)
    require_page_write(principal)
    state = await _form_state(request, form, roots, session)
    if state.spec is None or state.errors or state.launch_blocked:  # blocked: roles cannot run (the remedy is shown)
        return render(request, "run_new.html", {**page_context(request), **state.context()}, status_code=422)
    data = RunCreate(name=state.name or state.spec.trainer.experiment_name or None,
                     spec=state.spec.model_dump(mode="json"), environment=state.environment)
    run = await run_in_threadpool(runs_service.create_run, session, data=data, launcher=get_launcher(request))
    return redirect(f"/runs/{run.id}")
