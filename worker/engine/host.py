"""The engine host: one detached Ray actor, ``attnboard-engine`` in namespace ``attnboard``, that runs the
controller of every run on a thread of its own and keeps a pool of warm rank actors between runs.
An app passes a scope (its database): ``attnboard-engine-<hash>``, so apps with different databases
(whose run ids overlap) can share one Ray cluster without sharing a host.

Why one long-lived host instead of an actor per run: a Ray actor is a new Python process that imports
torch, transformers and the engine before it answers (about 8 s on a 2-core machine), and a run
needs a controller and its ranks. In the host, the controller is a thread of a process that has
imported everything already, and the ranks come warm from the pool (``worker.engine.ranks``), so a
run reaches its first PPO step in the time its models take to load and step.

The host is detached: runs keep going while the app restarts, and a restarted app finds them with
``has_run``/``run_ids``. If the host process dies, its runs die with it (the rank actors are owned by
the host); the app starts each of them again in a new host from its newest complete checkpoint, while
its ``attnboard.max_restarts`` allows (``submit`` with a ``continuation``), and marks the others failed.

A run stays in the host until the app acknowledged all its events after it finished (``ack``).

Attention trials are jobs of the host too (``submit_trial``, ``worker.engine.trial_job``): on a thread each,
with the same rank pool; the app reads ``trial_progress``, stores it, and ``ack_trial`` forgets a finished one.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

import ray

from worker.core.contract import HOST_NAME, NAMESPACE
from worker.engine.events import Event
from worker.engine.ranks import PoolSettings, RankPool

# The run controller and the trial job (and with them torch) are imported where a job starts, in the host's
# process: the app imports this module to find the host and talk to it, and never imports torch.

log = logging.getLogger("attnboard.engine.host")

REFILL_EVERY_S = 1.0
MAX_CONCURRENCY = 64  # calls served at once: the app's pump, cancels and every run's acknowledgements


class RunUnknown(LookupError):
    """The host has no run of that id (never submitted here, or finished and acknowledged)."""

    def __init__(self, run_id: str):
        self.run_id = run_id
        super().__init__(f"run {run_id}: not in the engine host")

    def __reduce__(self):
        return (RunUnknown, (self.run_id,))


class TrialUnknown(LookupError):
    """The host has no trial of that id (never submitted here, or finished and acknowledged)."""

    def __init__(self, trial_id: str):
        self.trial_id = trial_id
        super().__init__(f"trial {trial_id}: not in the engine host")

    def __reduce__(self):
        return (TrialUnknown, (self.trial_id,))


class EngineHost:
    """The actor class (see the module docstring). Every method is safe to call from many threads."""

    def __init__(self, warm_ranks: int = 0, warm_device: str = "cpu"):
        self.pool = RankPool(PoolSettings(warm_ranks, warm_device))
        self.runs: dict[str, Any] = {}  # run id -> RunController
        self.trials: dict[str, Any] = {}  # trial id -> TrialJob (worker.engine.trial_job)
        self._lock = threading.Lock()
        self._refiller = threading.Thread(target=self._refill_loop, name="attnboard-pool-refill", daemon=True)
        self._refiller.start()

    # ---- the pool

    def configure(self, warm_ranks: int, warm_device: str = "cpu") -> dict[str, Any]:
        self.pool.configure(PoolSettings(warm_ranks, warm_device))
        return self.pool_status()

    def pool_status(self) -> dict[str, Any]:
        return {**self.pool.status(), "idle_resources": self.pool.idle_resources()}

    def idle_resources(self) -> dict[str, float]:
        """What idle warm ranks hold (``{"CPU": 1.0}``): the next run takes it, so it counts as free."""
        return self.pool.idle_resources()

    def _refill_loop(self) -> None:
        """Warm ranks up to the target while no run is going: a rank's process start (seconds of imports) would
        take CPU from the runs, and the ranks of a run that ends well come back to the pool anyway."""
        while True:
            time.sleep(REFILL_EVERY_S)
            with self._lock:
                busy = any(not run.log.terminal for run in self.runs.values()) or \
                    any(not job.progress()["terminal"] for job in self.trials.values())
            if busy:
                continue
            try:
                self.pool.refill()
            except Exception:
                log.exception("pool refill failed")

    # ---- runs

    def submit(self, spec: dict, run_id: str, model_roots: list[str] | None = None, cache_dir: str | None = None,
               save_actor_to: str | None = None, *, artefact_dir: str | None = None,
               checkpoint_roots: list[str] | None = None, continuation: dict[str, Any] | None = None) -> bool:
        """Start a run (``continuation``: restart one whose host died, see ``RunController``); False when the
        host has a run of that id already (nothing is started then)."""
        from worker.engine.controller import RunController

        with self._lock:
            if run_id in self.runs:
                return False
            run = RunController(spec, run_id, model_roots, cache_dir, save_actor_to, ranks=self.pool,
                                artefact_dir=artefact_dir, checkpoint_roots=checkpoint_roots,
                                continuation=continuation)
            self.runs[run_id] = run
        run.start()
        return True

    def has_run(self, run_id: str) -> bool:
        with self._lock:
            return run_id in self.runs

    def run_ids(self) -> list[str]:
        with self._lock:
            return sorted(self.runs)

    def _run(self, run_id: str) -> Any:
        with self._lock:
            run = self.runs.get(run_id)
        if run is None:
            raise RunUnknown(run_id)
        return run

    def events_since(self, run_id: str, after_seq: int, limit: int = 1000) -> list[Event]:
        return self._run(run_id).events_since(after_seq, limit)

    def status(self, run_id: str) -> dict[str, Any]:
        return self._run(run_id).status()

    def cancel(self, run_id: str, reason: str = "cancelled by the user") -> dict[str, Any]:
        return self._run(run_id).cancel(reason)

    def kill(self, run_id: str, reason: str = "stopped by the app") -> bool:
        """Stop a run at once and forget it (the app writes its end itself); False when it was not here."""
        return self._forget_killed(self.runs, run_id, reason)

    def ack(self, run_id: str, seq: int) -> dict[str, Any]:
        """Every event up to ``seq`` is stored; a finished run with all its events stored is forgotten."""
        run = self._run(run_id)
        status = run.ack(seq)
        if status["finished"]:
            with self._lock:
                self.runs.pop(run_id, None)
        return status

    # ---- trials (worker.engine.trial_job)

    def submit_trial(self, trial_id: str, request: dict[str, Any], model_roots: list[str] | None = None,
                     cache_dir: str | None = None, *, done: list[dict[str, Any]] | None = None, attempt: int = 0) -> bool:
        """Start a trial (``done``: the columns a host that died had measured); False when the host has a
        trial of that id already (nothing is started then)."""
        from worker.engine.trial_job import TrialJob

        with self._lock:
            if trial_id in self.trials:
                return False
            job = TrialJob(trial_id, request, ranks=self.pool, model_roots=model_roots, cache_dir=cache_dir,
                           done=done or [], attempt=attempt)
            self.trials[trial_id] = job
        job.start()
        return True

    def _trial(self, trial_id: str) -> Any:
        with self._lock:
            job = self.trials.get(trial_id)
        if job is None:
            raise TrialUnknown(trial_id)
        return job

    def trial_ids(self) -> list[str]:
        with self._lock:
            return sorted(self.trials)

    def trial_progress(self, trial_id: str) -> dict[str, Any]:
        return self._trial(trial_id).progress()

    def cancel_trial(self, trial_id: str, reason: str = "cancelled by the user") -> dict[str, Any]:
        return self._trial(trial_id).cancel(reason)

    def kill_trial(self, trial_id: str, reason: str = "stopped by the app") -> bool:
        """Stop a trial at once and forget it (the app writes its end itself); False when it was not here."""
        return self._forget_killed(self.trials, trial_id, reason)

    def _forget_killed(self, jobs: dict[str, Any], key: str, reason: str) -> bool:
        """Take ``key`` out of ``jobs`` (the runs or the trials) under the lock, then kill it outside the lock."""
        with self._lock:
            job = jobs.pop(key, None)
        if job is None:
            return False
        job.kill(reason)
        return True

    def ack_trial(self, trial_id: str) -> bool:
        """The app stored the trial's end: a finished trial is forgotten (True); a trial still going stays."""
        with self._lock:
            job = self.trials.get(trial_id)
            if job is None or not job.progress()["terminal"]:
                return False
            del self.trials[trial_id]
        return True

    def pid(self) -> int:
        return os.getpid()

    def held_pids(self, run_id: str) -> list[int]:
        """The pids of the rank processes a run holds now ([] once it let go of them)."""
        trainer = self._run(run_id).trainer
        return list(getattr(trainer, "pids", [])) if trainer.group is not None else []


