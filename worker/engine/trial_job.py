"""An attention trial as a job of the engine host (``worker.engine.host``), beside the runs.

The app queues a trial like a run (by the ranks it needs: one implementation runs after the other, each
with the spec's world) and submits it to the engine host when they are free; the host runs it here, on a
thread of its own, with the host's rank pool: ``run_trial`` runs each implementation as a ``Trainer`` on
ranks taken from the pool (warm ones first) and handed back after it, and the environment probe and the
logit parity check run on a rank too (``RankWorker.probe``, ``RankWorker.parity_check``), on the device
Ray gave it. Nothing of a trial runs in the app's process: the app reads ``progress`` and stores it.

``progress`` is the whole state (not a stream of events): ``state`` (``queued -> running -> succeeded |
failed | cancelled``), ``reason`` (what it does now, or how it ended: ``worker.engine.trial.outcome``),
the result so far (columns as each is measured, the recommendation at the end) and the error. A trial in
which no implementation completed ends ``failed``.

A trial restarted after its host died (``done``: the columns the app stored) keeps those columns and
measures the rest; the parity check runs again over all that completed.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import ray

from worker.core.contract import TERMINAL, RunState
from worker.core.environment import Environment
from worker.engine.parity import Parity
from worker.engine.ranks import RankSource
from worker.engine.trial import Column, outcome, run_trial
from worker.spec import parse_spec

RANKS_BACK_TIMEOUT_S = 60.0
"""Ranks the previous implementation let go of are killed asynchronously: Ray counts their CPUs (GPUs) as
free a moment later. The next implementation waits this long for them (the queue reserved them for the
trial) before its trainer checks the resources itself and fails naming both numbers."""
CANCEL_GRACE_S = 10.0
"""A cancel lets the implementation being measured stop at its next call boundary this long (the trainer's
own cancel then gives calls in flight their grace), then kills its ranks."""
RANK_CALL_TIMEOUT_S = 600.0


class TrialCancelled(Exception):
    """Raised between the trial's steps once a cancel was asked for."""


def trial_run_id(trial_id: str, implementation: str) -> str:
    """The engine's name of the run that measures one implementation of a trial: ``trial<id>-<impl>``."""
    return f"trial{trial_id}-{implementation}"


