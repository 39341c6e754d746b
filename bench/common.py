"""What every benchmark shares: the machine it ran on, a local Ray on loopback, and writing its result.

Benchmarks print their figures and write ``bench/results/<name>.md``; each file starts with the date,
the machine (with its load: this is a shared machine) and the command, so a figure can be traced.
"""

from __future__ import annotations

import asyncio
import os
import platform
from collections.abc import Coroutine, Iterator
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


# --------------------------------------------------------------------------------------------
# Load clients (asyncio, raw kept-alive HTTP/1.1 connections) and the processes they measure


async def read_head(reader: asyncio.StreamReader) -> tuple[int, dict[bytes, bytes]]:
    """An HTTP/1.1 response's status and headers (names lowercased)."""
    head = await reader.readuntil(b"\r\n\r\n")
    status_line, _, header_block = head.partition(b"\r\n")
    headers = {}
    for line in header_block.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name:
            headers[name.strip().lower()] = value.strip()
    return int(status_line.split(b" ", 2)[1]), headers


async def http_get(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str, path: str,
                   accept: str = "application/json") -> bytes:
    """One GET on a kept-alive HTTP/1.1 connection; the whole ``Content-Length`` body is read and returned.
    Anything but 200 raises."""
    writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nAccept: {accept}\r\n\r\n".encode())
    status, headers = await read_head(reader)
    if b"content-length" not in headers:
        raise RuntimeError(f"GET {path}: no Content-Length in {headers}")
    body = await reader.readexactly(int(headers[b"content-length"]))
    if status != 200:
        raise RuntimeError(f"GET {path}: {status} {body[:300]!r}")
    return body


def run_async(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run a client process's event loop: uvloop where installed (the standard loop is slower)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def proc_cpu_rss(pid: int) -> tuple[float, float]:
    """(user + system CPU seconds, resident MiB) of a live process, from Linux /proc; (0.0, 0.0) without."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0, 0.0
    return ((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"),
            int(fields[21]) * os.sysconf("SC_PAGE_SIZE") / 2**20)
