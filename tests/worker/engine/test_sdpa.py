"""The SDPA backend named from the aten ops that ran, and why it was math, derived from the inputs (pure)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from worker.engine.sdpa import FUSED, SWITCHES, SdpaInputs, backend_of, math_reason


@pytest.mark.parametrize(
    "ops,expected",
    [
        ({"aten::scaled_dot_product_attention", "aten::_scaled_dot_product_flash_attention_for_cpu"},
         ("flash_attention", "aten::_scaled_dot_product_flash_attention_for_cpu")),
        ({"aten::_scaled_dot_product_flash_attention"}, ("flash_attention", "aten::_scaled_dot_product_flash_attention")),
        ({"aten::_scaled_dot_product_efficient_attention"},
         ("efficient_attention", "aten::_scaled_dot_product_efficient_attention")),
        ({"aten::_scaled_dot_product_cudnn_attention"}, ("cudnn_attention", "aten::_scaled_dot_product_cudnn_attention")),
        ({"aten::_scaled_dot_product_attention_math", "aten::bmm", "aten::_softmax"},
         ("math", "aten::_scaled_dot_product_attention_math")),
        ({"aten::scaled_dot_product_attention"}, (None, None)),  # the dispatcher alone names no backend
        (set(), (None, None)),
    ],
)
def test_backend_of_the_ops_seen(ops, expected):
    assert backend_of(ops) == expected


CPU = SdpaInputs(device="cpu", dtype="float32", dims=4, q_heads=4, kv_heads=2, q_len=8, kv_len=8, head_dim=16,
                 v_head_dim=16, mask=None, dropout=0.0, is_causal=True, enable_gqa=True, last_dim_contiguous=True,
                 enabled=tuple(SWITCHES))
H100 = dataclasses.replace(CPU, device="cuda", dtype="bfloat16", capability=(9, 0))
T4 = dataclasses.replace(H100, dtype="float16", capability=(7, 5))


def only(*backends: str) -> tuple[str, ...]:
    return tuple(backends)


@pytest.mark.parametrize(
    "inputs,expected",
    [
        (dataclasses.replace(CPU, enabled=only("math")),
         "flash_attention (CPU): the flash backend is switched off (torch.nn.attention.sdpa_kernel or "
         "torch.backends.cuda.enable_flash_sdp(False))"),
        (dataclasses.replace(CPU, dropout=0.1),
         "flash_attention (CPU): dropout_p=0.1: the CPU flash kernel takes no dropout (attention_dropout in training)"),
        (dataclasses.replace(CPU, v_head_dim=32),
         "flash_attention (CPU): query/key head dim 16 differs from value head dim 32: the CPU flash kernel needs "
         "them equal"),
        (dataclasses.replace(CPU, dims=3),
         "flash_attention (CPU): 3-D inputs: the CPU flash kernel takes (batch, heads, sequence, head dim)"),
        (dataclasses.replace(CPU, dropout=0.1, enabled=only("math")),
         "flash_attention (CPU): the flash backend is switched off (torch.nn.attention.sdpa_kernel or "
         "torch.backends.cuda.enable_flash_sdp(False)); dropout_p=0.1: the CPU flash kernel takes no dropout "
         "(attention_dropout in training)"),
        (CPU, "the CPU flash kernel refused float32 cpu, head dim 16, no mask, causal, GQA 4/2 heads for a reason "
              "these inputs do not show (e.g. the mask's shape)"),
        (dataclasses.replace(H100, dtype="float32", mask="bool", enable_gqa=False, is_causal=False),
         "flash_attention: float32 inputs (it takes only fp16/bf16), an attention mask (it takes none, only "
         "is_causal); efficient_attention: refused for a reason the inputs do not show; cudnn_attention: float32 "
         "inputs (it takes only fp16/bf16)"),
        (dataclasses.replace(T4, head_dim=80, v_head_dim=80),
         "flash_attention: compute capability sm75 (it needs sm80 or newer); efficient_attention: refused for a "
         "reason the inputs do not show; cudnn_attention: compute capability sm75 (it needs sm80 or newer)"),
        (dataclasses.replace(H100, head_dim=300, v_head_dim=300, enabled=only("flash_attention", "math")),
         "flash_attention: head dim 300 (it needs a multiple of 8, at most 256); efficient_attention: switched off "
         "(torch.nn.attention.sdpa_kernel or torch.backends.cuda.enable_*_sdp(False)); cudnn_attention: switched "
         "off (torch.nn.attention.sdpa_kernel or torch.backends.cuda.enable_*_sdp(False))"),
    ],
)
def test_why_math(inputs, expected):
    assert math_reason(inputs) == expected


def test_torchs_own_words_fill_in_what_the_inputs_do_not_show():
    words = {"efficient_attention": ["Memory efficient kernel not used because: GQA is not supported"],
             "flash_attention": ["Flash attention kernel not used because: ..."]}
    reason = math_reason(dataclasses.replace(H100, dtype="float32"), words)
    assert 'efficient_attention: torch: "Memory efficient kernel not used because: GQA is not supported"' in reason
    assert reason.startswith("flash_attention: float32 inputs")  # the inputs' own explanation comes first


@given(device=st.sampled_from(["cpu", "cuda"]), dtype=st.sampled_from(["float32", "bfloat16", "float16", "float64"]),
       head_dim=st.integers(1, 512), mask=st.sampled_from([None, "bool", "float32"]),
       dropout=st.sampled_from([0.0, 0.1]), enabled=st.sets(st.sampled_from(list(SWITCHES))))
def test_every_math_reason_names_every_switched_off_fused_backend(device, dtype, head_dim, mask, dropout, enabled):
    inputs = dataclasses.replace(CPU, device=device, dtype=dtype, head_dim=head_dim, v_head_dim=head_dim, mask=mask,
                                 dropout=dropout, enabled=tuple(sorted(enabled)),
                                 capability=(9, 0) if device == "cuda" else None)
    reason = math_reason(inputs)
    assert reason
    off = [b for b in FUSED if b not in enabled]
    if device == "cpu" and "flash_attention" in off:
        assert "the flash backend is switched off" in reason
    if device == "cuda":
        assert all(f"{b}: switched off" in reason for b in off)


def test_inputs_are_read_from_sdpa_s_own_arguments():
    q = torch.randn(2, 4, 5, 8, dtype=torch.bfloat16)
    kv = torch.randn(2, 2, 7, 8, dtype=torch.bfloat16)
    x = SdpaInputs.of(q, kv, kv, attn_mask=torch.ones(5, 7, dtype=torch.bool), dropout_p=0.0, enable_gqa=True)
    assert (x.device, x.dtype, x.q_heads, x.kv_heads, x.q_len, x.kv_len, x.head_dim, x.mask, x.enable_gqa) == \
        ("cpu", "bfloat16", 4, 2, 5, 7, 8, "bool", True)
    assert x.summary() == "bfloat16 cpu, head dim 8, bool mask, GQA 4/2 heads"
    assert x.signature != SdpaInputs.of(q[:, :, :1], kv, kv, enable_gqa=True).signature  # decode is its own
