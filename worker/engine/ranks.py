"""Where a run's rank actors come from, and where they go when it ends.

- ``FreshRanks``: a new actor per rank, named ``attnboard-run-<id>-rank<r>``, killed at the end of the
  run. ``run_spec`` (the CLI, the tests) uses it: nothing outlives the run.
- ``RankPool``: warm rank actors that outlive runs, kept by the engine host (``worker.engine.host``).
  A Ray actor is a fresh Python process that must import torch, transformers and the engine before
  its first call (seconds); a warm rank has done that already, so a run that finds enough of them
  starts at once. Each warm rank holds what a rank asks Ray for (``worker.core.devices``: its CPUs,
  plus 1 GPU off CPU) while it waits, and the scheduler counts idle warm ranks as free. The pool's
  ranks are sized as each rank of a run of ``target`` ranks derives its CPUs (``attnboard.rank_cpus``
  0: the cluster's CPUs shared among them); a run asking another count per rank takes none of them and
  starts new ranks of its size.

Reuse rules: only the ranks of a run that *succeeded* go back to the pool, after ``reset`` (process
group destroyed, roles dropped); a failed or cancelled run's ranks are killed, since a collective may
still be pending in them. ``refill`` starts warm ranks up to the target where Ray has room; the engine
host calls it while no run is going, and it does nothing while a run still waits for a new rank's
process, so a refill can never take the CPU (or GPU) a starting run waits for.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from dataclasses import dataclass
from typing import Any, Protocol

import ray

from worker.core.contract import NAMESPACE, rank_name
from worker.core.devices import ENGINE_DEVICES, Cluster, actor_options, rank_cpus, rank_resources

log = logging.getLogger("attnboard.engine.ranks")

RESET_TIMEOUT_S = 30.0


def cluster() -> Cluster:
    """The connected Ray cluster's CPUs (``rank_cpus`` derives a rank's from them)."""
    return Cluster.of_nodes(ray.nodes())


def rank_env(device: str, cpus: int) -> dict[str, str]:
    """Environment variables of a rank's process. A CPU rank of several torch threads waits for its OpenMP
    threads passively (``OMP_WAIT_POLICY=PASSIVE``, unless the environment sets it): spinning threads on a
    node that also runs Ray's processes, the controller or other jobs lose whole time slices at every
    barrier (measured on 2 busy cores: a 2-thread forward of a small model 7x slower than 1 thread, with
    PASSIVE as fast). libgomp reads it when torch loads, so it goes in before the process starts."""
    if device != "cpu" or cpus < 2:
        return {}
    return {"OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}


def start_rank(device: str, rank: int = 0, world: int = 1, run_id: str = "", *, cpus: int = 1, **options: Any) -> Any:
    """A new rank actor asking Ray for its resources (``worker.core.devices.actor_options``) and running ``cpus`` torch threads;
    ``options`` add e.g. a name."""
    from worker.engine.rank import RankWorker  # torch: imported where a rank starts, so the pool's users need none

    env = rank_env(device, cpus)
    if env:
        options["runtime_env"] = {"env_vars": env}
    return ray.remote(RankWorker).options(**actor_options(device, cpus), max_restarts=0, **options).remote(
        rank, world, run_id, device, threads=cpus)


def kill(handle: Any) -> None:
    with contextlib.suppress(Exception):
        ray.kill(handle, no_restart=True)


@dataclass(frozen=True)
class Acquired:
    """A run's rank actors in rank order; the first ``warm`` of them came from the pool."""

    handles: list[Any]
    warm: int = 0


class RankSource(Protocol):
    def acquire(self, *, run_id: str, device: str, world: int, cpus: int = 1) -> Acquired: ...

    def release(self, handles: list[Any], *, device: str, reusable: bool, cpus: int = 1) -> None: ...

    def idle_resources(self) -> dict[str, float]: ...


class FreshRanks:
    """One new, named actor per rank; every one is killed when the run ends."""

    def acquire(self, *, run_id: str, device: str, world: int, cpus: int = 1) -> Acquired:
        return Acquired([start_rank(device, r, world, run_id, cpus=cpus, name=rank_name(run_id, r),
                                    namespace=NAMESPACE) for r in range(world)])

    def release(self, handles: list[Any], *, device: str, reusable: bool, cpus: int = 1) -> None:
        for handle in handles:
            kill(handle)

    def idle_resources(self) -> dict[str, float]:
        return {}


@dataclass
class _Warm:
    handle: Any
    device: str
    cpus: int


