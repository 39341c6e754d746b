"""observe_attention counts the kernel that really ran, per implementation, and restores the dispatch."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface
from transformers.models.llama import modeling_llama

from worker.engine import ulysses
from worker.engine.observe import observe_attention

TINY = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "intermediate_size": 128, "vocab_size": 64}


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
    assert seen.kernel is None and seen.as_dict() == {"observed": None, "calls": {}, "wrappers": {},
                                                      "sdpa_backend": None, "sdpa_backend_reason": None, "sdpa": []}


def test_dispatch_is_restored_on_exit_even_after_an_error():
    before_global = dict(AttentionInterface._global_mapping)
    before_eager = modeling_llama.eager_attention_forward
    with pytest.raises(RuntimeError, match="boom"), observe_attention():
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


# --------------------------------------------------------------------------------------------
# Below the implementation: the SDPA backend that ran (worker.engine.sdpa)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sdpa_on_cpu_runs_the_fused_flash_kernel(dtype):
    model = tiny("llama", "sdpa").to(dtype)
    with observe_attention() as seen, torch.no_grad():
        model(input_ids=IDS)
    found = seen.as_dict()
    assert found["sdpa_backend"] == "flash_attention" and found["sdpa_backend_reason"] is None
    [record] = found["sdpa"]  # both layers' calls share one input signature
    assert record["op"] == "aten::_scaled_dot_product_flash_attention_for_cpu" and record["calls"] == 2
    assert record["inputs"].startswith(f"{str(dtype).removeprefix('torch.')} cpu, head dim 16")


def test_a_forced_math_path_is_reported_with_its_reason():
    model = tiny("llama", "sdpa")
    with sdpa_kernel(SDPBackend.MATH), observe_attention() as seen, torch.no_grad():
        model(input_ids=IDS)
    found = seen.as_dict()
    assert seen.kernel == "sdpa"  # the implementation is still sdpa: only the kernel below it changed
    assert found["sdpa_backend"] == "math"
    assert found["sdpa"][0]["op"] == "aten::_scaled_dot_product_attention_math"
    assert found["sdpa_backend_reason"] == ("flash_attention (CPU): the flash backend is switched off "
                                            "(torch.nn.attention.sdpa_kernel or torch.backends.cuda.enable_flash_sdp(False))")


def test_attention_dropout_in_training_silently_takes_the_math_path():
    """No switch flipped: the model's own attention_dropout makes the CPU flash kernel refuse the call."""
    torch.manual_seed(0)
    config = LlamaConfig(**TINY, attention_dropout=0.1)
    config._attn_implementation = "sdpa"
    model = LlamaForCausalLM(config).train()
    with observe_attention() as seen:
        model(input_ids=IDS).logits.sum().backward()
    found = seen.as_dict()
    assert found["sdpa_backend"] == "math"
    assert found["sdpa_backend_reason"] == ("flash_attention (CPU): dropout_p=0.1: the CPU flash kernel takes no "
                                            "dropout (attention_dropout in training)")
    with observe_attention() as seen, torch.no_grad():
        model.eval()(input_ids=IDS)  # in eval the dropout is 0: back on the fused kernel
    assert seen.as_dict()["sdpa_backend"] == "flash_attention"


def test_decode_and_prefill_are_separate_signatures():
    model = tiny("llama", "sdpa")
    mask = torch.ones(1, 9, dtype=torch.long)
    with observe_attention() as seen, torch.no_grad():
        out = model(input_ids=IDS, use_cache=True)
        model(input_ids=IDS[:, :1], attention_mask=mask, cache=out.cache, use_cache=True)
    records = seen.as_dict()["sdpa"]
    assert len(records) == 2 and [r["calls"] for r in records] == [2, 2]
    assert all(r["backend"] == "flash_attention" for r in records)


def test_kernel_source_names_the_package_the_hub_snapshot_or_the_npu(monkeypatch):
    """Where a loaded FlashAttention kernel came from: the flash_attn package's version, the Hub snapshot `kernels`
    imported (read from the module's path in the HF cache), torch_npu's mapping; nothing for other kernels."""
    import sys
    import types

    from worker.engine.observe import kernel_source

    assert kernel_source("sdpa", "sdpa", "cuda") is None
    assert kernel_source("flash_attention_2", "flash_attention_2", "npu")["origin"] == "npu"
    package = kernel_source("flash_attention_2", "flash_attention_2", "cuda")
    assert package["origin"] == "package" and package["detail"].startswith("flash_attn ")
    rev = "0123456789abcdef0123456789abcdef01234567"
    fake = types.ModuleType("_attnboard_test_hub_kernel")
    fake.__file__ = f"/hf/hub/models--kernels-community--flash-attn2/snapshots/{rev}/build/torch/flash_attn2/__init__.py"
    monkeypatch.setitem(sys.modules, fake.__name__, fake)
    hub = kernel_source("flash_attention_2", "kernels-community/flash-attn2", "cuda")
    assert hub == {"origin": "hub", "repo": "kernels-community/flash-attn2", "revision": rev,
                   "detail": f"kernels-community/flash-attn2@{rev}"}
    assert kernel_source("kernels-community/flash-attn3", None, "cuda")["revision"] is None
