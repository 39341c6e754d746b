"""The exact error texts transformers (4.x and 5.x) and the kernels raise when an attention
implementation cannot be used. The resolution preview quotes them so users recognise them later;
the troubleshooting classifier's tests feed them back in.

Sources: transformers 5.24 ``modeling_utils.py`` (``_flash_attn_import_error``,
``_flash_attn_can_dispatch``, ``_sdpa_can_dispatch``), ``integrations/hub_kernels.py``,
``integrations/sdpa_attention.py``; transformers 4.57 for the 4.x wording; flash-attn's kernels
(Dao-AILab/flash-attention at 0251105a, Aug 2026: ``csrc/flash_attn/flash_api.cpp`` for FA2,
``hopper/flash_api.cpp`` for FA3, ``flash_attn/cute/interface.py`` for FA4); torch's flex_attention.
See ../shared/ATTENTION_RULES.md.
"""

from __future__ import annotations

from worker.core.implementations import ULYSSES_BASES

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


FLASH_ATTN_DTYPE: dict[int, tuple[str, str]] = {
    2: ("RuntimeError", "FlashAttention only support fp16 and bf16 data type"),
    3: ("RuntimeError", "FlashAttention only supports fp16, bf16, and fp8_e4m3 data type"),
    4: ("AssertionError", "inputs must be float16, bfloat16, fp8 e4m3fn, or fp8 e5m2"),
}
"""FlashAttention ``version`` -> (exception type, message) its kernel raises at the first forward on an fp32
input: ``TORCH_CHECK`` in ``csrc/flash_attn/flash_api.cpp`` (FA2) and ``hopper/flash_api.cpp`` (FA3), an
``assert`` in ``flash_attn/cute/interface.py`` (FA4)."""


def flash_attn_dtype_warning(version: int, model_class: str, dtype: str = "torch.float32") -> str:
    """What transformers 5.24 only *logs* at load (``_flash_attn_can_dispatch``) for a model not in fp16/bf16;
    its typo "dype" included."""
    return (
        f"Flash Attention {version} only supports torch.float16 and torch.bfloat16 dtypes, but"
        f" the current dype in {model_class} is {dtype}. You should run training or inference using Automatic "
        "Mixed-Precision via the `with torch.autocast(device_type='torch_device'):` decorator,"
        ' or load the model with the `dtype` argument. Example: `model = AutoModel.from_pretrained("meta-llama/'
        f'Llama-3.2-1B", attn_implementation="flash_attention_{version}", dtype=torch.float16)`'
    )


def ulysses_kernel(name: str) -> str:
    """attnboard's own error when its sequence parallelism is asked to wrap a kernel it cannot (verl's can)."""
    return (f"attnboard's Ulysses sequence parallelism runs on {', '.join(ULYSSES_BASES)}, not {name!r} "
            f"(verl's own Ulysses runs flash_attention_2; attnboard's wrapper does not wrap it yet)")
