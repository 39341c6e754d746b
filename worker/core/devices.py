"""Devices, and what a rank asks Ray for and how many torch threads it runs, in one place. Pure: the app
imports this without torch or Ray.

A node's device (``Environment.device``, the preview's targets) is one of ``DEVICES``; attnboard's engine
runs ranks on ``ENGINE_DEVICES``. The rank actors (``worker.engine.ranks``), the warm pool, the trainer's fit
check and the app's queue (``app.services.ray_launcher``) all read ``rank_cpus`` and ``rank_resources``.

A rank runs ``torch.set_num_threads(cpus)`` on the CPUs it holds, so a rank on a 2-core node alone uses
both cores and two ranks there use one each. ``attnboard.rank_cpus`` sets ``cpus``; 0 (the default)
derives it from the cluster: on ``cpu``, the CPUs of the cluster shared among the run's ranks (on the
embedded head, one node: its CPUs divided by the world size), never more than the smallest node has and
at least 1; off CPU (the accelerator does the work), 1.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

DEVICES: tuple[str, ...] = ("cpu", "cuda", "npu")
"""A node's device."""
ENGINE_DEVICES: tuple[str, ...] = ("cpu", "cuda")
"""Where attnboard's engine runs ranks (warm ranks included)."""

CPU, GPU = "CPU", "GPU"
"""Ray's resource names."""
_OPTION = {CPU: "num_cpus", GPU: "num_gpus"}


@dataclass(frozen=True)
class Cluster:
    """What the CPU derivation reads of a Ray cluster: its CPUs in all and those of its smallest node."""

    total_cpus: float
    node_cpus: float

    @classmethod
    def of_nodes(cls, nodes: Iterable[Mapping[str, Any]]) -> Cluster:
        """From ``ray.nodes()``: the alive nodes' ``Resources["CPU"]``; no node with CPUs -> 0 CPUs."""
        cpus = [float(n.get("Resources", {}).get("CPU", 0.0)) for n in nodes if n.get("Alive", True)]
        cpus = [c for c in cpus if c > 0]
        return cls(sum(cpus), min(cpus) if cpus else 0.0)


def rank_cpus(setting: int, *, device: str, world: int, cluster: Cluster, free_cpus: float | None = None) -> int:
    """The CPUs each of a run's ``world`` ranks asks Ray for (and its torch threads); any device but ``cpu``
    is an accelerator (1 CPU derived).

    >>> two_cores = Cluster(total_cpus=2, node_cpus=2)
    >>> rank_cpus(0, device="cpu", world=1, cluster=two_cores), rank_cpus(0, device="cpu", world=2, cluster=two_cores)
    (2, 1)
    >>> rank_cpus(0, device="cuda", world=1, cluster=two_cores), rank_cpus(3, device="cpu", world=2, cluster=two_cores)
    (1, 3)

    ``free_cpus`` (the engine at launch): a derived count shrinks to the CPUs free now, at least 1 per rank;
    a set one does not (the run waits for it).
    """
    if setting < 0:
        raise ValueError(f"attnboard.rank_cpus: {setting} is negative; valid: 0 (derived from the cluster) or more")
    if setting > 0:
        return setting
    if device != "cpu":
        return 1
    share = min(int(cluster.total_cpus // max(world, 1)), int(cluster.node_cpus))
    if free_cpus is not None:  # derived at launch: what is free now (others may hold CPUs the queue did not count)
        share = min(share, int(free_cpus // max(world, 1)))
    return max(1, share)


def rank_resources(device: str, cpus: int = 1) -> dict[str, float]:
    """What one rank asks Ray for, by Ray's resource names: ``cpus`` CPUs, plus 1 GPU off CPU.

    >>> rank_resources("cpu"), rank_resources("cuda"), rank_resources("cpu", 2)
    ({'CPU': 1.0}, {'CPU': 1.0, 'GPU': 1.0}, {'CPU': 2.0})
    """
    return {CPU: float(cpus)} if device == "cpu" else {CPU: float(cpus), GPU: 1.0}


def run_resources(device: str, world: int, cpus: int = 1) -> dict[str, float]:
    """What a run of ``world`` ranks of ``cpus`` CPUs each asks Ray for.

    >>> run_resources("cuda", 4), run_resources("cpu", 2, 1)
    ({'CPU': 4.0, 'GPU': 4.0}, {'CPU': 2.0})
    """
    return {name: amount * world for name, amount in rank_resources(device, cpus).items()}


def actor_options(device: str, cpus: int = 1) -> dict[str, float]:
    """``rank_resources`` as ``ray.remote(...).options`` keywords: ``{"num_cpus": 1, "num_gpus": 1}``."""
    return {_OPTION[name]: amount for name, amount in rank_resources(device, cpus).items()}
