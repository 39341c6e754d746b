"""Run events: the contract in PRODUCT.md, ``(run_id, seq, ts, kind, payload)`` with ``seq``
contiguous per run from 1.

``append_events`` is idempotent on ``(run_id, seq)``: events at or below the run's ``last_seq`` are
duplicates and ignored; a batch that would leave a hole is refused whole. Events that describe the
run (``status``, ``metric`` steps, ``attention``, ``restart`` counts) update the run row in the same
transaction.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import update
from sqlmodel import Session, col, select

from app.errors import AppError, not_found
from app.models import INT32_MAX, AppendResult, Event, EventCreate, EventKind, Run, utcnow
from app.services import troubleshooting
from app.services.runs import set_status
from app.services.states import parse_status

MAX_EVENTS_PAGE = 1000


def _lock_run(session: Session, run_id: int) -> Run:
    """Take the run's write lock first (a no-op UPDATE: a row lock on PostgreSQL, the write lock on
    SQLite), so concurrent appenders for one run serialise instead of racing on ``last_seq``."""
    result = session.exec(update(Run).where(col(Run.id) == run_id).values(last_seq=Run.last_seq))  # type: ignore[call-overload]
    if result.rowcount == 0:
        session.rollback()
        raise not_found("run", run_id, field="run_id")
    run = session.get(Run, run_id, populate_existing=True)
    assert run is not None
    return run


def append_events(session: Session, *, run_id: int, events: Sequence[EventCreate]) -> AppendResult:
    """Store ``events`` for ``run_id`` once each, in one transaction; see the module docstring."""
    run = _lock_run(session, run_id)
    try:
        by_seq: dict[int, EventCreate] = {}
        for ev in events:
            by_seq.setdefault(ev.seq, ev)
        fresh = [by_seq[s] for s in sorted(by_seq) if s > run.last_seq]
        expected = run.last_seq + 1
        for ev in fresh:
            if ev.seq != expected:
                raise AppError(409, "event_gap", f"run {run_id}: expected seq {expected}, got {ev.seq} (last stored "
                               f"{run.last_seq}); seqs must be contiguous from 1", field="seq", value=ev.seq,
                               valid=expected)
            expected += 1
        for ev in fresh:
            _apply(run, ev)
            session.add(Event(run_id=run_id, seq=ev.seq, kind=ev.kind.value, payload=ev.payload, ts=ev.ts or utcnow()))
        if fresh:
            run.last_seq = fresh[-1].seq
        troubleshooting.record_events(session, run=run, events=fresh)
        session.add(run)
        session.commit()
    except BaseException:
        session.rollback()
        raise
    return AppendResult(inserted=len(fresh), duplicates=len(events) - len(fresh), last_seq=run.last_seq)


def _apply(run: Run, ev: EventCreate) -> None:
    """What an event changes on its run row (pure on the objects)."""
    payload = ev.payload
    if ev.kind == EventKind.status:
        status = parse_status(payload.get("status"), field=f"events[seq={ev.seq}].payload.status")
        reason = payload.get("reason")
        if status.value == run.status:  # a worker repeating the state the app already shows (e.g. queued)
            if reason is not None:
                run.status_reason = str(reason)
        else:
            set_status(run, status, reason=str(reason) if reason is not None else None, at=ev.ts)
        if status.value == "cancelled":
            run.cancel_requested = False
    elif ev.kind == EventKind.metric:
        step = payload.get("step")
        if isinstance(step, int) and not isinstance(step, bool) and run.step < step <= INT32_MAX:
            run.step = step
    elif ev.kind == EventKind.restart:
        attempt = payload.get("attempt")
        if isinstance(attempt, int) and not isinstance(attempt, bool) and run.restarts < attempt <= INT32_MAX:
            run.restarts = attempt
    elif ev.kind == EventKind.attention:
        role, effective = payload.get("role"), payload.get("effective")
        if isinstance(role, str) and effective is not None:
            # A new dict, so the JSON column sees the change.
            run.effective_attention = {**(run.effective_attention or {}), role: effective}


def events_since(session: Session, *, run_id: int, after_seq: int = 0, limit: int = 100) -> tuple[list[Event], int]:
    """Events of ``run_id`` with ``seq > after_seq``, oldest first, at most ``limit``; plus the run's last seq."""
    run = session.get(Run, run_id)
    if run is None:
        raise not_found("run", run_id, field="run_id")
    rows = session.exec(
        select(Event).where(Event.run_id == run_id, col(Event.seq) > after_seq).order_by(col(Event.seq)).limit(limit)
    ).all()
    return list(rows), run.last_seq



def attention_events(session: Session, *, run_ids: Sequence[int]) -> dict[int, list[tuple[str, dict]]]:
    """The ``attention`` and ``error`` events ``(kind, payload)`` of each run in ``run_ids``, oldest first:
    what the runs list folds into one attention badge per role (``app.views.run_view.role_badges``)."""
    out: dict[int, list[tuple[str, dict]]] = {run_id: [] for run_id in run_ids}
    if not run_ids:
        return out
    rows = session.exec(
        select(Event.run_id, Event.kind, Event.payload)
        .where(col(Event.run_id).in_(list(run_ids)), col(Event.kind).in_([EventKind.attention.value, EventKind.error.value]))
        .order_by(col(Event.run_id), col(Event.seq))
    ).all()
    for run_id, kind, payload in rows:
        out[run_id].append((kind, payload))
    return out
