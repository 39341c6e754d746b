"""Run events: ``{"run_id", "seq", "ts", "kind", "payload"}`` with ``seq`` contiguous from 1.

Only the controller numbers events (rank workers return payloads), so one run has one sequence.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from enum import Enum
from typing import Any


class Kind(str, Enum):
    status = "status"
    env_probe = "env_probe"
    attention = "attention"
    fallback = "fallback"
    attention_mismatch = "attention_mismatch"
    metric = "metric"
    log = "log"
    error = "error"


class RunState(str, Enum):
    queued = "queued"
    starting = "starting"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"


TERMINAL = frozenset({RunState.succeeded.value, RunState.failed.value, RunState.cancelled.value})

Event = dict[str, Any]


class EventLog:
    """Numbers events, keeps them, and passes each to ``on_event``; safe to use from several threads."""

    def __init__(self, run_id: str, on_event: Callable[[Event], None] | None = None):
        self.run_id = run_id
        self._events: list[Event] = []
        self._lock = threading.Lock()
        self._on_event = on_event
        self.state = RunState.queued.value

    def emit(self, kind: Kind | str, payload: dict[str, Any]) -> Event:
        kind = Kind(kind).value
        with self._lock:
            event = {"run_id": self.run_id, "seq": len(self._events) + 1, "ts": time.time(), "kind": kind,
                     "payload": payload}
            self._events.append(event)
            if kind == Kind.status.value:
                self.state = payload["state"]
        if self._on_event is not None:
            self._on_event(event)
        return event

    def status(self, state: RunState | str, reason: str = "", **extra: Any) -> Event:
        return self.emit(Kind.status, {"state": RunState(state).value, "reason": reason, **extra})

    def since(self, after_seq: int, limit: int = 1000) -> list[Event]:
        with self._lock:
            return list(self._events[max(after_seq, 0): max(after_seq, 0) + limit])

    @property
    def last_seq(self) -> int:
        return len(self._events)

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL
