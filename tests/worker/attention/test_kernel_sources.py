"""Where a FlashAttention kernel comes from per environment (``worker.attention.kernel_sources``), the offline-Hub
failure and its remedy, and the head-dim > 256 rules, through the availability check and the preview."""

from __future__ import annotations

import dataclasses

import pytest

from worker.attention import messages
from worker.attention.availability import Context, Rule, unavailable
from worker.attention.kernel_sources import (
    FLASH_HEAD_DIM_ERROR,
    fallback_warning,
    flash_kernel_source,
    hub_kernel_version,
    kernels_usable,
)
from worker.attention.resolution import resolve
from worker.core.environment import PROFILES, Environment
from worker.core.vocabulary import ModelInfo
from worker.spec import parse_spec

CPU, T4, A100, H100, NPU = (PROFILES[n] for n in ("cpu", "cuda-sm75", "cuda-sm80-fa2", "cuda-sm90-fa2", "npu"))
HUB = dataclasses.replace(H100, name="h100-kernels", flash_attn_version=None, kernels_installed=True,
                          kernels_version="0.18.4", hub_reachable=True)
OFFLINE = dataclasses.replace(HUB, name="h100-offline", hub_reachable=False)
UNPROBED = dataclasses.replace(HUB, name="h100-unprobed", hub_reachable=None)
OLD_KERNELS = dataclasses.replace(HUB, name="h100-old-kernels", kernels_version="0.12.0")


@pytest.mark.parametrize("name,env,origin,detail,offline", [
    ("flash_attention_2", A100, "package", "flash_attn 2.8.3", False),
    ("flash_attention_2", HUB, "hub", "kernels-community/flash-attn2 version 4 from the Hub", False),
    ("flash_attention_2", dataclasses.replace(HUB, torch_version="2.9.1"), "hub",
     "kernels-community/flash-attn2 version 3 from the Hub", False),
    ("flash_attention_3", HUB, "hub", "kernels-community/vllm-flash-attn3 version 1 from the Hub", False),
    ("flash_attention_4", OFFLINE, "hub", "kernels-community/flash-attn4 version 0 from the Hub", True),
    ("flash_attention_2", OFFLINE, "hub", "kernels-community/flash-attn2 version 4 from the Hub", True),
    ("flash_attention_2", UNPROBED, "hub", "kernels-community/flash-attn2 version 4 from the Hub", False),
    ("flash_attention_2", NPU, "npu", "torch_npu fusion attention", False),
    ("flash_attention_2", T4, "missing", "none", False),
    ("flash_attention_2", OLD_KERNELS, "missing", "none", False),
    ("flash_attention_2", CPU, "missing", "none", False),
])
def test_where_the_kernel_comes_from(name, env, origin, detail, offline) -> None:
    source = flash_kernel_source(name, env)
    assert (source.origin, source.detail, source.offline_error is not None) == (origin, detail, offline)
    if origin == "hub":
        repo = detail.split(" ")[0]
        assert fallback_warning(repo) in source.text and "HF_HUB_OFFLINE=1" in source.remedy
    assert flash_kernel_source("sdpa", env) is None


def test_kernels_version_range_and_hub_versions() -> None:
    assert kernels_usable(HUB) and not kernels_usable(OLD_KERNELS) and not kernels_usable(A100)
    assert kernels_usable(dataclasses.replace(HUB, kernels_version=None))
    assert hub_kernel_version("kernels-community/flash-attn2", "2.10.0") == 4
    assert hub_kernel_version("kernels-community/flash-attn2", "2.8.0") == 3


@pytest.mark.parametrize("env,problem", [
    (HUB, None),  # transformers loads the Hub kernel: available
    (UNPROBED, None),
    (OFFLINE, Rule.fa_hub_offline),
    (dataclasses.replace(HUB, kernels_installed=False, kernels_version=None), Rule.fa_not_installed),
])
def test_the_hub_kernel_in_the_availability_check(env, problem) -> None:
    found = unavailable("flash_attention_2", Context(env, compute_dtype="bfloat16"))
    assert (found.rule if found else None) == problem
    if problem is Rule.fa_hub_offline:
        # what the user reads: transformers re-raises its package check after the Hub fetch failed
        assert found.error == messages.flash_attn_not_installed(2, 5) and found.raises == "ImportError"
        assert "cannot reach the Hub" in found.explanation and "Remedy:" in found.explanation


GEMMA4 = ModelInfo("Gemma4ForCausalLM", 16, 8, 5376, extra={"head_dim": 256, "global_head_dim": 512})
QWEN = ModelInfo("Qwen2ForCausalLM", 14, 2, 896)


@pytest.mark.parametrize("model,env,impl,effective,status,rule", [
    (GEMMA4, H100, "flash_attention_2", None, "error", Rule.fa_head_dim),
    (QWEN, H100, "flash_attention_2", "flash_attention_2", "ok", Rule.fa_kernel_source),
    (GEMMA4, H100, "sdpa", "sdpa", "ok", Rule.sdpa_head_dim),
    (GEMMA4, NPU, "sdpa", "sdpa", "ok", Rule.sdpa_head_dim),
    (GEMMA4, CPU, "sdpa", "sdpa", "ok", None),  # the CPU's SDPA has no fused kernel to lose
    (QWEN, H100, "sdpa", "sdpa", "ok", None),
    (ModelInfo("LlamaForCausalLM", 8, 8, 4096), H100, "sdpa", "sdpa", "ok", None),  # head dim 512 without GQA
])
def test_head_dims_above_256(model, env, impl, effective, status, rule) -> None:
    spec = parse_spec({"actor_rollout_ref.model.override_config.attn_implementation": impl})
    actor = resolve(spec, env, actor_model=model).roles["actor"]
    assert (actor.effective, actor.status) == (effective, status)
    rules = [r.rule for r in actor.reasons]
    head_rules = {Rule.fa_head_dim.value, Rule.sdpa_head_dim.value} & set(rules)
    if rule is None:
        assert head_rules == set()
    else:
        assert rule.value in rules
    if rule is Rule.fa_head_dim:
        assert actor.error == FLASH_HEAD_DIM_ERROR


def test_the_preview_reports_the_kernel_source_per_role() -> None:
    spec = parse_spec({"algorithm.adv_estimator": "gae"})
    data = resolve(spec, HUB).to_dict()
    assert data["roles"]["actor"]["kernel_source"]["origin"] == "hub"
    assert data["roles"]["critic"]["kernel_source"]["detail"] == "kernels-community/flash-attn2 version 4 from the Hub"
    offline = resolve(spec, OFFLINE).roles["actor"]
    assert offline.status == "error" and offline.kernel_source is None
    assert Rule.fa_hub_offline.value in [r.rule for r in offline.reasons]


@pytest.mark.parametrize("value", [True, False, None])
def test_hub_reachable_reads_from_a_probe(value) -> None:
    assert Environment.from_dict({"hub_reachable": value}).hub_reachable is value


def test_hub_reachable_must_be_a_bool() -> None:
    with pytest.raises(ValueError, match=r"^environment.hub_reachable: 'yes' must be true, false or null"):
        Environment.from_dict({"hub_reachable": "yes"})
