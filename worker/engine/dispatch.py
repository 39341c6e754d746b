"""How a controller call fans out to the rank workers, and whether the cluster can hold them.

A rank-worker method declares its fan-out with ``@register(Dispatch.ONE_TO_ALL)`` (same arguments to
every rank, e.g. loading) or ``@register(Dispatch.DP_COMPUTE, mesh="actor")`` (the batch is split
across the data-parallel ranks of that role's mesh; the ranks of one sequence-parallel group get the
same shard, and the result is taken from each group's first rank). The controller reads the
declaration (``dispatch_of``) and splits, calls and collects accordingly (verl's
``single_controller/base/decorator.py`` idea, in a few lines).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

import torch

from worker.core.devices import GPU, run_resources

DISPATCH_ATTR = "__attnboard_dispatch__"


class Dispatch(str, Enum):
    ONE_TO_ALL = "one_to_all"
    DP_COMPUTE = "dp_compute"


@dataclass(frozen=True)
class DispatchSpec:
    mode: Dispatch
    mesh: str | None = None  # the role whose sequence-parallel size sets the data-parallel layout


def register(mode: Dispatch, *, mesh: str | None = None) -> Callable[[Callable], Callable]:
    if mode == Dispatch.DP_COMPUTE and mesh is None:
        raise ValueError("Dispatch.DP_COMPUTE needs mesh=<role> (whose sequence-parallel size splits the batch)")

    def decorator(fn: Callable) -> Callable:
        setattr(fn, DISPATCH_ATTR, DispatchSpec(mode, mesh))
        return fn

    return decorator


def dispatch_of(cls: type, method: str) -> DispatchSpec:
    fn = getattr(cls, method, None)
    spec = getattr(fn, DISPATCH_ATTR, None)
    if spec is None:
        raise AttributeError(f"{cls.__name__}.{method} has no @register(...) dispatch declaration")
    return spec


@dataclass(frozen=True)
class Mesh:
    """world = dp x sp; rank r is in data-parallel group r // sp at sequence-parallel position r % sp."""

    world: int
    sp: int

    def __post_init__(self) -> None:
        if self.sp < 1 or self.world % self.sp:
            raise ValueError(f"sequence-parallel size ({self.sp}) must divide the world size ({self.world})")

    @property
    def dp(self) -> int:
        return self.world // self.sp

    def dp_rank(self, rank: int) -> int:
        return rank // self.sp

    def sp_rank(self, rank: int) -> int:
        return rank % self.sp

    def sp_groups(self) -> list[list[int]]:
        return [list(range(d * self.sp, (d + 1) * self.sp)) for d in range(self.dp)]


Batch = dict[str, Any]


def split_batch(batch: Batch, parts: int) -> list[Batch]:
    """Split every tensor (and list) of a batch along dim 0 into ``parts`` equal chunks."""
    sizes = {k: len(v) for k, v in batch.items() if isinstance(v, (torch.Tensor, list))}
    n = next(iter(sizes.values()))
    if any(s != n for s in sizes.values()):
        raise ValueError(f"batch fields have different lengths: {sizes}")
    if n % parts:
        raise ValueError(f"a batch of {n} rows cannot be split evenly across {parts} data-parallel ranks")
    step = n // parts
    return [{k: (v[i * step:(i + 1) * step] if k in sizes else v) for k, v in batch.items()} for i in range(parts)]


def concat_batches(parts: list[Batch]) -> Batch:
    """Inverse of ``split_batch`` for tensors and lists; other values are taken from the first part."""
    out: Batch = {}
    for key, first in parts[0].items():
        if isinstance(first, torch.Tensor):
            out[key] = torch.cat([p[key] for p in parts], dim=0)
        elif isinstance(first, list):
            out[key] = [x for p in parts for x in p[key]]
        else:
            out[key] = first
    return out


class ResourceError(RuntimeError):
    """The cluster cannot hold the run's rank workers."""


def check_resources(*, device: str, world: int, available: dict[str, float], per_rank_cpus: int = 1) -> None:
    """Raise ``ResourceError`` naming both numbers when ``available`` cannot hold ``world`` ranks of
    ``per_rank_cpus`` CPUs each (what each asks Ray for: ``worker.core.devices.rank_resources``; GPUs first)."""
    wanted = run_resources(device, world, per_rank_cpus)
    for name in sorted(wanted, key=lambda n: n != GPU):
        have, need = available.get(name, 0.0), wanted[name]
        if have < need:
            raise ResourceError(
                f"Total available {name}s {have:g} is less than total desired {name}s {need:g} "
                f"(trainer.nnodes x trainer.n_gpus_per_node = {world} ranks on {device})"
            )
