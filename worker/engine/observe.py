"""Which attention kernel really ran: count calls through transformers' attention dispatch.

transformers 5.x picks the attention function at call time: ``ALL_ATTENTION_FUNCTIONS.get_interface(
config._attn_implementation, eager_attention_forward)``, where ``eager_attention_forward`` is a global of
each ``modeling_<arch>.py``. ``observe_attention()`` wraps every entry of the attention registry and every
loaded modeling module's ``eager_attention_forward`` with a counter, and restores them on exit, so a
forward run inside the block tells which implementation was actually called, and how often.

Below the implementation, the kernel: ``sdpa`` is a dispatcher, so the block also records which SDPA
backend each call ran (flash, memory-efficient, cuDNN, math; on CPU flash-for-CPU or math) and, where it
was math, why (``worker.engine.sdpa``).
"""

from __future__ import annotations

import functools
import importlib.metadata
import re
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface

from worker.attention.kernel_sources import HUB_FLASH_KERNELS
from worker.core.implementations import base_impl, is_hub_kernel
from worker.engine.sdpa import SdpaRecorder

WRAPPER_PREFIX = "ulysses_"
"""Registered wrappers (Ulysses) that call a base kernel; they are counted apart from kernels."""

_LOCK = threading.Lock()


@dataclass
class AttentionObservation:
    """Calls per implementation name seen inside one ``observe_attention()`` block."""

    calls: Counter = field(default_factory=Counter)
    sdpa: SdpaRecorder = field(default_factory=SdpaRecorder)

    @property
    def kernel_calls(self) -> dict[str, int]:
        """Calls of real kernels (eager, sdpa, flash_attention_2, ...), wrappers left out."""
        return {k: v for k, v in self.calls.items() if not k.startswith(WRAPPER_PREFIX)}

    @property
    def wrapper_calls(self) -> dict[str, int]:
        return {k: v for k, v in self.calls.items() if k.startswith(WRAPPER_PREFIX)}

    @property
    def kernel(self) -> str | None:
        """The kernel called most; None when no attention ran (or several tied for first, see ``kernels``)."""
        kernels = self.kernel_calls
        if not kernels:
            return None
        return max(sorted(kernels), key=lambda k: kernels[k])

    @property
    def kernels(self) -> list[str]:
        return sorted(self.kernel_calls)

    def as_dict(self) -> dict:
        """observed, calls, wrappers; sdpa_backend, sdpa_backend_reason, sdpa (``SdpaRecorder.as_dict``)."""
        return {"observed": self.kernel, "calls": dict(self.kernel_calls), "wrappers": dict(self.wrapper_calls),
                **self.sdpa.as_dict()}


def _counting(name: str, fn: Callable, observation: AttentionObservation) -> Callable:
    @functools.wraps(fn)
    def counted(*args, **kwargs):
        observation.calls[name] += 1
        return fn(*args, **kwargs)

    counted.__attnboard_original__ = fn  # type: ignore[attr-defined]
    return counted


def _modeling_modules() -> list:
    return [
        module
        for name, module in list(sys.modules.items())
        if name.startswith("transformers.models.") and ".modeling_" in name and module is not None
        and callable(getattr(module, "eager_attention_forward", None))
    ]


@contextmanager
def observe_attention() -> Iterator[AttentionObservation]:
    """Count attention calls per implementation inside the block; every patched function is restored on exit.

    Not re-entrant across threads: one observation at a time per process (a lock enforces it).
    """
    observation = AttentionObservation()
    with _LOCK:
        saved_global = dict(AttentionInterface._global_mapping)
        saved_local = dict(ALL_ATTENTION_FUNCTIONS._local_mapping)
        saved_eager = {module: module.eager_attention_forward for module in _modeling_modules()}
        try:
            for name, fn in saved_global.items():
                AttentionInterface._global_mapping[name] = _counting(name, fn, observation)
            for name, fn in saved_local.items():
                ALL_ATTENTION_FUNCTIONS._local_mapping[name] = _counting(name, fn, observation)
            for module, fn in saved_eager.items():
                module.eager_attention_forward = _counting("eager", fn, observation)
            with observation.sdpa:
                yield observation
        finally:
            AttentionInterface._global_mapping.clear()
            AttentionInterface._global_mapping.update(saved_global)
            ALL_ATTENTION_FUNCTIONS._local_mapping.clear()
            ALL_ATTENTION_FUNCTIONS._local_mapping.update(saved_local)
            for module, fn in saved_eager.items():
                module.eager_attention_forward = fn


# ---------------------------------------------------------------------------------------------
# Where the FlashAttention kernel that loaded came from (``worker.attention.kernel_sources`` previews it)

_HUB_SNAPSHOT = re.compile(r"models--(?P<org>[^/\\]+?)--(?P<name>[^/\\]+)[/\\]snapshots[/\\](?P<rev>[0-9a-f]{7,64})")


def _hub_revision(repo: str) -> str | None:
    """The snapshot (commit) of ``repo`` that `kernels` imported, read from a loaded module's path in the HF cache."""
    org, _, name = repo.partition("/")
    for module in list(sys.modules.values()):
        match = _HUB_SNAPSHOT.search(str(getattr(module, "__file__", "") or ""))
        if match and (match["org"], match["name"]) == (org, name):
            return match["rev"]
    return None


def kernel_source(effective: str, config_attn_implementation: str | None, device: str) -> dict[str, str | None] | None:
    """Where the kernel of a loaded FlashAttention (or Hub kernel) came from: ``origin`` package | hub | npu,
    ``detail`` (``flash_attn 2.8.3``, ``kernels-community/flash-attn2@<revision>``); None for another one."""
    loaded = config_attn_implementation or effective
    if is_hub_kernel(loaded):  # asked for, or swapped in by transformers when flash-attn is missing
        repo = loaded.split("|")[-1].split(":")[0].split("@")[0].strip()
        revision = _hub_revision(repo)
        return {"origin": "hub", "repo": repo, "revision": revision, "detail": f"{repo}@{revision or 'unknown revision'}"}
    base = base_impl(effective)
    if base not in HUB_FLASH_KERNELS:
        return None
    if device == "npu" and base == "flash_attention_2":
        return {"origin": "npu", "repo": None, "revision": None, "detail": "torch_npu fusion attention"}
    package = {"flash_attention_2": ("flash_attn", ("flash-attn", "flash_attn")),
               "flash_attention_3": ("flash_attn_3", ("flash-attn-3", "flash_attn_3"))}.get(base)
    if package is None:
        return {"origin": "package", "repo": None, "revision": None, "detail": base}
    version = next((v for v in (_dist_version(d) for d in package[1]) if v), None)
    return {"origin": "package", "repo": None, "revision": version, "detail": f"{package[0]} {version or '?'}"}


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None
