"""Which SDPA backend really ran: ``sdpa`` is a dispatcher, not a kernel.

``torch.nn.functional.scaled_dot_product_attention`` picks a backend per call from its inputs: on CUDA
FlashAttention (torch's own build of it), memory-efficient, cuDNN or math; on CPU the fused
flash-for-CPU kernel or math. Math is the slow, memory-hungry composite (a full attention matrix), and
torch falls to it without a word when the fused kernels refuse the inputs: an fp32 input on CUDA flash,
an arbitrary mask, a head dim, dropout, a backend switched off.

``SdpaRecorder`` sees every SDPA call inside a block (a ``torch.overrides.TorchFunctionMode``), runs the
first call of each input signature under ``torch.profiler`` and names the backend from the aten op that
ran (``BACKEND_OPS``). Where it was math, ``math_reason`` says why, from the inputs it can see (dtype,
mask, head dims, dropout, device, the backend switches), on CUDA with torch's own words from
``torch.backends.cuda.can_use_*(params, debug=True)``.

``backend_of``, ``SdpaInputs.signature`` and ``math_reason`` are pure; the recorder is the I/O edge.
"""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

BACKEND_OPS: dict[str, str] = {
    "aten::_scaled_dot_product_flash_attention_for_cpu": "flash_attention",
    "aten::_scaled_dot_product_flash_attention": "flash_attention",
    "aten::_scaled_dot_product_efficient_attention": "efficient_attention",
    "aten::_scaled_dot_product_cudnn_attention": "cudnn_attention",
    "aten::_scaled_dot_product_fused_attention_overrideable": "overrideable",
    "aten::_scaled_dot_product_attention_math": "math",
    "aten::_scaled_dot_product_attention_math_for_mps": "math",
}
"""The aten op an SDPA call dispatches to -> the backend (``torch.nn.attention.SDPBackend``'s names, lower case)."""

FUSED = ("flash_attention", "efficient_attention", "cudnn_attention")
SWITCHES = {"flash_attention": "flash_sdp_enabled", "efficient_attention": "mem_efficient_sdp_enabled",
            "cudnn_attention": "cudnn_sdp_enabled", "math": "math_sdp_enabled"}
"""Backend -> its ``torch.backends.cuda`` switch (``sdpa_kernel`` flips them; on CPU the flash switch
governs the flash-for-CPU kernel too)."""

CPU_FLASH_DTYPES = ("float32", "float64", "bfloat16", "float16")
CUDA_FUSED_DTYPES = ("bfloat16", "float16")


def backend_of(op_names: list[str] | set[str]) -> tuple[str | None, str | None]:
    """The aten ops seen during one SDPA call -> (backend, the op that names it); a fused op wins over math
    (the math composite never runs beside a fused kernel). (None, None) when no SDPA op was seen."""
    found = [(BACKEND_OPS[name], name) for name in op_names if name in BACKEND_OPS]
    for backend, name in sorted(found, key=lambda pair: pair[0] == "math"):
        return backend, name
    return None, None


@dataclass(frozen=True)
class SdpaInputs:
    """What the dispatcher decides on, as one SDPA call received it."""

    device: str
    dtype: str
    dims: int  # query.dim(): 4 for (batch, heads, sequence, head dim)
    q_heads: int
    kv_heads: int
    q_len: int
    kv_len: int
    head_dim: int
    v_head_dim: int
    mask: str | None  # None, or the mask's dtype ("bool", "float32", ...)
    dropout: float
    is_causal: bool
    enable_gqa: bool
    last_dim_contiguous: bool
    enabled: tuple[str, ...]  # backends the torch.backends switches allowed at the call
    capability: tuple[int, int] | None = None  # CUDA compute capability

    @property
    def signature(self) -> tuple:
        """Calls with the same signature dispatch alike (sequence lengths aside from decode's single query)."""
        return (self.device, self.dtype, self.dims, self.q_heads == self.kv_heads, self.head_dim, self.v_head_dim,
                self.mask, self.dropout > 0, self.is_causal, self.enable_gqa, self.q_len == 1,
                self.last_dim_contiguous, self.enabled)

    def summary(self) -> str:
        """``bfloat16 cuda, head dim 64, no mask, causal``."""
        mask = "no mask" if self.mask is None else f"{self.mask} mask"
        extra = "".join([", causal" if self.is_causal else "", f", dropout {self.dropout:g}" if self.dropout else "",
                         f", GQA {self.q_heads}/{self.kv_heads} heads" if self.enable_gqa else ""])
        return f"{self.dtype} {self.device}, head dim {self.head_dim}, {mask}{extra}"

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["enabled"] = list(self.enabled)
        out["capability"] = list(self.capability) if self.capability else None
        return out

    @classmethod
    def of(cls, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None = None,
           dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
           enable_gqa: bool = False) -> SdpaInputs:
        """From ``scaled_dot_product_attention``'s own arguments (and the backend switches now)."""
        def heads(t: torch.Tensor) -> int:
            return int(t.shape[-3]) if t.dim() >= 3 else 1

        capability = None
        if query.device.type == "cuda":
            capability = tuple(torch.cuda.get_device_capability(query.device))
        return cls(
            device=query.device.type, dtype=str(query.dtype).removeprefix("torch."), dims=query.dim(),
            q_heads=heads(query), kv_heads=heads(key), q_len=int(query.shape[-2]), kv_len=int(key.shape[-2]),
            head_dim=int(query.shape[-1]), v_head_dim=int(value.shape[-1]),
            mask=None if attn_mask is None else str(attn_mask.dtype).removeprefix("torch."),
            dropout=float(dropout_p), is_causal=bool(is_causal), enable_gqa=bool(enable_gqa),
            last_dim_contiguous=all(t.stride(-1) == 1 for t in (query, key, value)),
            enabled=enabled_backends(), capability=capability,
        )


