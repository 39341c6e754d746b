"""The run state machine as a table (pure).

    queued -> starting -> running -> succeeded | failed | cancelled

``cancelled`` and ``failed`` are reachable from every non-terminal state (a cancel, a submission
that failed, workers that vanished); ``succeeded`` only from ``running``. Terminal states are final,
and a state never moves to itself.
"""

from __future__ import annotations

from app.errors import AppError
from app.models import RunStatus
from worker.core.contract import TERMINAL

S = RunStatus

TRANSITIONS: dict[RunStatus, frozenset[RunStatus]] = {
    S.queued: frozenset({S.starting, S.failed, S.cancelled}),
    S.starting: frozenset({S.running, S.failed, S.cancelled}),
    S.running: frozenset({S.succeeded, S.failed, S.cancelled}),
    S.succeeded: frozenset(),
    S.failed: frozenset(),
    S.cancelled: frozenset(),
}


def parse_status(value: object, *, field: str = "status") -> RunStatus:
    try:
        return RunStatus(value)
    except ValueError:
        raise AppError(422, "invalid_status", f"{value!r} is not a run status; valid: {', '.join(s.value for s in S)}",
                       field=field, value=value, valid=[s.value for s in S]) from None


def can_transition(current: RunStatus, new: RunStatus) -> bool:
    return new in TRANSITIONS[current]


def check_transition(current: RunStatus | str, new: RunStatus | str, *, run_id: int | None = None) -> RunStatus:
    """``new`` as a RunStatus when ``current -> new`` is allowed, else a 409 naming both and the valid next states."""
    cur, nxt = RunStatus(current), parse_status(new)
    if can_transition(cur, nxt):
        return nxt
    allowed = sorted(s.value for s in TRANSITIONS[cur])
    who = f"run {run_id} " if run_id is not None else ""
    why = "it has finished" if cur in TERMINAL else f"valid next states: {', '.join(allowed)}"
    raise AppError(409, "invalid_transition", f"{who}cannot go from {cur.value} to {nxt.value}: {why}",
                   field="status", value=nxt.value, valid=allowed)
