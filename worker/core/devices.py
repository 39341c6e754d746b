"""Devices and what a rank asks Ray for, in one place. Pure.

A node's device (``Environment.device``, the preview's targets) is one of ``DEVICES``; attnboard's engine
runs ranks on ``ENGINE_DEVICES``. Each rank asks Ray for 1 CPU, plus 1 GPU off CPU: the rank actors
(``worker.engine.ranks``), the warm pool, the controller's fit check and the app's queue
(``app.services.ray_launcher``) all read ``rank_resources``.
"""

from __future__ import annotations

DEVICES: tuple[str, ...] = ("cpu", "cuda", "npu")
"""A node's device."""
ENGINE_DEVICES: tuple[str, ...] = ("cpu", "cuda")
"""Where attnboard's engine runs ranks (warm ranks included)."""

CPU, GPU = "CPU", "GPU"
"""Ray's resource names."""
_OPTION = {CPU: "num_cpus", GPU: "num_gpus"}


def rank_resources(device: str) -> dict[str, float]:
    """What one rank asks Ray for, by Ray's resource names: ``{"CPU": 1}`` on CPU, ``{"CPU": 1, "GPU": 1}`` off it.

    >>> rank_resources("cpu"), rank_resources("cuda")
    ({'CPU': 1.0}, {'CPU': 1.0, 'GPU': 1.0})
    """
    return {CPU: 1.0} if device == "cpu" else {CPU: 1.0, GPU: 1.0}


def run_resources(device: str, world: int) -> dict[str, float]:
    """What a run of ``world`` ranks asks Ray for.

    >>> run_resources("cuda", 4)
    {'CPU': 4.0, 'GPU': 4.0}
    """
    return {name: amount * world for name, amount in rank_resources(device).items()}


def actor_options(device: str) -> dict[str, float]:
    """``rank_resources`` as ``ray.remote(...).options`` keywords: ``{"num_cpus": 1, "num_gpus": 1}``."""
    return {_OPTION[name]: amount for name, amount in rank_resources(device).items()}