def enabled_backends() -> tuple[str, ...]:
    """The SDPA backends ``torch.backends.cuda``'s switches allow right now (``sdpa_kernel`` sets them)."""
    return tuple(name for name, switch in SWITCHES.items() if getattr(torch.backends.cuda, switch)())


# --------------------------------------------------------------------------------------------
# Why math (pure)


def _cpu_flash_refusals(x: SdpaInputs) -> list[str]:
    """torch's ``use_flash_attention_cpp`` gates, in its order, as far as the inputs show them."""
    out = []
    if "flash_attention" not in x.enabled:
        out.append("the flash backend is switched off (torch.nn.attention.sdpa_kernel or "
                   "torch.backends.cuda.enable_flash_sdp(False))")
    if x.dropout > 0:
        out.append(f"dropout_p={x.dropout:g}: the CPU flash kernel takes no dropout (attention_dropout in training)")
    if x.dims != 4:
        out.append(f"{x.dims}-D inputs: the CPU flash kernel takes (batch, heads, sequence, head dim)")
    if x.head_dim != x.v_head_dim:
        out.append(f"query/key head dim {x.head_dim} differs from value head dim {x.v_head_dim}: the CPU flash "
                   f"kernel needs them equal")
    if not x.last_dim_contiguous:
        out.append("a query, key or value whose last dimension is not contiguous (stride != 1)")
    if x.dtype not in CPU_FLASH_DTYPES:
        out.append(f"{x.dtype} inputs: the CPU flash kernel takes {', '.join(CPU_FLASH_DTYPES)}")
    return out


def _cuda_refusals(x: SdpaInputs) -> dict[str, list[str]]:
    """Per fused CUDA backend, the refusals the inputs show (torch's ``sdp_utils.cpp`` gates that hold
    across recent torch versions; ``math_reason`` adds torch's own words for the rest)."""
    out: dict[str, list[str]] = {name: [] for name in FUSED}
    for name in FUSED:
        if name not in x.enabled:
            out[name].append("switched off (torch.nn.attention.sdpa_kernel or torch.backends.cuda.enable_*_sdp(False))")
    if x.dtype not in CUDA_FUSED_DTYPES:
        for name in ("flash_attention", "cudnn_attention"):
            out[name].append(f"{x.dtype} inputs (it takes only fp16/bf16)")
    if x.mask is not None:
        out["flash_attention"].append("an attention mask (it takes none, only is_causal)")
    if x.head_dim > 256 or x.head_dim % 8:
        out["flash_attention"].append(f"head dim {x.head_dim} (it needs a multiple of 8, at most 256)")
    if x.capability is not None and x.capability < (8, 0):
        cc = f"sm{x.capability[0]}{x.capability[1]}"
        for name in ("flash_attention", "cudnn_attention"):
            out[name].append(f"compute capability {cc} (it needs sm80 or newer)")
    if x.dropout > 0:
        out["cudnn_attention"].append(f"dropout_p={x.dropout:g}")
    if x.head_dim != x.v_head_dim:
        out["flash_attention"].append(f"value head dim {x.v_head_dim} differs from head dim {x.head_dim}")
    return out


