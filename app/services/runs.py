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
from typing import Any

from sqlalchemy import ColumnElement, func
from sqlmodel import Session, col, select

from app.errors import AppError, not_found
from app.models import NAME_MAX, TERMINAL_STATUSES, Run, RunCreate, RunStatus, utcnow
from app.services.common import check_paths, validated_spec
from app.services.launcher import Launcher, LauncherUnavailable
from app.services.specs import get_spec
from app.services.states import check_transition

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
        node = out
        for part in parts[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = node[part] = {}
            node = child
        if value is None:
            node.pop(parts[-1], None)
        else:
            node[parts[-1]] = value
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


def list_runs(
    session: Session,
    *,
    status: list[RunStatus] | None = None,
    name: str | None = None,
    spec_id: int | None = None,
    created_after: datetime | None = None,
    created_before: datetime | None = None,
    limit: int = 50,
    offset: int = 0,
) -> tuple[list[Run], int]:
    """Newest first, filtered (``run_filters``); returns (page, total matching) as ORM rows (the API's
    ``GET /api/runs`` answers from ``app.services.reads.run_page_json`` instead)."""
    where = run_filters(status=status, name=name, spec_id=spec_id, created_after=created_after,
                        created_before=created_before)
    total = session.exec(select(func.count()).select_from(Run).where(*where)).one()
    rows = session.exec(select(Run).where(*where).order_by(col(Run.id).desc()).limit(limit).offset(offset)).all()
    return list(rows), total


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
    if status in TERMINAL_STATUSES:
        run.finished_at = now
    return run


def cancel_run(session: Session, *, run_id: int, launcher: Launcher | None = None) -> Run:
    run = get_run(session, run_id=run_id)
    status = RunStatus(run.status)
    if status in TERMINAL_STATUSES:
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