class RunHandle:
    """A run in the engine host, for a driver (the app, a test): each method returns a Ray ``ObjectRef``."""

    def __init__(self, host: Any, run_id: str):
        self.host, self.run_id = host, run_id

    def events_since(self, after_seq: int, limit: int = 1000) -> Any:
        return self.host.events_since.remote(self.run_id, after_seq, limit)

    def status(self) -> Any:
        return self.host.status.remote(self.run_id)

    def cancel(self, reason: str = "cancelled by the user") -> Any:
        return self.host.cancel.remote(self.run_id, reason)

    def kill(self, reason: str = "stopped by the app") -> Any:
        return self.host.kill.remote(self.run_id, reason)

    def ack(self, seq: int) -> Any:
        return self.host.ack.remote(self.run_id, seq)


def find_host(name: str = HOST_NAME) -> Any | None:
    """The live engine host of that name, or None."""
    try:
        return ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        return None


def engine_host(*, name: str = HOST_NAME, warm_ranks: int = 0, warm_device: str = "cpu") -> Any:
    """The engine host, created on first use with a pool of ``warm_ranks`` on ``warm_device`` (an existing
    host keeps its pool: ``configure`` changes it)."""
    return ray.remote(EngineHost).options(
        name=name, namespace=NAMESPACE, lifetime="detached", get_if_exists=True, num_cpus=0,
        max_concurrency=MAX_CONCURRENCY, max_restarts=0,
    ).remote(warm_ranks, warm_device)


def launch_controller(spec: dict, *, run_id: str, model_roots: list[str] | None = None,
                      cache_dir: str | None = None, save_actor_to: str | None = None,
                      artefact_dir: str | None = None, checkpoint_roots: list[str] | None = None,
                      continuation: dict[str, Any] | None = None) -> Any:
    """Start a run in the engine host (created on first use) -> its ``RunHandle``.

    ValueError when the host already has a run of that id."""
    host = engine_host()
    if not ray.get(host.submit.remote(spec, run_id, model_roots, cache_dir, save_actor_to, artefact_dir=artefact_dir,
                                      checkpoint_roots=checkpoint_roots, continuation=continuation)):
        raise ValueError(f"run {run_id}: the engine host already has it")
    return RunHandle(host, run_id)


def get_controller(run_id: str) -> Any:
    """The ``RunHandle`` of a run the engine host has (ValueError when it has not, or there is no host)."""
    host = find_host()
    if host is None or not ray.get(host.has_run.remote(run_id)):
        raise ValueError(f"run {run_id}: not in the engine host")
    return RunHandle(host, run_id)
