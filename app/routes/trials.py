"""Attention trials: the API (``router``) and the dashboard pages (``pages``).

``POST /api/trials`` stores a queued trial and wakes the scheduler: it starts as a job of the engine host
when its ranks are free (``app.services.trials``); ``GET /api/trials/{id}`` shows its status, what it
waits for or does (``status_reason``) and, as columns come in, its result; ``POST /api/trials/{id}/cancel``
stops it. Pages: ``/trials`` (recent, or ``?ids=1,2`` side by side), ``/trials/{id}`` (refreshes itself
until the trial ends, with a Cancel button), and ``POST /trials/from-form``, the new-run form's "Run an
attention trial" button.
"""

from __future__ import annotations

import re
from typing import Annotated

from fastapi import APIRouter, Path, Query, Request, status
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from app.deps import (
    CSRF,
    CurrentPrincipal,
    ModelRoots,
    PageUser,
    Read,
    SessionDep,
    TrialStarter,
    Write,
    require_page_write,
)
from app.errors import AppError
from app.models import INT32_MAX
from app.models_troubleshooting import MAX_TRIAL_STEPS, TRIAL_TERMINAL, TrialCreate, TrialPublic, TrialsPublic
from app.routes.params import Limit, Offset
from app.services import trials as service
from app.views.new_run import FormState, multi
from app.web import page_context, redirect, render
from worker.core.implementations import FALLBACK_CHAIN

router = APIRouter(prefix="/api/trials", tags=["trials"])
pages = APIRouter(tags=["pages"], include_in_schema=False)
TrialId = Annotated[int, Path(ge=1, le=INT32_MAX, description="A trial's id.")]
TERMINAL = TRIAL_TERMINAL


def _ids(text: str) -> list[int]:
    found = [int(x) for x in re.findall(r"\d+", text)]
    for value in found:
        if not 1 <= value <= INT32_MAX:
            raise AppError(422, "invalid_request", f"ids: {value} is not a trial id", field="ids", value=value,
                           valid=f"1 to {INT32_MAX}")
    return found


@router.post("", response_model=TrialPublic, status_code=status.HTTP_202_ACCEPTED, dependencies=Write)
def create_trial(session: SessionDep, principal: CurrentPrincipal, start: TrialStarter, body: TrialCreate) -> TrialPublic:
    """Queue a trial of ``spec`` per implementation and start it; poll ``GET /api/trials/{id}`` for the result."""
    trial = service.create_trial(session, data=body, author=principal.name)
    start(trial.id)
    return TrialPublic.model_validate(trial, from_attributes=True)


@router.get("", response_model=TrialsPublic, dependencies=Read)
def list_trials(
    session: SessionDep,
    ids: Annotated[str | None, Query(max_length=200, description="Comma-separated ids, to compare side by side.")] = None,
    limit: Limit = 50,
    offset: Offset = 0,
) -> TrialsPublic:
    rows, total = service.list_trials(session, ids=_ids(ids or ""), limit=limit, offset=offset)
    return TrialsPublic(data=[TrialPublic.model_validate(t, from_attributes=True) for t in rows], total=total,
                        limit=limit, offset=offset)


@router.get("/{trial_id}", response_model=TrialPublic, dependencies=Read)
def get_trial(session: SessionDep, trial_id: TrialId) -> TrialPublic:
    return TrialPublic.model_validate(service.get_trial(session, trial_id=trial_id), from_attributes=True)


@router.post("/{trial_id}/cancel", response_model=TrialPublic, dependencies=Write)
def cancel_trial(request: Request, session: SessionDep, trial_id: TrialId) -> TrialPublic:
    """Cancel a queued trial at once, or ask a running one's job to stop (it then ends ``cancelled``);
    409 when it has ended already."""
    trial = service.cancel_trial(session, trial_id=trial_id, launcher=request.app.state.launcher)
    return TrialPublic.model_validate(trial, from_attributes=True)


# --------------------------------------------------------------------------------------------
# Pages


@pages.get("/trials")
def trials_page(request: Request, _: PageUser, session: SessionDep) -> Response:
    ids = ",".join(request.query_params.getlist("ids"))[:200]  # ?ids=1,2 or the list form's ?ids=1&ids=2
    rows, total = service.list_trials(session, ids=_ids(ids), limit=25)
    return render(request, "trials.html", {**page_context(request), "trials": rows, "total": total, "ids": ids,
                                           "compare": bool(ids.strip())})


@pages.get("/trials/{trial_id}")
def trial_page(request: Request, trial_id: int, _: PageUser, session: SessionDep) -> Response:
    trial = service.get_trial(session, trial_id=trial_id)
    return render(request, "trial.html", {**page_context(request), "trial": trial,
                                          "terminal": trial.status in TERMINAL}, block="result")


@pages.post("/trials/{trial_id}/cancel", dependencies=CSRF)
async def cancel_trial_page(request: Request, trial_id: int, principal: PageUser, session: SessionDep) -> Response:
    """The trial page's Cancel button."""
    require_page_write(principal)
    await run_in_threadpool(service.cancel_trial, session, trial_id=trial_id, launcher=request.app.state.launcher)
    return redirect(f"/trials/{trial_id}")


@pages.post("/trials/from-form", dependencies=CSRF)
async def trial_from_form(request: Request, principal: PageUser, session: SessionDep, start: TrialStarter,
                          roots: ModelRoots) -> Response:
    """The new-run form's second button: the same fields, run as a trial of the fallback chain's implementations."""
    require_page_write(principal)
    form = multi(await request.form())
    state = FormState(form, model_roots=roots)
    if state.spec is None or state.errors:
        return render(request, "run_new.html", {**page_context(request), **state.context()}, status_code=422)
    steps_text = (form.get("trial_steps") or ["3"])[-1]
    if not steps_text.isdigit() or not 1 <= int(steps_text) <= MAX_TRIAL_STEPS:
        raise AppError(422, "invalid_request", f"trial_steps: {steps_text!r} must be a whole number from 1 to "
                       f"{MAX_TRIAL_STEPS}", field="trial_steps", value=steps_text, valid=f"1 to {MAX_TRIAL_STEPS}")
    implementations = form.get("trial_implementations", []) if form.get("trial_choice") else list(FALLBACK_CHAIN)
    if not implementations:
        raise AppError(422, "invalid_request", "trial_implementations: none ticked; tick at least one of "
                       f"{', '.join(FALLBACK_CHAIN)}", field="trial_implementations", value=[], valid=list(FALLBACK_CHAIN))
    data = TrialCreate(name=f"trial: {state.name or state.spec.trainer.experiment_name}"[:200],
                       spec=state.spec.model_dump(mode="json"), implementations=implementations,
                       steps=int(steps_text), environment=None)  # a trial measures the node it runs on
    trial = await run_in_threadpool(service.create_trial, session, data=data, author=principal.name)
    start(trial.id)
    return redirect(f"/trials/{trial.id}")
