"""Runs: create (from a saved spec or inline), list, get, cancel, retry, clone, status changes.

A run keeps an immutable copy of the spec it was submitted with (``Run.spec``); retry and clone make
new runs from that copy. Status changes go through ``set_status`` and the table in ``states``.

Cancel: a queued run is cancelled at once. A starting or running run gets ``cancel_requested`` and
keeps its status until the worker confirms with a ``status: cancelled`` event, unless no launcher is
attached, in which case nothing could confirm it and it is cancelled at once.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any, Literal

from sqlalchemy import ColumnElement, func
from sqlmodel import Session, col, select

from app.errors import AppError, not_found
from app.models import NAME_MAX, Run, RunCreate, RunStatus, utcnow
from app.services.common import check_paths, validated_spec
from app.services.launcher import Launcher, LauncherUnavailable
from app.services.preflight import refuse_never_fits
from app.services.specs import get_spec
from app.services.states import check_transition
from worker.core.contract import TERMINAL
from worker.spec import REMOVE, RunSpec, SpecError, parse_spec, tree_set

DEFAULT_RUN_NAME = "run"


# --------------------------------------------------------------------------------------------
# Pure helpers


def apply_patch(tree: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``tree`` with each dotted key of ``patch`` set (``None`` removes the key).

    >>> apply_patch({"a": {"b": 1}}, {"a.c": 2, "a.b": None})
    {'a': {'c': 2}}
    """
    out = copy.deepcopy(tree)
    for dotted, value in patch.items():
        parts = str(dotted).split(".")
        if not all(parts):
            raise AppError(422, "invalid_patch", f"patch key {dotted!r} has an empty component",
                           field=f"patch.{dotted}", value=dotted,
                           valid="dotted keys with no empty component, e.g. trainer.total_training_steps")
        tree_set(out, str(dotted), REMOVE if value is None else value)
    return out


def _derived_name(name: str, suffix: str) -> str:
    return name[: NAME_MAX - len(suffix)] + suffix


# --------------------------------------------------------------------------------------------
# Create


def create_run(session: Session, *, data: RunCreate, launcher: Launcher | None = None) -> Run:
    """Validate, store with an immutable spec copy, hand to the launcher (if any)."""
    if (data.spec_id is None) == (data.spec is None):
        raise AppError(422, "invalid_request", "give exactly one of spec_id (a saved spec) or spec (inline)",
                       field="spec_id" if data.spec_id is not None else "spec",
                       value={"spec_id": data.spec_id, "spec": "..." if data.spec is not None else None},
                       valid=["spec_id", "spec"])
    name = data.name
    if data.spec_id is not None:
        saved = get_spec(session, spec_id=data.spec_id)
        source: Any = saved.spec
        name = name or saved.name
    else:
        source = data.spec
    return _insert_run(session, source=source, name=name or DEFAULT_RUN_NAME, spec_id=data.spec_id,
                       environment=data.environment, retry_of=None, launcher=launcher)


def _insert_run(session: Session, *, source: Any, name: str, spec_id: int | None, environment: Any,
                retry_of: int | None, launcher: Launcher | None) -> Run:
    spec, tree, _ = validated_spec(source, launch=True)
    check_paths(session, spec)
    refuse_never_fits(spec, launcher)
    run = Run(name=name, spec_id=spec_id, spec=tree, environment=environment, retry_of=retry_of,
              total_steps=spec.total_steps)
    session.add(run)
    session.commit()
    session.refresh(run)
    if launcher is not None:
        submit_run(session, run=run, launcher=launcher)
    return run


def submit_run(session: Session, *, run: Run, launcher: Launcher) -> Run:
    """Hand a queued run to the launcher; an unreachable backend leaves it queued and answers 503."""
    try:
        handle = launcher.submit(run)
    except LauncherUnavailable as exc:
        run.status_reason = f"not submitted yet: {exc}"
        session.add(run)
        session.commit()
        raise AppError(503, "launcher_unavailable", f"run {run.id} is saved and queued, but could not be "
                       f"submitted: {exc}", field="run_id", value=run.id) from None
    run.ray_job = handle
    session.add(run)
    session.commit()
    session.refresh(run)
    return run


