"""observe_attention counts the kernel that really ran, per implementation, and restores the dispatch."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface
from transformers.models.llama import modeling_llama

from worker.engine import ulysses
from worker.engine.observe import observe_attention

TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=128, vocab_size=64)


def tiny(arch: str, impl: str) -> torch.nn.Module:
    torch.manual_seed(0)
    config_cls, model_cls = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}[arch]
    config = config_cls(**TINY)
    config._attn_implementation = impl
    return model_cls(config).eval()


IDS = torch.arange(1, 9)[None, :]  # (1, 8)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_observed_kernel_is_the_configured_one(arch, impl):
    model = tiny(arch, impl)
    with observe_attention() as seen, torch.no_grad():
        model(input_ids=IDS)
    assert seen.kernel == impl
    assert seen.calls == {impl: TINY["num_hidden_layers"]}  # one call per layer, nothing else


def test_a_config_switched_after_loading_is_what_runs():
    # The observation follows the dispatch at call time, not what the model was built with.
    model = tiny("llama", "sdpa")
    model.config._attn_implementation = "eager"
    with observe_attention() as seen, torch.no_grad():
        model(input_ids=IDS)
    assert seen.kernel == "eager"


def test_no_forward_observes_nothing():
    with observe_attention() as seen:
        pass
    assert seen.kernel is None and seen.as_dict() == {"observed": None, "calls": {}, "wrappers": {}}


def test_dispatch_is_restored_on_exit_even_after_an_error():
    before_global = dict(AttentionInterface._global_mapping)
    before_eager = modeling_llama.eager_attention_forward
    with pytest.raises(RuntimeError, match="boom"):
        with observe_attention():
            assert modeling_llama.eager_attention_forward is not before_eager
            raise RuntimeError("boom")
    assert AttentionInterface._global_mapping == before_global
    assert modeling_llama.eager_attention_forward is before_eager
    assert ALL_ATTENTION_FUNCTIONS["sdpa"] is before_global["sdpa"]


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_ulysses_wrapper_outside_its_context_passes_through_and_counts_apart(impl):
    model = tiny("llama", impl)
    with torch.no_grad():
        reference = model(input_ids=IDS).logits
    model.config._attn_implementation = ulysses.register_ulysses(impl)
    with observe_attention() as seen, torch.no_grad():
        wrapped = model(input_ids=IDS).logits
    assert seen.kernel == impl
    assert seen.wrapper_calls == {f"ulysses_{impl}": 2}
    torch.testing.assert_close(wrapped, reference)


def test_ulysses_refuses_kernels_it_cannot_mask():
    with pytest.raises(ValueError, match="runs on eager, sdpa, not 'flash_attention_2'"):
        ulysses.register_ulysses("flash_attention_2")
