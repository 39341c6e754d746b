"""The rank actors of one run as one group: a method fans out as its ``@register`` declaration says
(``worker.engine.dispatch``), results come back in rank order, and a rank that dies or raises, or a
cancellation, becomes one exception the trainer acts on.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import ray
from ray.exceptions import OutOfMemoryError, RayActorError, RayTaskError

from worker.engine.dispatch import Dispatch, Mesh, dispatch_of, split_batch
from worker.engine.rank import RankWorker

CANCEL_GRACE_S = 5.0  # a cancelled run lets the ranks' calls in flight finish this long before killing them
LIVENESS_TIMEOUT_S = 2.0


class Cancelled(Exception):
    """The run was cancelled while a call was in flight."""


class RankFailed(Exception):
    """A rank died or raised; ``rank`` and ``cause`` name it."""

    def __init__(self, rank: int, cause: str, *, died: bool, remote_traceback: str = ""):
        self.rank, self.cause, self.died, self.remote_traceback = rank, cause, died, remote_traceback
        what = "died" if died else "failed"
        super().__init__(f"rank {rank} {what}: {cause}")


class WorkerGroup:
    """The rank actors of one run; ``call`` fans a method out as its ``@register`` declaration says."""

    def __init__(self, handles: list[Any], meshes: dict[str, Mesh], cancelled: Callable[[], bool],
                 grace_s: float = CANCEL_GRACE_S):
        self.handles, self.meshes, self.cancelled, self.grace_s = handles, meshes, cancelled, grace_s
        self.idle = True  # no call in flight: the ranks can be reset and reused

    @property
    def world(self) -> int:
        return len(self.handles)

    def wait(self, refs: list[Any], ranks: list[int]) -> list[Any]:
        """Results in rank order; a dead or failing rank raises RankFailed, cancellation raises Cancelled.

        On cancellation the calls in flight get ``grace_s`` to finish (a PPO step of a small model does),
        so the ranks end idle and can be reused; after that the ranks are left busy and get killed."""
        results: dict[Any, Any] = {}
        rank_of = dict(zip(refs, ranks, strict=True))
        pending = list(refs)
        self.idle = False
        deadline = None
        while pending:
            if self.cancelled():
                deadline = deadline or time.monotonic() + self.grace_s
                if time.monotonic() >= deadline:
                    raise Cancelled()
            ready, pending = ray.wait(pending, num_returns=1, timeout=0.25)
            for ref in ready:
                try:
                    results[ref] = ray.get(ref)
                except (RayActorError, OutOfMemoryError) as exc:  # the process is gone (killed, crashed, node lost)
                    if self.cancelled():
                        raise Cancelled() from None
                    raise RankFailed(rank_of[ref], _actor_death_cause(exc), died=True) from None
                except RayTaskError as exc:
                    if self.cancelled():
                        raise Cancelled() from None
                    dead = self.dead_rank()  # a collective fails on the survivors when a peer dies
                    if dead is not None:
                        raise RankFailed(dead[0], dead[1], died=True) from None
                    cause = exc.cause if exc.cause is not None else exc
                    raise RankFailed(rank_of[ref], f"{type(cause).__name__}: {cause}", died=False,
                                     remote_traceback=str(exc)) from cause
        self.idle = True
        if self.cancelled():
            raise Cancelled()
        return [results[ref] for ref in refs]

    def dead_rank(self, timeout: float = LIVENESS_TIMEOUT_S) -> tuple[int, str] | None:
        """The first rank whose actor is dead, with the cause; ranks that are busy or slow to answer count as alive."""
        refs = [h.pid.remote() for h in self.handles]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout)
        for rank, ref in enumerate(refs):
            if ref in ready:
                try:
                    ray.get(ref)
                except RayActorError as exc:
                    return rank, _actor_death_cause(exc)
                except Exception:
                    pass
        return None

    def call(self, method: str, *args: Any, batch: dict[str, Any] | None = None, **kwargs: Any) -> Any:
        if self.cancelled():
            raise Cancelled()  # between calls: nothing in flight, the ranks stay reusable
        spec = dispatch_of(RankWorker, method)
        if spec.mode == Dispatch.ONE_TO_ALL:
            refs = [getattr(h, method).remote(*args, **kwargs) for h in self.handles]
            return self.wait(refs, list(range(self.world)))
        mesh = self.meshes[spec.mesh]
        parts = split_batch(batch, mesh.dp)
        refs = [getattr(h, method).remote(parts[mesh.dp_rank(r)], *args, **kwargs) for r, h in enumerate(self.handles)]
        results = self.wait(refs, list(range(self.world)))
        return [results[r] for r in range(self.world) if mesh.sp_rank(r) == 0]  # one per data-parallel shard


def _actor_death_cause(exc: RayActorError) -> str:
    text = str(exc).strip().splitlines()
    return next((line.strip() for line in text if "cause" in line.lower() or "killed" in line.lower()),
                text[0] if text else type(exc).__name__)