class TrialJob:
    """One trial in the engine host (see the module docstring). Every method is safe from many threads.

    ``request``: ``{"spec": tree, "implementations": [...], "steps": n, "environment": Environment.to_dict()
    or None}`` (None: probe the node a rank runs on)."""

    def __init__(self, trial_id: str, request: dict[str, Any], *, ranks: RankSource, model_roots: list[str] | None = None,
                 cache_dir: str | None = None, done: Sequence[dict[str, Any]] = (), attempt: int = 0):
        self.trial_id, self.request, self.ranks = trial_id, dict(request), ranks
        self.model_roots, self.cache_dir = [Path(r) for r in model_roots or []], cache_dir
        self.spec = parse_spec(dict(request["spec"]))
        self.implementations = list(dict.fromkeys(request["implementations"]))
        self.steps = int(request["steps"])
        self.done = [Column.from_dict(c) for c in done if c.get("status") == "ok"]
        self.attempt = attempt
        self._lock = threading.Lock()
        self._cancel = threading.Event()
        self._cancel_reason = "cancelled by the user"
        self._trainer: Any = None
        self.thread: threading.Thread | None = None
        self.state, self.reason = RunState.queued.value, "submitted to the engine host"
        self.columns: list[dict[str, Any]] = [c.as_dict() for c in self.done]
        self.result: dict[str, Any] | None = None
        self.error: str | None = None
        self.current: str | None = None

    # ---- control

    def start(self) -> None:
        if self.thread is None:
            self.thread = threading.Thread(target=self._run, name=f"trial-{self.trial_id}", daemon=True)
            self.thread.start()

    def progress(self) -> dict[str, Any]:
        with self._lock:
            result = self.result if self.result is not None else (
                {"columns": list(self.columns), "recommendation": None, "steps": self.steps} if self.columns else None)
            return {"trial_id": self.trial_id, "state": self.state, "reason": self.reason, "result": result,
                    "error": self.error, "current": self.current, "attempt": self.attempt,
                    "terminal": self.state in TERMINAL}

    def cancel(self, reason: str = "cancelled by the user", grace: float = CANCEL_GRACE_S) -> dict[str, Any]:
        """Stop the trial: the implementation being measured is cancelled (its ranks killed after ``grace``);
        answers with the trial ended (``cancelled``) unless it had ended already."""
        self._cancel_reason = reason
        self._cancel.set()
        with self._lock:
            trainer = self._trainer
        if trainer is not None:
            trainer.cancel(reason)
        if self.thread is None:
            self._finish(RunState.cancelled.value, reason)
            return self.progress()
        self.thread.join(timeout=grace)
        if self.thread.is_alive():
            self.kill(reason)
            self.thread.join(timeout=grace)
        if self.thread.is_alive():  # stuck where no kill reaches: ended here, its thread's end is not recorded
            self._finish(RunState.cancelled.value, f"{reason} (the trial did not stop within {2 * grace:g} s: its "
                                                    f"ranks were killed)")
        return self.progress()

    def kill(self, reason: str = "stopped by the app") -> None:
        """Stop at once: the implementation being measured has its ranks killed."""
        self._cancel_reason = reason
        self._cancel.set()
        with self._lock:
            trainer = self._trainer
        if trainer is not None:
            trainer.kill(reason)

    # ---- the trial

    def _set(self, reason: str, current: str | None = None) -> None:
        with self._lock:
            if self.state not in TERMINAL:
                self.state, self.reason, self.current = RunState.running.value, reason, current

    def _finish(self, state: str, reason: str, *, result: dict[str, Any] | None = None, error: str | None = None) -> None:
        with self._lock:
            if self.state in TERMINAL:
                return
            self.state, self.reason, self.current = state, reason, None
            self.error = error
            if result is not None:
                self.result = result

    def _check(self) -> None:
        if self._cancel.is_set():
            raise TrialCancelled(self._cancel_reason)

    def _run(self) -> None:
        try:
            self._check()
            note = f" (restart {self.attempt})" if self.attempt else ""
            self._set(f"probing the node a rank runs on{note}" if self.request.get("environment") is None
                      else f"starting{note}")
            env = self._environment()
            result = run_trial(self.spec, self.implementations, steps=self.steps, env=env, model_roots=self.model_roots,
                               cache_dir=self.cache_dir, run=self._measure, parity=self._parity,
                               on_column=self._column, trial_id=f"trial{self.trial_id}", done=self.done)
            state, why = outcome(result.columns)
            self._finish(state, why, result=result.as_dict(), error=None if state == RunState.succeeded.value else why)
        except TrialCancelled as exc:
            self._finish(RunState.cancelled.value, str(exc))
        except Exception as exc:
            if self._cancel.is_set():
                self._finish(RunState.cancelled.value, self._cancel_reason)
            else:
                text = f"{type(exc).__name__}: {exc}"
                self._finish(RunState.failed.value, text, error=f"{text}\n{traceback.format_exc(limit=6)}"[-4000:])

    def _column(self, column: Column) -> None:
        with self._lock:
            self.columns = [c for c in self.columns if c["implementation"] != column.implementation] + [column.as_dict()]

    def _on_rank(self, what: str, call: Callable[[Any], Any]) -> Any:
        """``call(handle)`` -> an ObjectRef on one rank from the pool, its answer; the rank goes back after."""
        device = self.spec.trainer.device
        handle = self.ranks.acquire(run_id=f"trial{self.trial_id}-{what}", device=device, world=1).handles[0]
        ok = False
        try:
            answer = ray.get(call(handle), timeout=RANK_CALL_TIMEOUT_S)
            ok = True
            return answer
        finally:
            self.ranks.release([handle], device=device, reusable=ok)

    def _environment(self) -> Environment:
        from worker.engine.probe import environment_fields

        given = self.request.get("environment")
        if given is not None:
            return Environment.from_dict(given)
        probe = self._on_rank("probe", lambda h: h.probe.remote(None))
        return Environment.from_dict(environment_fields(probe, name="probed node"))

    def _measure(self, spec: Any, *, run_id: str, on_event: Callable[[dict[str, Any]], None],
                 model_roots: Sequence[Path], cache_dir: Path | str | None) -> str:
        """``run_trial``'s runner: one implementation's PPO steps as a ``Trainer`` on the pool's ranks."""
        from worker.engine.controller import Trainer, run_options
        from worker.engine.events import EventLog

        self._check()
        self._wait_for_ranks(spec.trainer.device, spec.world_size)
        implementation = run_id.removeprefix(f"trial{self.trial_id}-")
        position = self.implementations.index(implementation) + 1 if implementation in self.implementations else 0
        log = EventLog(run_id, on_event)
        log.status(RunState.queued, "submitted")
        trainer = Trainer(spec, log=log, options=run_options(model_roots=list(model_roots), cache_dir=cache_dir),
                          ranks=self.ranks)
        with self._lock:
            self._trainer = trainer
        if self._cancel.is_set():
            trainer.cancel(self._cancel_reason)
        self._set(f"measuring {implementation} ({position} of {len(self.implementations)}, {self.steps} "
                  f"step{'s' if self.steps != 1 else ''})", implementation)
        try:
            state = trainer.run()
        finally:
            with self._lock:
                self._trainer = None
        self._check()
        return state

    def _wait_for_ranks(self, device: str, world: int) -> None:
        """Until Ray (with the pool's idle ranks) has room for ``world`` ranks again, or ``RANKS_BACK_TIMEOUT_S``."""
        from worker.engine.dispatch import ResourceError, check_resources

        deadline = time.monotonic() + RANKS_BACK_TIMEOUT_S
        while True:
            available = dict(ray.available_resources())
            for key, amount in self.ranks.idle_resources().items():
                available[key] = available.get(key, 0.0) + amount
            try:
                check_resources(device=device, world=world, available=available)
                return
            except ResourceError:
                if time.monotonic() > deadline:
                    return  # the trainer checks again and fails naming the numbers
            self._check()
            time.sleep(0.2)

    def _parity(self, folder: Path | str, implementations: Sequence[str], *, device: str, dtype: str) -> Parity:
        """``run_trial``'s parity check, on a rank (``device`` is the rank's own)."""
        self._check()
        self._set(f"checking the logit parity of {', '.join(implementations)} with eager on a rank ({dtype})")
        return self._on_rank("parity", lambda h: h.parity_check.remote(str(folder), list(implementations), dtype))
