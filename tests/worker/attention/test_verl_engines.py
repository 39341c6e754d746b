"""Under verl, per training engine x role x environment: the key that chooses attention, its value and where it
came from, what verl's engine runs after its own rewrites, and its refusals (``worker.attention.verl_engines``)."""

from __future__ import annotations

import pytest

from worker.attention.availability import Rule
from worker.attention.resolution import resolve
from worker.attention.verl_engines import torchtitan_refusal, unknown_backend, verl_engine_view
from worker.core.environment import PROFILES
from worker.spec import parse_spec

CPU, H100, NPU = (PROFILES[n] for n in ("cpu", "cuda-sm90-fa2", "npu"))
A = "actor_rollout_ref.actor"
R = "actor_rollout_ref.ref"
FA2, VEOMNI_FA2 = "flash_attention_2", "veomni_flash_attention_2_with_sp"
DP_KEY = "actor_rollout_ref.model.override_config.attn_implementation"
DP_CRITIC = "critic.model.override_config.attn_implementation"

NOTHING: dict = {}
CHOSEN = {
    DP_KEY: "sdpa", DP_CRITIC: "eager",
    f"{A}.veomni.attn_implementation": "sdpa", f"{R}.veomni.attn_implementation": "flash_attention_2",
    "critic.veomni.attn_implementation": "flash_attention_3",
    f"{A}.torchtitan.attn_type": "varlen", "critic.torchtitan.attn_type": "flex",
    f"{A}.megatron.override_transformer_config.attention_backend": "fused",
    "critic.megatron.override_transformer_config.attention_backend": "unfused",
    f"{A}.automodel_config.attn_implementation": "te",
}

# engine, keys set, environment, role -> key verl reads, value, source, what verl's engine runs, verl's refusal
CASES = [
    # dp: override_config; the reference is a copy of the actor's config; the critic's key is ignored (#5210)
    ("dp", NOTHING, H100, "actor", DP_KEY, FA2, "default", FA2, None),
    ("dp", NOTHING, H100, "reference", DP_KEY, FA2, "inherited", FA2, None),
    ("dp", NOTHING, H100, "critic", DP_CRITIC, FA2, "default", FA2, None),
    ("dp", CHOSEN, H100, "actor", DP_KEY, "sdpa", "set", "sdpa", None),
    ("dp", CHOSEN, NPU, "reference", DP_KEY, "sdpa", "inherited", "sdpa", None),
    ("dp", CHOSEN, H100, "critic", DP_CRITIC, "eager", "set", FA2, None),
    ("dp", CHOSEN, CPU, "actor", DP_KEY, "sdpa", "set", None, None),  # verl's FSDP engine: cuda and npu only
    # veomni: its own key, the reference inherits, the critic's own is honoured, flash_attention_N renamed
    ("veomni", NOTHING, H100, "actor", f"{A}.veomni.attn_implementation", FA2, "default", VEOMNI_FA2, None),
    ("veomni", NOTHING, NPU, "reference", f"{R}.veomni.attn_implementation", FA2, "inherited", VEOMNI_FA2, None),
    ("veomni", NOTHING, H100, "critic", "critic.veomni.attn_implementation", FA2, "default", VEOMNI_FA2, None),
    ("veomni", CHOSEN, H100, "actor", f"{A}.veomni.attn_implementation", "sdpa", "set", "sdpa", None),
    ("veomni", CHOSEN, H100, "reference", f"{R}.veomni.attn_implementation", FA2, "set", VEOMNI_FA2, None),
    ("veomni", CHOSEN, NPU, "critic", "critic.veomni.attn_implementation", "flash_attention_3", "set",
     "veomni_flash_attention_3_with_sp", None),
    ("veomni", {f"{A}.veomni.attn_implementation": "eager"}, H100, "reference", f"{R}.veomni.attn_implementation",
     "eager", "inherited", "eager", None),
    ("veomni", NOTHING, CPU, "actor", f"{A}.veomni.attn_implementation", FA2, "default", None, None),
    # torchtitan: attn_type in {flex, flex_flash, varlen}; no value model
    ("torchtitan", NOTHING, H100, "actor", f"{A}.torchtitan.attn_type", "flex", "default", "torchtitan:flex", None),
    ("torchtitan", CHOSEN, H100, "reference", f"{R}.torchtitan.attn_type", "varlen", "inherited", "torchtitan:varlen",
     None),
    ("torchtitan", {f"{A}.torchtitan.attn_type": "sdpa"}, H100, "actor", f"{A}.torchtitan.attn_type", "sdpa", "set", None,
     torchtitan_refusal("sdpa")),
    ("torchtitan", CHOSEN, NPU, "critic", "critic.torchtitan.attn_type", "flex", "set", None,
     unknown_backend("torchtitan")),
    # megatron: override_transformer_config.attention_backend; the reference takes the actor's whole dict
    ("megatron", NOTHING, H100, "actor", f"{A}.megatron.override_transformer_config.attention_backend", "flash",
     "default", "megatron:flash", None),
    ("megatron", CHOSEN, H100, "reference", f"{R}.megatron.override_transformer_config.attention_backend", "fused",
     "inherited", "megatron:fused", None),
    ("megatron", CHOSEN, NPU, "critic", "critic.megatron.override_transformer_config.attention_backend", "unfused",
     "set", "megatron:unfused", None),
    ("megatron", {f"{A}.megatron.override_transformer_config.attention_backend": "sdpa"}, H100, "actor",
     f"{A}.megatron.override_transformer_config.attention_backend", "sdpa", "set", None, "KeyError: 'sdpa'"),
    # automodel (newer verl): automodel_config.attn_implementation; reference mirrors the actor; no value model; cuda only
    ("automodel", NOTHING, H100, "actor", f"{A}.automodel_config.attn_implementation", FA2, "default", FA2, None),
    ("automodel", CHOSEN, H100, "reference", f"{R}.automodel_config.attn_implementation", "te", "inherited", "te", None),
    ("automodel", CHOSEN, H100, "critic", "critic.automodel_config.attn_implementation", "none", "default", None,
     unknown_backend("automodel")),
    ("automodel", NOTHING, NPU, "actor", f"{A}.automodel_config.attn_implementation", FA2, "default", None, None),
]


