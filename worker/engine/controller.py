"""The run controller: one run from the outside. It starts the run's ``Trainer`` (``worker.engine.trainer``)
and hands its numbered events out.

Two entry points share the trainer:
- ``run_spec(spec, run_id=..., on_event=...)``: in this process (CLI, tests), with new rank actors that
  are killed at the end (``worker.engine.ranks.FreshRanks``).
- ``RunController``: one run inside the engine host (``worker.engine.host``), a detached Ray actor that
  outlives the app and keeps warm rank actors between runs; the app reads ``events_since`` and
  acknowledges with ``ack``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray

from worker.core.contract import NAMESPACE
from worker.engine import models
from worker.engine.events import Event, EventLog, RunState
from worker.engine.group import CANCEL_GRACE_S
from worker.engine.ranks import RankSource, rank_name
from worker.engine.trainer import CANCEL_BOUND_S, Continuation, RunOptions, Trainer
from worker.spec import RunSpec, parse_spec


def controller_name(run_id: str) -> str:
    """The name of a run in the engine (and the app's ``ray_job``): ``attnboard-run-<run_id>``."""
    return f"attnboard-run-{run_id}"


def run_actor_names(run_id: str) -> set[str]:
    """The named rank actors of a ``run_spec`` run still alive (``attnboard-run-<id>-rank<r>``)."""
    prefix = rank_name(run_id, 0)[:-1]
    return {a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
            if a["namespace"] == NAMESPACE and a["name"].startswith(prefix)}


def run_options(*, model_roots: list[Path] | list[str] | None = None, cache_dir: Path | str | None = None,
                save_actor_to: Path | str | None = None, artefact_dir: Path | str | None = None,
                checkpoint_roots: list[Path] | list[str] | None = None) -> RunOptions:
    """``RunOptions`` from plain values (paths as text cross the Ray boundary)."""
    return RunOptions(model_roots=[Path(r) for r in model_roots or []],
                      cache_dir=Path(cache_dir) if cache_dir else models.default_cache_dir(),
                      save_actor_to=Path(save_actor_to) if save_actor_to else None,
                      artefact_dir=Path(artefact_dir) if artefact_dir else None,
                      checkpoint_roots=[Path(r) for r in checkpoint_roots] if checkpoint_roots is not None else None)


def run_spec(spec: RunSpec | dict, *, run_id: str, on_event: Callable[[Event], None] | None = None,
             model_roots: list[Path] | None = None, cache_dir: Path | str | None = None,
             save_actor_to: Path | str | None = None, artefact_dir: Path | str | None = None) -> str:
    """Run a spec in this process (one Ray actor per rank; Ray must be initialised) -> the final state.
    ``artefact_dir``: where a relative ``trainer.default_local_dir`` goes (default: a folder of this run
    under the temp folder)."""
    spec = spec if isinstance(spec, RunSpec) else parse_spec(spec)
    log = EventLog(run_id, on_event)
    log.status(RunState.queued, "submitted")
    options = run_options(model_roots=model_roots, cache_dir=cache_dir, save_actor_to=save_actor_to,
                          artefact_dir=artefact_dir)
    return Trainer(spec, log=log, options=options).run()


class RunController:
    """One run inside the engine host: the trainer on its own thread and the run's events until the app
    has acknowledged them all. ``continuation`` (``Continuation`` as a dict): the run is restarted here
    after its previous host died; its events continue from the app's last stored seq."""

    def __init__(self, spec: dict, run_id: str, model_roots: list[str] | None = None, cache_dir: str | None = None,
                 save_actor_to: str | None = None, ranks: RankSource | None = None, *,
                 artefact_dir: str | None = None, checkpoint_roots: list[str] | None = None,
                 continuation: dict[str, Any] | None = None):
        self.run_id = run_id
        carry_on = Continuation.of(continuation)
        if carry_on is None:
            self.log = EventLog(run_id)
            self.log.status(RunState.queued, "submitted")
        else:
            self.log = EventLog(run_id, first_seq=carry_on.first_seq, state=carry_on.state)
        self.acked = carry_on.first_seq - 1 if carry_on else 0  # the app stored every event before the restart
        options = run_options(model_roots=model_roots, cache_dir=cache_dir, save_actor_to=save_actor_to,
                              artefact_dir=artefact_dir, checkpoint_roots=checkpoint_roots)
        self.trainer = Trainer(parse_spec(spec), log=self.log, options=options, ranks=ranks, continuation=carry_on)
        self.thread: threading.Thread | None = None

    def start(self) -> bool:
        if self.thread is None:
            self.thread = threading.Thread(target=self.trainer.run, name=f"run-{self.run_id}", daemon=True)
            self.thread.start()
        return True

    def events_since(self, after_seq: int, limit: int = 1000) -> list[Event]:
        return self.log.since(after_seq, limit)

    def status(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "state": self.log.state, "last_seq": self.log.last_seq, "acked": self.acked,
                "terminal": self.log.terminal}

    def cancel(self, reason: str = "cancelled by the user", bound: float = CANCEL_BOUND_S) -> dict[str, Any]:
        """Stop the run; answers within ``bound`` seconds with the run ended.

        The calls in flight get ``CANCEL_GRACE_S`` to finish (then the ranks are left busy and killed);
        a controller still running 5 s after that has its ranks killed; one still running when the bound
        is near (stuck in something no kill reaches) is abandoned: the run is marked cancelled here."""
        if self.thread is None:  # never started: nothing runs, end it here
            if not self.log.terminal:
                self.log.status(RunState.cancelled, reason)
            return self.status()
        deadline = time.monotonic() + bound
        self.trainer.cancel(reason)
        self.thread.join(timeout=min(CANCEL_GRACE_S + 5.0, bound * 2 / 3))
        if self.thread.is_alive():
            self.trainer.kill(reason)
            self.thread.join(timeout=max(deadline - time.monotonic() - 1.0, 0.0))
        if self.thread.is_alive():
            self.trainer.abandon(reason)
        return self.status()

    def kill(self, reason: str) -> None:
        """Stop at once (the app gave up on the run): ranks killed, no grace."""
        self.trainer.kill(reason)

    def ack(self, seq: int) -> dict[str, Any]:
        """The app persisted every event up to ``seq``; a finished, fully acknowledged run is done
        (``finished`` in the answer): the host forgets it."""
        self.acked = max(self.acked, int(seq))
        status = self.status()
        status["finished"] = bool(status["terminal"] and self.acked >= self.log.last_seq)
        return status
