"""Runs: submit, list, read, events, cancel, retry, clone, resume from a checkpoint, checkpoints, export.

The three reads a dashboard or CI polls (the list, one run, events since a seq) are ``async``
handlers: ``app.services.reads`` builds their JSON body from one Core statement, on the event loop
(see ``Reader``); the other handlers are plain ``def`` handlers on the ORM, in the thread pool."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Depends, Header, Path, Query, Request, Response, status

from app.deps import (
    LauncherDep,
    Read,
    ReadAccess,
    SessionDep,
    SettingsDep,
    Write,
    get_principal,
    reader_of,
    serving_lifespan,
)
from app.errors import LAUNCH_RESPONSES
from app.models import (
    INT32_MAX,
    AppendResult,
    CheckpointsPublic,
    EventCreate,
    EventsPublic,
    RunClone,
    RunCreate,
    RunPublic,
    RunResume,
    RunRetry,
    RunsPublic,
    RunStatus,
    RunWaitPublic,
)
from app.routes.params import ExportFormatQuery, Limit, NameFilter, Offset, Timestamp
from app.services import checkpoints, events, interop, pump, reads, runs
from app.services.events import MAX_EVENTS_PAGE
from app.services.redact import checkpoints_for, events_without_tracebacks, signed_in

router = APIRouter(prefix="/api/runs", tags=["runs"], lifespan=serving_lifespan)
RunId = Annotated[int, Path(ge=1, le=INT32_MAX, description="A run's id.")]
MAX_EVENTS_PER_POST = 1000


def _json(body: bytes) -> Response:
    """A body ``app.services.reads`` built; the route's ``response_model`` documents its shape."""
    return Response(body, media_type="application/json")


@router.post("", response_model=RunPublic, status_code=status.HTTP_201_CREATED, dependencies=Write,
             responses=LAUNCH_RESPONSES)
def create_run(session: SessionDep, launcher: LauncherDep, body: RunCreate) -> RunPublic:
    """Submit a run from a saved spec (``spec_id``) or an inline ``spec``; it keeps an immutable copy."""
    return RunPublic.model_validate(runs.create_run(session, data=body, launcher=launcher))


@router.get("", response_model=RunsPublic, dependencies=Read)
async def list_runs(
    request: Request,
    status: Annotated[list[RunStatus] | None, Query(description="Any of these statuses (repeatable).")] = None,
    name: NameFilter = None,
    spec_id: Annotated[int | None, Query(ge=1, le=INT32_MAX)] = None,
    created_after: Annotated[Timestamp, Query(description="ISO 8601, inclusive.")] = None,
    created_before: Annotated[Timestamp, Query(description="ISO 8601, exclusive.")] = None,
    archived: Annotated[runs.ArchivedChoice, Query(description="Archived runs: hide (the default, as the runs list "
                                                          "does), with (among the others) or only.")] = "hide",
    limit: Limit = 50,
    offset: Offset = 0,
) -> Response:
    """Newest first; ``total`` counts every run that matches the filters."""
    where = runs.run_filters(status=status, name=name, spec_id=spec_id, created_after=created_after,
                             created_before=created_before)
    return _json(await reader_of(request)(reads.run_page_json, where=where, archived=runs.ARCHIVED[archived],
                                          limit=limit, offset=offset))


@router.get("/{run_id}", response_model=RunPublic, dependencies=Read)
async def get_run(request: Request, run_id: RunId) -> Response:
    return _json(await reader_of(request)(reads.run_json, run_id=run_id))


@router.get("/{run_id}/events", response_model=EventsPublic, dependencies=Read)
async def list_events(
    request: Request,
    run_id: RunId,
    after: Annotated[int, Query(ge=0, le=INT32_MAX, description="Return events with seq > after.")] = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_EVENTS_PAGE)] = 100,
) -> Response:
    """A page of the run's events; anonymous readers get each traceback as its last line, paths shortened."""
    body = await reader_of(request)(reads.events_json, run_id=run_id, after_seq=after, limit=limit)
    if b'"traceback"' in body and not signed_in(await get_principal(request)):
        body = events_without_tracebacks(body)
    return _json(body)


async def require_engine(
    request: Request,
    run_id: RunId,
    ingest: Annotated[str | None, Header(alias=events.INGEST_HEADER, description="The run's ingest credential, "
                                         "held by the engine only.")] = None,
) -> None:
    """Before the body is read: only the holder of the run's ingest credential may post its events."""
    events.check_ingest_credential(request.app.state.settings.SECRET_KEY, run_id, ingest)


@router.post("/{run_id}/events", response_model=AppendResult, dependencies=[Depends(require_engine)])
def append_events(
    request: Request,
    session: SessionDep,
    run_id: RunId,
    body: Annotated[list[EventCreate], Body(max_length=MAX_EVENTS_PER_POST)],
) -> AppendResult:
    """The engine's ingest of a run's events (the ``X-Attnboard-Ingest`` credential; no user token or session may
    post them): idempotent on (run_id, seq), a gap in seq is refused (409), a seq already stored with a different
    payload is kept aside and counted (``conflicts``)."""
    result = events.append_events(session, run_id=run_id, events=body)
    if result.inserted:
        request.app.state.run_changes.notify()  # /wait long-polls and the live pages' feeds
    return result


@router.get("/{run_id}/wait", response_model=RunWaitPublic, dependencies=Read)
async def wait_run(
    request: Request,
    run_id: RunId,
    timeout: Annotated[float, Query(ge=0, le=pump.MAX_WAIT_S, description="Seconds to wait at most (<= 300).")] = 30.0,
) -> RunWaitPublic:
    """Long-poll: answers when the run has finished, or at ``timeout`` with ``timed_out: true``; with the run and
    the attention each role really used."""
    run, attention, timed_out = await pump.wait_for_run(request.app.state.engine, request.app.state.run_changes,
                                                        run_id=run_id, timeout=timeout)
    return RunWaitPublic(run=RunPublic.model_validate(run), timed_out=timed_out, attention=attention)


@router.post("/{run_id}/submit", response_model=RunPublic, dependencies=Write,
             responses=LAUNCH_RESPONSES)
def submit_run(session: SessionDep, launcher: LauncherDep, run_id: RunId) -> RunPublic:
    """Submit a queued run again, e.g. after a 503 while Ray was unreachable (the scheduler also retries)."""
    return RunPublic.model_validate(runs.resubmit_run(session, run_id=run_id, launcher=launcher))


@router.post("/{run_id}/cancel", response_model=RunPublic, dependencies=Write)
def cancel_run(session: SessionDep, launcher: LauncherDep, run_id: RunId) -> RunPublic:
    return RunPublic.model_validate(runs.cancel_run(session, run_id=run_id, launcher=launcher))


@router.post("/{run_id}/archive", response_model=RunPublic, dependencies=Write)
def archive_run(session: SessionDep, run_id: RunId) -> RunPublic:
    """Put the run away: ``GET /api/runs`` and the runs list leave it out unless asked (``archived=with`` or
    ``only``); its data stays. Idempotent."""
    return RunPublic.model_validate(runs.set_archived(session, run_id=run_id, archived=True))


@router.post("/{run_id}/unarchive", response_model=RunPublic, dependencies=Write)
def unarchive_run(session: SessionDep, run_id: RunId) -> RunPublic:
    """Bring an archived run back among the others. Idempotent."""
    return RunPublic.model_validate(runs.set_archived(session, run_id=run_id, archived=False))


@router.post("/{run_id}/retry", response_model=RunPublic, status_code=status.HTTP_201_CREATED, dependencies=Write,
             responses=LAUNCH_RESPONSES)
def retry_run(session: SessionDep, launcher: LauncherDep, run_id: RunId, body: RunRetry | None = None) -> RunPublic:
    body = body or RunRetry()
    return RunPublic.model_validate(runs.retry_run(session, run_id=run_id, patch=body.patch, name=body.name,
                                                   launcher=launcher))


@router.post("/{run_id}/clone", response_model=RunPublic, status_code=status.HTTP_201_CREATED, dependencies=Write,
             responses=LAUNCH_RESPONSES)
def clone_run(session: SessionDep, launcher: LauncherDep, run_id: RunId, body: RunClone | None = None) -> RunPublic:
    body = body or RunClone()
    return RunPublic.model_validate(runs.clone_run(session, run_id=run_id, name=body.name, launcher=launcher))


@router.post("/{run_id}/resume", response_model=RunPublic, status_code=status.HTTP_201_CREATED, dependencies=Write)
def resume_run(session: SessionDep, settings: SettingsDep, launcher: LauncherDep, run_id: RunId,
               body: RunResume | None = None) -> RunPublic:
    """A new run that resumes a failed or cancelled run from its newest complete checkpoint (``retry_of`` set),
    with ``patch`` on its spec (e.g. more ``trainer.total_training_steps``); 409 when it has none."""
    body = body or RunResume()
    run = runs.get_run(session, run_id=run_id)
    return RunPublic.model_validate(checkpoints.resume_run(session, run=run, root=settings.checkpoint_root,
                                                           patch=body.patch, name=body.name, launcher=launcher))


@router.get("/{run_id}/checkpoints", response_model=CheckpointsPublic)
def list_checkpoints(session: SessionDep, settings: SettingsDep, reader: ReadAccess, run_id: RunId) -> CheckpointsPublic:
    """The run's complete checkpoints, oldest first (step, size, time, path, roles), and the folders skipped
    as incomplete (an interrupted write) with why; anonymous readers get paths relative to the checkpoint root."""
    listing = checkpoints.run_checkpoints(runs.get_run(session, run_id=run_id), settings.checkpoint_root)
    return checkpoints_for(reader, listing, settings.checkpoint_root)


@router.get("/{run_id}/export", dependencies=Read)
def export_run(session: SessionDep, run_id: RunId, format: ExportFormatQuery = "cli") -> dict:
    """The run's own spec copy as a verl command line or YAML."""
    return interop.export_spec(tree=runs.get_run(session, run_id=run_id).spec, format=format)
