"""What every benchmark shares: the machine it ran on, a local Ray on loopback, and writing its result.

Benchmarks print their figures and write ``bench/results/<name>.md``; each file starts with the date,
the machine (with its load: this is a shared machine) and the command, so a figure can be traced.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


def machine() -> dict[str, Any]:
    """Host, CPU model, cores, GPU (None without CUDA), the 1-minute load, and the versions that matter."""
    import torch

    return {"host": platform.node(), "cpu": _cpu_model(), "cores": os.cpu_count(),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "load_1min": os.getloadavg()[0], "python": platform.python_version(), "torch": torch.__version__,
            "transformers": _version("transformers"), "trl": _version("trl")}


def load_text(load: tuple[float, ...]) -> str:
    """``1.2/0.9/0.7``: a load average (1, 5, 15 minutes)."""
    return "/".join(f"{x:.1f}" for x in load)


@contextmanager
def local_ray(num_cpus: int = 2) -> Iterator[None]:
    """A Ray of this process's own on 127.0.0.1 for the benchmark's runs, shut down afterwards."""
    import ray

    ray.init(num_cpus=num_cpus, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False,
             namespace="attnboard-bench")
    try:
        yield
    finally:
        ray.shutdown()


def write_result(out: Path, text: str) -> None:
    """Write a benchmark's result file (creating ``bench/results``) and say where."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text if text.endswith("\n") else text + "\n", encoding="utf-8")
    print(f"wrote {out}")