@pytest.mark.parametrize("engine,keys,env,role,key,requested,source,effective,error", CASES)
def test_engine_table(engine, keys, env, role, key, requested, source, effective, error) -> None:
    got = verl_engine_view(engine, keys, device=env.device, has_critic=True, architecture="Qwen2ForCausalLM")[role]
    assert (got.key, got.requested, got.source, got.effective, got.error) == (key, requested, source, effective, error)
    assert got.reasons and all(r.rule in {x.value for x in Rule} for r in got.reasons)


def rules(engine, keys, role, env=H100, architecture="Qwen2ForCausalLM") -> list[str]:
    got = verl_engine_view(engine, keys, device=env.device, has_critic=True, architecture=architecture)[role]
    return [r.rule for r in got.reasons]


def test_the_rules_that_say_what_verl_does_silently() -> None:
    assert Rule.verl_engine_rewrite.value in rules("veomni", NOTHING, "actor")
    assert Rule.verl_engine_rewrite.value not in rules("veomni", CHOSEN, "actor")  # sdpa is kept
    assert Rule.verl_reference_inherits.value in rules("veomni", NOTHING, "reference")
    assert Rule.verl_critic_honoured.value in rules("veomni", NOTHING, "critic")
    assert Rule.verl_critic_defect.value in rules("dp", CHOSEN, "critic")
    assert Rule.verl_engine_refuses.value in rules("torchtitan", NOTHING, "critic")
    # Automodel: backend_config.attn ignored for Qwen/Llama with ep_size <= 1, read for others
    assert Rule.verl_engine_ignores.value in rules("automodel", NOTHING, "actor")
    assert Rule.verl_engine_ignores.value not in rules("automodel", NOTHING, "actor", architecture="DeepseekV3ForCausalLM")
    assert Rule.verl_engine_ignores.value not in rules(
        "automodel", {f"{A}.automodel_config.ep_size": 8}, "actor")
    # override_config is not what a non-dp engine reads
    assert Rule.verl_engine_ignores.value in rules("veomni", {DP_KEY: "sdpa"}, "actor")
    assert Rule.verl_engine_ignores.value not in rules("dp", {DP_KEY: "sdpa"}, "actor")


def test_attnboard_says_where_its_dp_semantics_differ() -> None:
    assert verl_engine_view("dp", {DP_KEY: "sdpa"}, device="cuda", has_critic=False)["actor"].attnboard_differs is None
    veomni = verl_engine_view("veomni", NOTHING, device="cuda", has_critic=True)
    assert veomni["actor"].attnboard_differs == (
        f"attnboard's engine runs dp semantics: it loads the actor with {DP_KEY} (flash_attention_2), not what verl's "
        f"veomni engine runs ({VEOMNI_FA2}).")
    assert verl_engine_view("dp", {DP_CRITIC: "sdpa"}, device="cuda", has_critic=True)["critic"].attnboard_differs == (
        f"attnboard's engine honours {DP_CRITIC} (sdpa); verl runs flash_attention_2 (#5210).")
    assert "critic" not in verl_engine_view("veomni", NOTHING, device="cuda", has_critic=False)


@pytest.mark.parametrize("engine", ["dp", "veomni", "torchtitan", "megatron", "automodel"])
def test_the_preview_carries_the_engine_view_per_role(engine) -> None:
    spec = parse_spec({"model_engine": engine, "algorithm.adv_estimator": "gae"})
    resolution = resolve(spec, H100)
    assert resolution.model_engine == engine
    assert {name for name, r in resolution.roles.items() if r.verl_engine} == {"actor", "reference", "critic"}
    data = resolution.to_dict()
    assert data["model_engine"] == engine and data["roles"]["actor"]["verl_engine"]["engine"] == engine
    assert data["roles"]["rollout"]["verl_engine"] is None


@pytest.mark.parametrize("name,key,value,expected", [
    ("vllm", "actor_rollout_ref.rollout.engine_kwargs.vllm.attention_backend", "FLASHINFER", "vllm:FLASHINFER"),
    ("sglang", "+actor_rollout_ref.rollout.engine_kwargs.sglang.attention_backend", "fa3", "sglang:fa3"),
    ("trtllm", "+actor_rollout_ref.rollout.engine_kwargs.trtllm.attn_backend", "VANILLA", "trtllm:VANILLA"),
])
def test_an_explicit_rollout_attention_backend_is_read(name, key, value, expected) -> None:
    spec = parse_spec({"actor_rollout_ref.rollout.name": name, "verl_passthrough": {key: value}})
    rollout = resolve(spec, H100).roles["rollout"]
    assert rollout.under_verl.effective == expected
    assert Rule.rollout_engine_kwargs.value in [r.rule for r in rollout.reasons]
    # vLLM on CPU always runs CPU_ATTN, whatever is asked
    if name == "vllm":
        assert resolve(spec, CPU).roles["rollout"].under_verl.effective == "vllm:CPU_ATTN"
