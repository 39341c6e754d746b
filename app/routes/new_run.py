"""The new-run page: the form, its preview fragment, verl import and export, and the launch."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Request
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
from app.views.new_run import FormState, multi, starting_spec
from app.web import add_security_headers, page_context, redirect, render
from worker.interop.verl import export_command, export_yaml

router = APIRouter(tags=["pages"], include_in_schema=False)


async def _form_state(form: dict[str, list[str]], roots: list[Path], session: Session) -> FormState:
    """The posted form's state, off the event loop: the probe is a query, the preview reads config.json."""
    return await run_in_threadpool(lambda: FormState(form, model_roots=roots, probe=latest_node_probe(session)))


RESTORE = "restore"
"""``GET /runs/new?restore=1&<the form's fields>``: the form as it was when a logged-out Launch asked to sign in."""


@router.get("/runs/new")
def new_run(request: Request, _: PageUser, session: SessionDep, roots: ModelRoots) -> Response:
    if RESTORE in request.query_params:  # back from the sign-in a logged-out Launch asked for: the same form
        fields = {k: v for k, v in multi(request.query_params).items() if k != RESTORE}
        state = FormState(fields, model_roots=roots, probe=latest_node_probe(session))
    else:
        state = FormState(spec=starting_spec(), model_roots=roots, probe=latest_node_probe(session))
    return render(request, "run_new.html", {**page_context(request), **state.context()})


def _signed_out(principal: Principal) -> bool:
    """Pages that parse what a user typed (preview, import, launch) need a signed-in user (issue 18)."""
    return principal.kind == "anonymous"


@router.post("/runs/preview", dependencies=CSRF)
async def preview(request: Request, principal: PageUser, session: SessionDep, roots: ModelRoots) -> Response:
    if _signed_out(principal):
        return render(request, "_sign_in_preview.html", page_context(request))
    state = await _form_state(multi(await request.form()), roots, session)
    return render(request, "run_new.html", {**page_context(request), **state.context()}, block="preview")


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
    state = await run_in_threadpool(lambda: FormState(spec=result.spec, model_roots=roots))
    notes = [f"{len(result.overrides)} setting{'s' if len(result.overrides) != 1 else ''} imported", *result.warnings]
    return render(request, "run_new.html",
                  {**page_context(request), **state.context(verl_text=text, import_notes=notes, import_open=True)},
                  block="form_area")


@router.get("/runs/export/command")
def export_form_command(request: Request, _: PageUser, session: SessionDep, roots: ModelRoots) -> Response:
    state = FormState(multi(request.query_params), model_roots=roots, probe=latest_node_probe(session))
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
    state = await _form_state(form, roots, session)
    if state.spec is None or state.errors:
        return render(request, "run_new.html", {**page_context(request), **state.context()}, status_code=422)
    data = RunCreate(name=state.name or state.spec.trainer.experiment_name or None,
                     spec=state.spec.model_dump(mode="json"), environment=state.environment)
    run = await run_in_threadpool(runs_service.create_run, session, data=data, launcher=get_launcher(request))
    return redirect(f"/runs/{run.id}")