def math_reason(x: SdpaInputs, torch_words: dict[str, list[str]] | None = None) -> str:
    """Why the dispatcher fell to math for these inputs, in one sentence naming each refusal.

    ``torch_words``: per fused backend, the warnings ``torch.backends.cuda.can_use_*(params, debug=True)``
    gave (CUDA only); they are quoted where the inputs alone do not explain the refusal.
    """
    if x.device == "cpu":
        found = _cpu_flash_refusals(x)
        if not found:
            return (f"the CPU flash kernel refused {x.summary()} for a reason these inputs do not show "
                    f"(e.g. the mask's shape)")
        return "flash_attention (CPU): " + "; ".join(found)
    torch_words = torch_words or {}
    parts = []
    for name, reasons in _cuda_refusals(x).items():
        words = [w for w in torch_words.get(name, []) if w]
        if not reasons and words:
            reasons = [f'torch: "{words[0]}"']
        parts.append(f"{name}: {', '.join(reasons) if reasons else 'refused for a reason the inputs do not show'}")
    return "; ".join(parts)


def torch_refusals(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None,
                   dropout_p: float, is_causal: bool, enable_gqa: bool) -> dict[str, list[str]]:
    """On CUDA: the warnings torch's own checks give for each fused backend (its exact words)."""
    checks = {"flash_attention": "can_use_flash_attention", "efficient_attention": "can_use_efficient_attention",
              "cudnn_attention": "can_use_cudnn_attention"}
    out: dict[str, list[str]] = {}
    try:
        params = torch.backends.cuda.SDPAParams(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)
    except Exception:
        return out
    for name, check in checks.items():
        fn = getattr(torch.backends.cuda, check, None)
        if fn is None:
            continue
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            try:
                fn(params, True)
            except Exception as exc:
                out[name] = [f"{type(exc).__name__}: {exc}"]
                continue
        out[name] = [str(w.message).splitlines()[0] for w in said]
    return out


# --------------------------------------------------------------------------------------------
# The recorder (I/O edge: the profiler)


@dataclass
class SdpaRecord:
    """One input signature: the backend its first call ran, how many calls had it, why math where math."""

    inputs: SdpaInputs
    backend: str | None
    op: str | None
    calls: int = 1
    reason: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "op": self.op, "calls": self.calls, "reason": self.reason,
                "inputs": self.inputs.summary()}


class SdpaRecorder(TorchFunctionMode):
    """Inside ``with SdpaRecorder() as rec:``, every SDPA call is counted per input signature and the first of
    each signature is profiled to name its backend. Other torch calls pass straight through."""

    def __init__(self) -> None:
        super().__init__()
        self.records: dict[tuple, SdpaRecord] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention:
            return func(*args, **kwargs)
        inputs = SdpaInputs.of(*args, **kwargs)
        record = self.records.get(inputs.signature)
        if record is not None:
            record.calls += 1
            return func(*args, **kwargs)
        out, ops, failure = _profiled(func, args, kwargs)
        backend, op = backend_of(ops)
        reason = None
        if backend == "math":
            words = torch_refusals(*_bound(args, kwargs)) if inputs.device == "cuda" else None
            reason = math_reason(inputs, words)
        elif failure is not None:
            reason = f"the backend could not be observed: {failure}"
        self.records[inputs.signature] = SdpaRecord(inputs, backend, op, reason=reason)
        return out

    def as_dict(self) -> dict[str, Any]:
        """``sdpa_backend``: the backend of most calls (None when no SDPA call ran); ``sdpa_backend_reason``:
        why math, where a signature ran math; ``sdpa``: every signature's record."""
        records = list(self.records.values())
        calls: dict[str | None, int] = {}
        for r in records:
            calls[r.backend] = calls.get(r.backend, 0) + r.calls
        backend = max(calls, key=lambda b: calls[b]) if calls else None  # first seen wins a tie
        reason = next((r.reason for r in records if r.backend == "math"), None)
        return {"sdpa_backend": backend, "sdpa_backend_reason": reason, "sdpa": [r.as_dict() for r in records]}


def _bound(args: tuple, kwargs: dict[str, Any]) -> tuple:
    """SDPA's arguments by position: (query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)."""
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
    defaults = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None, "enable_gqa": False}
    given = {**defaults, **dict(zip(names, args, strict=False)), **kwargs}
    return (given["query"], given["key"], given["value"], given["attn_mask"], float(given["dropout_p"]),
            bool(given["is_causal"]), bool(given["enable_gqa"]))


def _profiled(func, args: tuple, kwargs: dict[str, Any]) -> tuple[Any, set[str], str | None]:
    """Run one SDPA call under ``torch.profiler`` -> (its output, the op names seen, why not observed)."""
    from torch.profiler import ProfilerActivity, profile

    try:
        prof = profile(activities=[ProfilerActivity.CPU])  # op dispatch is recorded on the host, CUDA included
        prof.__enter__()
    except Exception as exc:
        return func(*args, **kwargs), set(), f"{type(exc).__name__}: {exc}"
    try:
        out = func(*args, **kwargs)
    finally:
        prof.__exit__(None, None, None)
    return out, {event.name for event in prof.events()}, None