@dataclass(frozen=True)
class PoolSettings:
    """``target`` warm ranks on ``device`` ("cpu" or "cuda"), each holding ``cpus`` CPUs (0: what each rank of a
    run of ``target`` ranks derives, ``rank_cpus`` with ``attnboard.rank_cpus`` 0)."""

    target: int = 0
    device: str = "cpu"
    cpus: int = 0

    def __post_init__(self) -> None:
        if self.target < 0:
            raise ValueError(f"warm ranks: {self.target} is negative; valid: 0 (no pool) or more")
        if self.device not in ENGINE_DEVICES:
            raise ValueError(f"warm rank device: {self.device!r} is not valid; valid: {', '.join(ENGINE_DEVICES)}")
        if self.cpus < 0:
            raise ValueError(f"warm rank CPUs: {self.cpus} is negative; valid: 0 (derived from the cluster) or more")

    def rank_cpus(self, where: Cluster) -> int:
        """The CPUs each warm rank holds on the cluster ``where``."""
        return rank_cpus(self.cpus, device=self.device, world=max(self.target, 1), cluster=where)


class RankPool:
    """Warm rank actors reused across runs (see the module docstring)."""

    def __init__(self, settings: PoolSettings = PoolSettings()):
        self.settings = settings
        self._idle: list[_Warm] = []
        self._new: list[Any] = []  # pid refs of new ranks created for runs, until their processes are up
        self._lock = threading.Lock()

    def configure(self, settings: PoolSettings) -> None:
        with self._lock:
            self.settings = settings
            self._drop([w for w in self._idle if w.device != settings.device]
                       + [w for w in self._idle if w.device == settings.device][settings.target:])
        self.refill()

    def _drop(self, warms: list[_Warm]) -> None:
        """Take ``warms`` out of the pool and kill them (the caller holds the lock)."""
        for warm in warms:
            self._idle.remove(warm)
            kill(warm.handle)

    # ---- runs

    def acquire(self, *, run_id: str, device: str, world: int, cpus: int = 1) -> Acquired:
        """``world`` rank actors on ``device`` with ``cpus`` CPUs each: the warm ones of that size first (oldest
        first), new ones for the rest."""
        with self._lock:
            mine = [w for w in self._idle if w.device == device and w.cpus == cpus][:world]
            for warm in mine:
                self._idle.remove(warm)
            handles = [w.handle for w in mine]
            if len(handles) < world:
                # the other warm ranks' CPUs/GPUs go to the new ranks
                self._drop([w for w in self._idle if w.device != device or w.cpus != cpus])
                for r in range(len(handles), world):
                    handle = start_rank(device, r, world, run_id, cpus=cpus)
                    self._new.append(handle.pid.remote())
                    handles.append(handle)
        log.info("run %s: %d warm and %d new rank(s) on %s", run_id, len(mine), world - len(mine), device)
        return Acquired(handles, warm=len(mine))

    def release(self, handles: list[Any], *, device: str, reusable: bool, cpus: int = 1) -> None:
        """Back to the pool (reset) when ``reusable``, else killed (``cpus``: what each holds). Ranks coming back
        from a run go first in line, ahead of ranks started by a refill meanwhile (those may still be
        importing); the pool is then trimmed to its target from the newest end."""
        keep: list[Any] = []
        if reusable and device == self.settings.device and self.settings.target > 0:
            refs = {h.reset.remote(): h for h in handles[:self.settings.target]}
            ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=RESET_TIMEOUT_S)
            for ref in ready:
                try:
                    ray.get(ref)
                except Exception as exc:
                    log.warning("a rank could not reset and is dropped: %s", exc)
                else:
                    keep.append(refs[ref])
        with self._lock:
            for handle in handles:
                if handle not in keep:
                    kill(handle)
            self._idle[:0] = [_Warm(h, device, cpus) for h in keep]
            self._drop([w for w in self._idle if w.device == self.settings.device][self.settings.target:])

    def idle_resources(self) -> dict[str, float]:
        """What the idle warm ranks hold: free for the next run, so the scheduler counts it as available."""
        with self._lock:
            out: dict[str, float] = {}
            for warm in self._idle:
                for name, amount in rank_resources(warm.device, warm.cpus).items():
                    out[name] = out.get(name, 0.0) + amount
            return out

    def status(self) -> dict[str, Any]:
        with self._lock:
            return {"target": self.settings.target, "device": self.settings.device, "idle": len(self._idle),
                    "starting_for_runs": len(self._new)}

    # ---- refill

    def refill(self) -> int:
        """Start warm ranks up to the target while Ray has room for them; returns how many were started.

        Skipped while a run waits for a new rank's process: that rank must get the CPU (or GPU) first."""
        with self._lock:
            if self._new:
                _, self._new = ray.wait(self._new, num_returns=len(self._new), timeout=0)
                if self._new:
                    return 0
            device, target = self.settings.device, self.settings.target
            missing = target - sum(w.device == device for w in self._idle)
            if missing <= 0:
                return 0
            available = ray.available_resources()
            cpus = self.settings.rank_cpus(cluster())
            need = rank_resources(device, cpus)
            fits = int(min(available.get(name, 0.0) // amount for name, amount in need.items()))
            started = max(0, min(missing, fits))
            self._idle += [_Warm(start_rank(device, cpus=cpus), device, cpus) for _ in range(started)]
        if started:
            log.info("pool: started %d warm rank(s) on %s", started, device)
        return started
