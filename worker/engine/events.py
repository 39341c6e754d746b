"""Run events: ``{"run_id", "seq", "ts", "kind", "payload"}`` with ``seq`` contiguous from 1.

Only the controller numbers events (rank workers return payloads), so one run has one sequence.

Payloads by kind:

- ``status``: ``state`` (queued -> starting -> running -> succeeded | failed | cancelled), ``reason``;
  ``total_steps`` on running; ``rank`` when a rank failed; ``role`` when a role could not load.
- ``env_probe``: ``worker.engine.probe.probe_environment()`` of rank 0's node, plus ``rank``.
- ``attention``: one per role (actor, rollout, reference, critic) and rank: ``requested``, ``source``,
  ``predicted`` (the resolution's effective), ``effective`` (what loaded), ``config_attn_implementation``,
  ``observed`` (the kernel called most in the first forward), ``calls`` ({kernel: count}),
  ``wrappers`` (Ulysses), ``forced``, ``fallback``, ``status`` (ok | forced | fallback), ``reasons``,
  ``strategy``, ``sp``, ``output_attentions`` (the first forward asked for the attention weights and got them).
- ``fallback``: ``role``, ``rank``, ``from``, ``to``, ``error`` (the exception text), ``diagnosis``
  (``worker.troubleshoot.classify.Diagnosis.as_dict()``).
- ``attention_mismatch``: ``role``, ``rank``, ``what`` (resolution-vs-loaded | loaded-vs-observed),
  ``expected``, ``actual``, ``message``.
- ``metric``: ``step``, ``total_steps``, ``values`` ({verl-style name: float}: critic/rewards/mean,
  critic/score/mean, actor/kl, actor/pg_loss, actor/pg_clipfrac, actor/entropy, critic/vf_loss,
  response_length/mean, perf/tokens_per_s, perf/step_time_s, perf/max_memory_mb,
  training/rollout_probs_diff_mean, ...), ``peak_memory_mb`` ({rank: MiB}: max RSS on CPU,
  ``torch.cuda.max_memory_allocated`` on GPU).
- ``log``: ``message`` and context (``pids`` of the ranks and how many came ``warm`` from the pool, the
  ``rank_cpus`` each holds and the torch ``threads`` each runs, the ``resolution`` preview, a saved ``path``).
- ``error``: ``message``; ``rank``, ``cause``, ``died``, ``traceback`` for a rank failure; ``role``,
  ``attempts``, ``diagnosis``, ``policy`` for a role that could not load; ``field`` and ``issues`` for a
  checkpoint that cannot be resumed.
- ``restart``: the run starts again on new ranks after a rank or its engine host died: ``message``,
  ``cause``, ``rank`` (the dead rank, or null for the host), ``attempt`` (1 for the first restart),
  ``max_restarts``, ``resumed_from_step`` (0: from the start, no checkpoint yet), ``checkpoint`` (its
  path or null), ``source`` (engine: a rank died; app: the engine host died). Its status stays
  ``running``; the new ranks report their ``attention`` again (with ``node``, ``pid`` and ``attempt``),
  and ``metric`` events of the steps replayed since the checkpoint are not sent again.

After the final status nothing more is recorded (a controller abandoned by a cancel may still return).
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