def resubmit_run(session: Session, *, run_id: int, launcher: Launcher | None) -> Run:
    """Submit a queued run again (after a 503 because the backend was down): 409 unless it is queued,
    503 while no launcher is attached or the backend is still unreachable."""
    run = get_run(session, run_id=run_id)
    if run.status != RunStatus.queued.value:
        raise AppError(409, "invalid_transition", f"run {run_id} is {run.status}: only queued runs can be submitted",
                       field="status", value=run.status, valid=["queued"])
    if launcher is None:
        raise AppError(503, "launcher_unavailable", f"run {run_id} stays queued: this app has no launcher attached",
                       field="run_id", value=run_id)
    return submit_run(session, run=run, launcher=launcher)


# --------------------------------------------------------------------------------------------
# Read


def get_run(session: Session, *, run_id: int) -> Run:
    run = session.get(Run, run_id)
    if run is None:
        raise not_found("run", run_id, field="run_id")
    return run


def run_spec(run: Run) -> RunSpec:
    """The run's stored spec, parsed (to export it or fill the form with it); 409 when this version of
    attnboard no longer reads it."""
    try:
        return parse_spec(run.spec)
    except SpecError as exc:
        raise AppError(409, "invalid_spec", f"run {run.id}'s stored spec no longer parses: {exc}", field="spec",
                       value=run.id, valid="a spec this version of attnboard reads") from exc


ArchivedChoice = Literal["hide", "with", "only"]
ARCHIVED: dict[ArchivedChoice, bool | None] = {"hide": False, "with": None, "only": True}
"""The runs list's ``archived`` filter, on the page (``/``) and in ``GET /api/runs``: archived runs hidden (the
default, ``ARCHIVED_DEFAULT``), shown among the others, or shown alone; -> ``Run.archived`` is that (None: any)."""
ARCHIVED_DEFAULT: ArchivedChoice = "hide"


def archived_where(archived: bool | None) -> list[ColumnElement[bool]]:
    """The WHERE clause of an ``ARCHIVED`` choice: only archived runs (True), only the others (False), any (None)."""
    return [] if archived is None else [col(Run.archived).is_(archived)]


def run_filters(
    *,
    status: list[RunStatus] | None = None,
    name: str | None = None,
    spec_id: int | None = None,
    created_after: datetime | None = None,
    created_before: datetime | None = None,
) -> list[ColumnElement[bool]]:
    """The WHERE clauses of a runs list (ANDed; none means every run). Naive bounds are taken as UTC."""
    created_after = _utc_bound(created_after, "created_after")
    created_before = _utc_bound(created_before, "created_before")
    if created_after and created_before and created_after > created_before:
        raise AppError(422, "invalid_request", "created_after must not be later than created_before",
                       field="created_after", value=created_after.isoformat(), valid=f"<= {created_before.isoformat()}")
    where: list[ColumnElement[bool]] = []
    if status:
        where.append(col(Run.status).in_([RunStatus(s).value for s in status]))
    if name:
        where.append(col(Run.name).icontains(name, autoescape=True))
    if spec_id is not None:
        where.append(col(Run.spec_id) == spec_id)
    if created_after is not None:
        where.append(col(Run.created_at) >= created_after)
    if created_before is not None:
        where.append(col(Run.created_at) < created_before)
    return where


# The orders a runs list can take: name -> ORDER BY (the id last, so equal keys keep a stable order).
RUN_SORTS: dict[str, tuple[Any, ...]] = {
    "newest": (col(Run.id).desc(),),
    "oldest": (col(Run.id).asc(),),
    "name": (func.lower(col(Run.name)).asc(), col(Run.id).desc()),
    "status": (col(Run.status).asc(), col(Run.id).desc()),
    "progress": (col(Run.step).desc(), col(Run.id).desc()),
}


def list_runs(
    session: Session,
    *,
    status: list[RunStatus] | None = None,
    name: str | None = None,
    spec_id: int | None = None,
    created_after: datetime | None = None,
    created_before: datetime | None = None,
    archived: bool | None = None,
    sort: str = "newest",
    limit: int = 50,
    offset: int = 0,
) -> tuple[list[Run], int]:
    """Filtered (``run_filters``; ``archived``: only those, or only the others, None: both), in the order
    ``sort`` names (``RUN_SORTS``, newest first by default); returns (page, total matching) as ORM rows
    (the API's ``GET /api/runs`` answers from ``app.services.reads.run_page_json`` instead)."""
    if sort not in RUN_SORTS:
        raise AppError(422, "invalid_request", f"sort {sort!r} is not an order of the runs list; valid: "
                       f"{', '.join(RUN_SORTS)}", field="sort", value=sort, valid=list(RUN_SORTS))
    where = run_filters(status=status, name=name, spec_id=spec_id, created_after=created_after,
                        created_before=created_before) + archived_where(archived)
    total = session.exec(select(func.count()).select_from(Run).where(*where)).one()
    rows = session.exec(select(Run).where(*where).order_by(*RUN_SORTS[sort]).limit(limit).offset(offset)).all()
    return list(rows), total


def set_archived(session: Session, *, run_id: int, archived: bool) -> Run:
    """Archive a run (hidden from the runs list and ``GET /api/runs`` by default) or bring it back; its data
    stays as it is. Idempotent; 404 naming the id for an unknown run. The runs list page's Archive and Restore
    and ``POST /api/runs/{id}/archive`` / ``unarchive`` all come here."""
    run = get_run(session, run_id=run_id)
    run.archived = archived
    session.add(run)
    session.commit()
    session.refresh(run)
    return run


def _utc_bound(value: datetime | None, field: str) -> datetime | None:
    """A timestamp filter in UTC (SQLite compares stored UTC text, so the zone must match)."""
    if value is None:
        return None
    try:
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    except OverflowError:
        raise AppError(422, "invalid_request", f"{field}: {value.isoformat()} is out of range in UTC", field=field,
                       value=value.isoformat(), valid="a timestamp between years 1 and 9999 in UTC") from None


# --------------------------------------------------------------------------------------------
# Status changes


def set_status(run: Run, new: RunStatus | str, *, reason: str | None = None, at: datetime | None = None) -> Run:
    """Apply a validated transition to ``run`` (not committed): timestamps and reason follow."""
    status = check_transition(run.status, new, run_id=run.id)
    now = at or utcnow()
    run.status = status.value
    if reason is not None:
        run.status_reason = reason
    if status in (RunStatus.starting, RunStatus.running) and run.started_at is None:
        run.started_at = now
    if status in TERMINAL:
        run.finished_at = now
    return run


def cancel_run(session: Session, *, run_id: int, launcher: Launcher | None = None) -> Run:
    run = get_run(session, run_id=run_id)
    status = RunStatus(run.status)
    if status in TERMINAL:
        raise AppError(409, "invalid_transition", f"run {run_id} is already {status.value}: only queued, starting "
                       f"or running runs can be cancelled", field="status", value=status.value,
                       valid=["queued", "starting", "running"])
    if status == RunStatus.queued or launcher is None or not run.ray_job:
        # Never handed to compute (queued, no launcher, or no Ray job, e.g. a state no engine reported): nothing
        # runs that could stop by itself, so the run ends here, whatever state it shows.
        why = ("cancelled before it started" if status == RunStatus.queued else
               "cancelled (no launcher attached)" if launcher is None else "cancelled (no job was started for it)")
        if launcher is not None and run.ray_job:
            launcher.cancel(run)
        set_status(run, RunStatus.cancelled, reason=why)
    else:
        run.cancel_requested = True
        run.status_reason = "cancel requested; waiting for the workers to stop"
        launcher.cancel(run)
    session.add(run)
    session.commit()
    session.refresh(run)
    return run


# --------------------------------------------------------------------------------------------
# Retry and clone


def retry_run(session: Session, *, run_id: int, patch: dict[str, Any] | None = None, name: str | None = None,
              launcher: Launcher | None = None) -> Run:
    """A new run with the old run's spec plus ``patch`` (dotted keys), validated again; ``retry_of`` is set."""
    old = get_run(session, run_id=run_id)
    tree = apply_patch(old.spec, patch or {})
    return _insert_run(session, source=tree, name=name or _derived_name(old.name, " (retry)"), spec_id=old.spec_id,
                       environment=old.environment, retry_of=old.id, launcher=launcher)


def clone_run(session: Session, *, run_id: int, name: str | None = None, launcher: Launcher | None = None) -> Run:
    """A new, independent run with the same spec (no ``retry_of``)."""
    old = get_run(session, run_id=run_id)
    return _insert_run(session, source=old.spec, name=name or _derived_name(old.name, " (copy)"), spec_id=old.spec_id,
                       environment=old.environment, retry_of=None, launcher=launcher)
