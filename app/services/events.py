"""Run events: the contract in PRODUCT.md, ``(run_id, seq, ts, kind, payload)`` with ``seq``
contiguous per run from 1.

``append_events`` is idempotent on ``(run_id, seq)``: an event at or below the run's ``last_seq`` with the
stored kind and payload is a duplicate and ignored; one with a different kind or payload is a conflict: the
stored event stays, the newcomer is kept in ``event_conflict``, logged and counted (never silently dropped).
A batch that would leave a hole is refused whole.

Only the engine writes a run's events: the pump in process, or ``POST /api/runs/{id}/events`` with the run's
ingest credential (``ingest_credential``, an HMAC of the run id under the app's secret key, which no user
token or browser session carries). Events that describe the
run (``status``, ``metric`` steps, ``attention``, ``restart`` counts) update the run row in the same
transaction.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Sequence

from sqlalchemy import func, update
from sqlmodel import Session, col, select

from app.errors import AppError, not_found
from app.models import INT32_MAX, AppendResult, Event, EventConflict, EventCreate, EventKind, Run, utcnow
from app.services import troubleshooting
from app.services.runs import set_status
from app.services.states import parse_status

MAX_EVENTS_PAGE = 1000
INGEST_HEADER = "X-Attnboard-Ingest"

log = logging.getLogger("attnboard.events")


def ingest_credential(secret_key: str, run_id: int) -> str:
    """The credential that lets the engine post run ``run_id``'s events: derived from the app's secret key, so
    only the app and the engine it starts hold it; no user token or session grants it."""
    return hmac.new(secret_key.encode(), f"attnboard.ingest:{run_id}".encode(), hashlib.sha256).hexdigest()


def check_ingest_credential(secret_key: str, run_id: int, given: str | None) -> None:
    """403 unless ``given`` is run ``run_id``'s ingest credential (compared in constant time)."""
    if given and hmac.compare_digest(given, ingest_credential(secret_key, run_id)):
        return
    raise AppError(403, "engine_only", f"run {run_id}'s events are written by the engine only; user tokens and "
                   f"browser sessions cannot post them", field=INGEST_HEADER, value="(missing)" if not given else "(wrong)",
                   valid="the run's ingest credential, held by the engine")


def _conflicts(session: Session, run_id: int, stale: list[EventCreate]) -> list[EventConflict]:
    """Of events whose seq is already stored, those whose kind or payload differ from the stored event's."""
    if not stale:
        return []
    stored = {seq: (kind, payload) for seq, kind, payload in session.exec(
        select(Event.seq, Event.kind, Event.payload).where(Event.run_id == run_id,
                                                           col(Event.seq).in_([ev.seq for ev in stale])))}
    out = []
    for ev in stale:
        kind, payload = stored.get(ev.seq, (None, None))
        if kind is not None and (kind != ev.kind.value or payload != ev.payload):
            out.append(EventConflict(run_id=run_id, seq=ev.seq, kind=ev.kind.value, payload=ev.payload, stored_kind=kind))
    return out


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
        in_batch: list[EventConflict] = []
        for ev in events:
            first = by_seq.setdefault(ev.seq, ev)
            if first is not ev and (first.kind != ev.kind or first.payload != ev.payload):
                in_batch.append(EventConflict(run_id=run_id, seq=ev.seq, kind=ev.kind.value, payload=ev.payload,
                                              stored_kind=first.kind.value))
        fresh = [by_seq[s] for s in sorted(by_seq) if s > run.last_seq]
        conflicts = in_batch + _conflicts(session, run_id, [by_seq[s] for s in sorted(by_seq) if s <= run.last_seq])
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
        for conflict in conflicts:
            log.warning("run %s: event seq %s arrived as %s with a payload that differs from the stored %s event; "
                        "kept in event_conflict", run_id, conflict.seq, conflict.kind, conflict.stored_kind)
            session.add(conflict)
        troubleshooting.record_events(session, run=run, events=fresh)
        session.add(run)
        session.commit()
    except BaseException:
        session.rollback()
        raise
    return AppendResult(inserted=len(fresh), duplicates=len(events) - len(fresh) - len(conflicts), conflicts=len(conflicts),
                        last_seq=run.last_seq)


def conflict_count(session: Session, *, run_id: int) -> int:
    """How many events of ``run_id`` arrived with a seq already stored under a different payload."""
    return int(session.exec(select(func.count()).select_from(EventConflict).where(EventConflict.run_id == run_id)).one())


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
