"""Run events: ``{"run_id", "seq", "ts", "kind", "payload"}`` with ``seq`` contiguous from 1.

Only the controller numbers events (rank workers return payloads), so one run has one sequence. What each
kind's payload holds is its model in ``worker.core.events.PAYLOADS`` (the ``attention`` payload:
``worker.core.attention_payload.AttentionPayload``). After the final status nothing more is recorded (a
controller abandoned by a cancel may still return).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

# The contract lives in worker.core.contract (shared with the app); re-exported here for the engine.
from worker.core.contract import TERMINAL, Kind, RunState

__all__ = ["TERMINAL", "Event", "EventLog", "Kind", "RunState"]

Event = dict[str, Any]


class EventLog:
    """Numbers events, keeps them, and passes each to ``on_event``; safe to use from several threads."""

    def __init__(self, run_id: str, on_event: Callable[[Event], None] | None = None, *, first_seq: int = 1,
                 state: RunState | str = RunState.queued):
        """``first_seq`` and ``state``: where a run restarted in a new engine host stands (the app's last
        stored seq + 1 and its status), so its seqs continue without a gap."""
        self.run_id = run_id
        self._events: list[Event] = []
        self._lock = threading.Lock()
        self._on_event = on_event
        self._base = max(int(first_seq), 1) - 1
        self.state = RunState(state).value

    def emit(self, kind: Kind | str, payload: dict[str, Any]) -> Event | None:
        """Number and keep an event; None (nothing recorded) once the run has its final status."""
        kind = Kind(kind).value
        with self._lock:
            if self.state in TERMINAL:
                return None
            event = {"run_id": self.run_id, "seq": self._base + len(self._events) + 1, "ts": time.time(),
                     "kind": kind, "payload": payload}
            self._events.append(event)
            if kind == Kind.status.value:
                self.state = payload["state"]
        if self._on_event is not None:
            self._on_event(event)
        return event

    def status(self, state: RunState | str, reason: str = "", **extra: Any) -> Event | None:
        return self.emit(Kind.status, {"state": RunState(state).value, "reason": reason, **extra})

    def since(self, after_seq: int, limit: int = 1000) -> list[Event]:
        start = max(after_seq - self._base, 0)
        with self._lock:
            return list(self._events[start: start + limit])

    @property
    def last_seq(self) -> int:
        return self._base + len(self._events)

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL
