"""Probe a worker node: library versions, device, and which attention implementations really load and run.

``probe_environment()`` runs in the current process; ``probe_on_ray()`` runs it as a Ray task on a
worker node (the node that would run the ranks). The result's keys match ``worker.core.environment.Environment``
(see ``environment_fields``) plus ``implementations`` when a model folder is given.
"""

from __future__ import annotations

import importlib.metadata
import platform
import warnings
from pathlib import Path
from typing import Any

PROBED_IMPLEMENTATIONS = ("eager", "sdpa", "flash_attention_2", "flex_attention")
ENVIRONMENT_KEYS = ("device", "compute_capability", "gpu_name", "torch_version", "transformers_version",
                    "flash_attn_version", "flash_attn_3_version", "kernels_installed", "cuda_version", "driver_version",
                    "kernels_version", "sdpa_backends", "hub_reachable")
SDPA_BACKENDS = ("flash_attention", "efficient_attention", "cudnn_attention", "math")


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _driver_version() -> str | None:
    """The NVIDIA driver's version from ``nvidia-smi`` (torch does not expose it); None without one."""
    import shutil
    import subprocess

    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    first = out.strip().splitlines()
    return first[0].strip() if first else None


HUB_TIMEOUT_S = 3.0


def hub_reachable(timeout_s: float = HUB_TIMEOUT_S) -> bool:
    """Whether this node can reach the Hugging Face Hub, where `kernels` fetches a FlashAttention kernel when
    flash-attn is not installed: False under ``HF_HUB_OFFLINE``, else a TCP connection to the Hub's host
    (``HF_ENDPOINT``, default huggingface.co) within ``timeout_s``."""
    import os
    import socket
    from urllib.parse import urlsplit

    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return False
    endpoint = urlsplit(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = endpoint.hostname or "huggingface.co", endpoint.port or (80 if endpoint.scheme == "http" else 443)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def _device_facts() -> dict[str, Any]:
    import torch

    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability(0)
        return {"device": "cuda", "compute_capability": [major, minor], "gpu_name": torch.cuda.get_device_name(0),
                "cuda_version": torch.version.cuda, "driver_version": _driver_version()}
    if hasattr(torch, "npu") and torch.npu.is_available():  # torch_npu registers torch.npu
        return {"device": "npu", "compute_capability": None, "gpu_name": None, "cuda_version": None,
                "driver_version": None}
    return {"device": "cpu", "compute_capability": None, "gpu_name": None, "cuda_version": None,
            "driver_version": None}


def sdpa_backends(device: str) -> dict[str, dict[str, Any]]:
    """Which SDPA backends this device runs: per backend, whether torch's switch enables it and whether a
    small causal call forced onto it (``torch.nn.attention.sdpa_kernel``) runs, in the dtype the fused
    kernels want there (bf16 on CUDA, fp32 on CPU), with the error where it does not.

    -> ``{"flash_attention": {"enabled": True, "runs": True}, "efficient_attention": {"enabled": True,
    "runs": False, "error": "RuntimeError: No available kernel. ..."}, ...}``"""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from worker.engine.sdpa import SWITCHES

    members = {"flash_attention": SDPBackend.FLASH_ATTENTION, "efficient_attention": SDPBackend.EFFICIENT_ATTENTION,
               "cudnn_attention": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    out: dict[str, dict[str, Any]] = {}
    for name in SDPA_BACKENDS:
        entry: dict[str, Any] = {"enabled": bool(getattr(torch.backends.cuda, SWITCHES[name])())}
        try:
            q = torch.randn(1, 2, 16, 64, dtype=dtype, device=device)  # (B, nh, T, hs)
            with sdpa_kernel(members[name]), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # torch warns per refused backend; the answer already says it
                F.scaled_dot_product_attention(q, q, q, is_causal=True)
            entry["runs"] = True
        except RuntimeError as exc:
            entry["runs"] = False
            entry["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0]}"
        out[name] = entry
    return out


def try_implementations(model_folder: str | Path, implementations: tuple[str, ...] = PROBED_IMPLEMENTATIONS) -> dict[str, Any]:
    """Load the folder's causal LM with each implementation and run a 1x8 forward.

    -> ``{impl: {"ok": True, "observed": kernel}}`` or ``{impl: {"ok": False, "error": "Type: message"}}``.
    Each attempt gets a fresh config (a failed load mutates the one it was given).
    """
    import torch

    from worker.engine import models
    from worker.engine.observe import observe_attention

    device = _device_facts()["device"]
    results: dict[str, Any] = {}
    for impl in implementations:
        try:
            config = models.build_config(model_folder, {}, impl)
            model = models.load_causal_lm(model_folder, config)
            if device == "cuda":
                model = model.to("cuda")
            ids = (torch.arange(8) % max(config.vocab_size - 1, 1) + 1)[None, :].to(model.device)  # (1, 8)
            with observe_attention() as seen, torch.no_grad():
                model(input_ids=ids)
            results[impl] = {"ok": True, "observed": seen.kernel}
            if seen.sdpa.records:  # the kernel below sdpa: which backend, and why where it was math
                found = seen.as_dict()
                results[impl].update(sdpa_backend=found["sdpa_backend"], sdpa_backend_reason=found["sdpa_backend_reason"])
        except Exception as exc:
            results[impl] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    return results


def probe_environment(model_folder: str | Path | None = None) -> dict[str, Any]:
    """What decides attention on this node; with ``model_folder``, which implementations load and run."""
    import torch
    import transformers

    facts = _device_facts()
    backends = sdpa_backends(facts["device"]) if facts["device"] in ("cpu", "cuda") else {}
    out: dict[str, Any] = {
        "torch_version": torch.__version__.split("+", 1)[0],
        "transformers_version": transformers.__version__,
        "flash_attn_version": _version("flash-attn") or _version("flash_attn"),
        "flash_attn_3_version": _version("flash-attn-3") or _version("flash_attn_3"),
        "kernels_installed": _version("kernels") is not None,
        "kernels_version": _version("kernels"),
        "hub_reachable": hub_reachable(),
        **facts,
        "sdpa_backends": [name for name, b in backends.items() if b["enabled"] and b["runs"]],
        "sdpa_backend_checks": backends,
        "hostname": platform.node(),
        "python_version": platform.python_version(),
    }
    if model_folder is not None:
        out["model_folder"] = str(model_folder)
        out["implementations"] = try_implementations(model_folder)
    return out


def environment_fields(probe: dict[str, Any], name: str = "probe") -> dict[str, Any]:
    """The subset of a probe that ``Environment.from_dict`` takes."""
    return {"name": name, **{k: probe.get(k) for k in ENVIRONMENT_KEYS}}


def probe_on_ray(model_folder: str | Path | None = None, *, num_gpus: float = 0, timeout_s: float = 300) -> dict[str, Any]:
    """Run ``probe_environment`` as a Ray task on a worker node (GPU nodes: pass ``num_gpus=1``)."""
    import ray

    task = ray.remote(num_cpus=1, num_gpus=num_gpus)(probe_environment)
    return ray.get(task.remote(str(model_folder) if model_folder else None), timeout=timeout_s)
