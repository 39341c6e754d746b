"""The exact error texts transformers (4.x and 5.x) and the kernels raise when an attention
implementation cannot be used. The resolution preview quotes them so users recognise them later;
the troubleshooting classifier's tests feed them back in.

Sources: transformers 5.24 ``modeling_utils.py`` (``_flash_attn_import_error``,
``_flash_attn_can_dispatch``, ``_sdpa_can_dispatch``), ``integrations/hub_kernels.py``,
``integrations/sdpa_attention.py``; transformers 4.57 for the 4.x wording; flash-attn's CUDA kernel;
torch's flex_attention. See ../shared/ATTENTION_RULES.md.
"""

from __future__ import annotations

from worker.attention import ULYSSES_BASES

FA_DEVICES_5X = "('cuda', 'mlu', 'musa', 'npu', 'xpu')"


def _preface(version: int) -> str:
    return f"FlashAttention{version} has been toggled on, but it cannot be used due to the following error:"


def flash_attn_not_installed(version: int = 2, transformers_major: int = 5) -> str:
    if transformers_major >= 5:
        return f"{_preface(version)} the package for FlashAttention{version} doesn't seem to be installed."
    return (
        f"{_preface(version)} the package flash_attn seems to be not installed. Please refer to the documentation of "
        "https://huggingface.co/docs/transformers/perf_infer_gpu_one#flashattention-2 to install Flash Attention 2."
    )


def flash_attn_too_old(found: str, transformers_major: int = 5) -> str:
    if transformers_major >= 5:
        return f"{_preface(2)} FlashAttention2 requires at least version `2.3.3`."
    return (
        f"{_preface(2)} you need flash_attn package version to be greater or equal than 2.1.0. "
        f"Detected version {found}. Please refer to the documentation of "
        "https://huggingface.co/docs/transformers/perf_infer_gpu_one#flashattention-2 to install Flash Attention 2."
    )


def flash_attn_not_on_cpu(version: int = 2, transformers_major: int = 5) -> str:
    if transformers_major >= 5:
        return (
            f"{_preface(version)} FlashAttention{version} is not available on CPU. "
            f"Please make sure you are on any of the supported devices: {FA_DEVICES_5X}."
        )
    return f"{_preface(version)} Flash Attention 2 is not available on CPU. Please make sure torch can access a CUDA device."


def flash_attn_compute_capability(version: int, minimum: int, found: tuple[int, int]) -> str:
    return (
        f"{_preface(version)} FlashAttention{version} requires compute capability >= {minimum}, "
        f"but found {found} with compute capability {found[0]}.x"
    )


PRE_AMPERE = "FlashAttention only supports Ampere GPUs or newer."
"""Raised by the flash-attn CUDA kernel itself at the first forward on sm7x (T4, V100)."""


def architecture_without_flash_attn(model_class: str, version: int = 2, transformers_major: int = 5) -> str:
    if transformers_major >= 5:
        return f"{model_class} does not support Flash Attention {version} yet."
    return f"{model_class} does not support Flash Attention 2.0 yet."


def architecture_without_sdpa(model_class: str) -> str:
    return (
        f"{model_class} does not support an attention implementation through "
        "torch.nn.functional.scaled_dot_product_attention yet."
    )


KERNELS_MISSING = "`kernels` is either not installed or uses an incompatible version."
FLEX_BACKWARD_CPU = "FlexAttention does not support backward on CPU."
SDPA_OUTPUT_ATTENTIONS = "`sdpa` attention does not support `output_attentions=True`."


def unknown_implementation(name: str) -> str:
    return f'Specified `attn_implementation="{name}"` is not supported. The only possible arguments are ...'


def ulysses_kernel(name: str) -> str:
    """attnboard's own error when sequence parallelism is asked to wrap a kernel it cannot."""
    return f"Ulysses sequence parallelism runs on {', '.join(ULYSSES_BASES)}, not {name!r}"
