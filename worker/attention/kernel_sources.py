"""Where a FlashAttention kernel comes from, as transformers 5.24 decides it (``modeling_utils.py``
``_check_and_adjust_attn_implementation``, ``modeling_flash_attention_utils.py``), and the head-dim limits.

- The ``flash_attn`` package (``flash-attn-3`` for FA3) when installed: its version.
- Without it, with ``kernels`` installed (``is_kernels_available``: 0.18.2 <= version < 0.19.0) and not on an NPU,
  transformers swaps ``flash_attention_N`` for a Hub kernel (``FLASH_ATTN_KERNEL_FALLBACK``) with only a warning,
  "You do not have `flash_attn` installed, using `kernels-community/flash-attn2` from the `kernels` library
  instead!", fetched from the Hub at load (its major version from ``FLASH_ATTN_KERNEL_VERSIONS``). On an offline
  node the fetch fails and transformers re-raises the package check: the user reads "the package for
  FlashAttention2 doesn't seem to be installed", not that the Hub was out of reach.
- On Ascend NPU ``flash_attention_2`` maps to torch_npu's fusion attention (no package, no Hub).
- FlashAttention refuses head dims above 256 ("FlashAttention forward only supports head dimension at most 256",
  verl #7131, Gemma-4's global layers); SDPA with GQA and head dim above 256 is not given ``enable_gqa``
  (``integrations/sdpa_attention.py``: ``use_gqa_in_sdpa``) and drops to the math kernel (transformers #46960).

Pure: an ``Environment`` in, facts out; ``worker.attention.availability`` and ``resolution`` turn them into
rule ids.
"""

from __future__ import annotations

from dataclasses import dataclass

from worker.attention.messages import flash_attn_not_installed
from worker.core.environment import Environment

TRANSFORMERS_SOURCE = "transformers 5.24"
KERNELS_RANGE = ("0.18.2", "0.19.0")  # transformers 5.24 KERNELS_MIN_VERSION <= kernels < KERNELS_MAX_VERSION
HUB_FLASH_KERNELS: dict[str, str] = {
    "flash_attention_2": "kernels-community/flash-attn2",
    "flash_attention_3": "kernels-community/vllm-flash-attn3",
    "flash_attention_4": "kernels-community/flash-attn4",
}
"""``FLASH_ATTN_KERNEL_FALLBACK`` (CUDA; ROCm takes kernels-community/aiter-flash-attn)."""
MAX_FLASH_HEAD_DIM = 256
FLASH_HEAD_DIM_ERROR = "FlashAttention forward only supports head dimension at most 256"
SDPA_GQA_COMMENT = ("CUDA and Ascend NPU require no mask and supported head dims to avoid falling back to the math "
                    "kernel.")
"""transformers 5.24's own words above ``use_gqa_in_sdpa``'s ``key.shape[-1] == value.shape[-1] <= 256``."""


def fallback_warning(repo: str) -> str:
    return f"You do not have `flash_attn` installed, using `{repo}` from the `kernels` library instead!"


def _version(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split("."):
        digits = "".join(c for c in piece if c.isdigit()) if piece[:1].isdigit() else ""
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def hub_kernel_version(repo: str, torch_version: str) -> int:
    """``FLASH_ATTN_KERNEL_VERSIONS``: the kernel repo's major version transformers asks the Hub for."""
    if repo == "kernels-community/flash-attn2":
        return 4 if _version(torch_version) >= (2, 10) else 3
    return {"kernels-community/vllm-flash-attn3": 1, "kernels-community/flash-attn4": 0}.get(repo, 0)


def kernels_usable(env: Environment) -> bool:
    """``is_kernels_available()`` on the node: installed, and its version in the range transformers accepts
    (an unknown version counts as usable)."""
    if not env.kernels_installed:
        return False
    if env.kernels_version is None:
        return True
    low, high = (_version(v) for v in KERNELS_RANGE)
    return low <= _version(env.kernels_version) < high


@dataclass(frozen=True)
class KernelSource:
    """Where ``implementation``'s kernel comes from on a node."""

    implementation: str
    origin: str  # "package" | "hub" | "npu" | "missing"
    detail: str  # "flash_attn 2.8.3", "kernels-community/flash-attn2 version 4 from the Hub", ...
    text: str  # one sentence for the preview
    offline_error: str | None = None  # the Hub is out of reach: what transformers raises then
    remedy: str | None = None

    def to_dict(self) -> dict[str, str | None]:
        return {"implementation": self.implementation, "origin": self.origin, "detail": self.detail,
                "text": self.text, "offline_error": self.offline_error, "remedy": self.remedy}


def flash_kernel_source(name: str, env: Environment) -> KernelSource | None:
    """Where ``flash_attention_2/3/4`` would come from on ``env``; None for another implementation."""
    if name not in HUB_FLASH_KERNELS:
        return None
    version = int(name[-1])
    if env.device == "npu" and version == 2:
        return KernelSource(name, "npu", "torch_npu fusion attention",
                            f"on Ascend NPU {TRANSFORMERS_SOURCE} maps {name} to torch_npu's fusion attention: no "
                            f"flash-attn package and no Hub kernel are used.")
    package = {2: ("flash_attn", env.flash_attn_version), 3: ("flash_attn_3", env.flash_attn_3_version)}.get(version)
    if package is not None and package[1] is not None:
        return KernelSource(name, "package", f"{package[0]} {package[1]}",
                            f"{name} runs the installed {package[0]} package, version {package[1]}.")
    if env.device != "cuda" or not kernels_usable(env):
        kernels = "not installed" if not env.kernels_installed else f"outside {' to '.join(KERNELS_RANGE)}"
        hub = "" if env.device != "cuda" else f", and `kernels` is {kernels}"
        return KernelSource(name, "missing", "none",
                            f"{name} has no kernel here: no {package[0] if package else 'FlashAttention'} package{hub}.")
    repo = HUB_FLASH_KERNELS[name]
    major = hub_kernel_version(repo, env.torch_version)
    detail = f"{repo} version {major} from the Hub"
    text = (f"flash-attn is not installed and `kernels` is: {TRANSFORMERS_SOURCE} loads {repo} (version {major}) "
            f"from the Hugging Face Hub at load time, with only the warning \"{fallback_warning(repo)}\"")
    remedy = (f"install flash-attn on the node, or fetch the kernel once where the Hub is reachable into the HF cache "
              f"the node reads (python -c \"from kernels import get_kernel; get_kernel('{repo}', version={major})\" "
              f"with the same HF_HOME) and run with HF_HUB_OFFLINE=1, or choose sdpa")
    if env.hub_reachable is False:
        return KernelSource(name, "hub", detail,
                            text + "; this node cannot reach the Hub, so the fetch fails and transformers re-raises "
                                   "its package check, which names the package, not the Hub.",
                            offline_error=flash_attn_not_installed(version, env.transformers_major), remedy=remedy)
    reach = " (the Hub was reachable from the probe)" if env.hub_reachable else " (whether the Hub is reachable was not probed)"
    return KernelSource(name, "hub", detail, text + reach + ".", remedy=remedy)
