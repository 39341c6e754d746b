"""One fallback chain, one availability check: the preview's attempts are exactly what the engine tries.

For every implementation name x every environment profile x policy x (forced eager, Ulysses SP > 1, plain)
x output_attentions, the implementations ``resolve()`` reports in ``attempts`` for a role are the ones the
engine's loader tries: it walks ``RolePlan.candidates`` (``worker.engine.plan.load_plan``) in order, records
every implementation its load check (``worker.engine.rank.load_refusal``) refuses, and really loads the
first one the check lets through. The plan then goes on with the rest of the same chain only if that real
load fails.
"""

from __future__ import annotations

import dataclasses

import pytest

from worker.attention import messages
from worker.attention.availability import Rule
from worker.attention.resolution import resolve
from worker.core.environment import PROFILES
from worker.core.implementations import BUILTIN_NAMES, PAGED_NAMES
from worker.engine.plan import load_plan
from worker.engine.rank import load_refusal
from worker.spec import parse_spec

HUB = "kernels-community/flash-attn"
NAMES = [*BUILTIN_NAMES, *PAGED_NAMES, HUB]
LAYOUTS = {
    "plain": {},
    "ulysses-sp2": {"actor_rollout_ref.actor.strategy": "fsdp2", "critic.strategy": "fsdp2",
                    "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size": 2,
                    "critic.ulysses_sequence_parallel_size": 2},
    "forced-turbo": {"actor_rollout_ref.actor.strategy": "fsdp_turbo", "critic.strategy": "fsdp_turbo",
                     "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size": 2,
                     "critic.ulysses_sequence_parallel_size": 2},
}
LOADED_ROLES = ("actor", "reference", "critic")


def spec_for(name: str, policy: str, layout: str = "plain", output_attentions: bool = False, **dotted):
    return parse_spec({
        "actor_rollout_ref.model.override_config.attn_implementation": name,
        "critic.model.override_config.attn_implementation": name,
        "attnboard.fallback_policy": policy,
        "attnboard.debug.output_attentions": output_attentions,
        **LAYOUTS[layout],
        **dotted,
    })


def engine_walk(role_plan, env: dict) -> list[tuple[str, object]]:
    """What a rank's loader does when every real load its check allows succeeds: (implementation, refusal)."""
    walked = []
    for impl in role_plan.candidates:
        refused = load_refusal(impl, role_plan, env)
        walked.append((impl, refused))
        if refused is None:
            break
    return walked


@pytest.mark.parametrize("output_attentions", [False, True], ids=["weights-off", "weights-on"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("policy", ["strict", "fallback"])
@pytest.mark.parametrize("profile", list(PROFILES))
@pytest.mark.parametrize("name", NAMES)
def test_preview_attempts_are_what_the_engine_tries(name, profile, policy, layout, output_attentions):
    env = PROFILES[profile]
    spec = spec_for(name, policy, layout, output_attentions)
    resolution = resolve(spec, env)
    plan = load_plan(spec, resolution, actor_folder="actor", critic_folder="critic", env=env.to_dict())
    assert {p.role for p in plan.roles} == set(LOADED_ROLES)
    for role_plan in plan.roles:
        preview = resolution.roles[role_plan.role]
        walked = engine_walk(role_plan, plan.env)
        assert [impl for impl, _ in walked] == list(preview.attempts), role_plan.role
        assert role_plan.candidates[:len(walked)] == list(preview.attempts)
        loads = walked[-1][1] is None
        assert loads == (preview.status != "error"), role_plan.role
        if not loads:  # nothing left to try: the engine fails the role with the preview's error
            assert role_plan.candidates == list(preview.attempts)
            assert preview.error in {refused.error for _, refused in walked}


# --------------------------------------------------------------------------------------------
# FlashAttention's dtype rule: one function, tested twice (the preview, the rank's load check)

H100_FA3 = dataclasses.replace(PROFILES["cuda-sm90-fa2"], name="h100-fa3", flash_attn_3_version="3.0.0")
GPUS = {"cuda-sm80-fa2": PROFILES["cuda-sm80-fa2"], "cuda-sm90-fa2": PROFILES["cuda-sm90-fa2"], "h100-fa3": H100_FA3}
VERL_DTYPE = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def expected(impl: str, env_name: str, dtype: str, policy: str) -> tuple[str | None, str, str | None]:
    """(effective, status, rule of the first refusal) for the actor."""
    if impl == "flash_attention_3" and env_name != "h100-fa3":
        rule = Rule.fa_compute_capability if env_name == "cuda-sm80-fa2" else Rule.fa_not_installed
    elif dtype == "float32":
        rule = Rule.fa_dtype
    else:
        return impl, "ok", None
    if policy == "strict":
        return None, "error", rule
    # fallback: fa3 -> flash_attention_2 (same dtype rule in fp32) -> sdpa
    if impl == "flash_attention_3" and dtype != "float32":
        return "flash_attention_2", "fallback", rule
    return "sdpa", "fallback", rule


@pytest.mark.parametrize("policy", ["strict", "fallback"])
@pytest.mark.parametrize("dtype", list(VERL_DTYPE))
@pytest.mark.parametrize("env_name", list(GPUS))
@pytest.mark.parametrize("impl", ["flash_attention_2", "flash_attention_3"])
def test_flash_attn_dtype_rule_in_the_preview_and_the_load_check(impl, env_name, dtype, policy):
    env = GPUS[env_name]
    spec = spec_for(impl, policy, **{"actor_rollout_ref.actor.fsdp_config.dtype": VERL_DTYPE[dtype],
                                     "actor_rollout_ref.ref.fsdp_config.dtype": VERL_DTYPE[dtype],
                                     "actor_rollout_ref.rollout.dtype": VERL_DTYPE[dtype],
                                     "critic.fsdp.dtype": VERL_DTYPE[dtype]})
    effective, status, rule = expected(impl, env_name, dtype, policy)
    resolution = resolve(spec, env)
    actor = resolution.roles["actor"]
    assert (actor.effective, actor.status) == (effective, status)
    rules = [r.rule for r in actor.reasons]
    assert rule is None or rule.value in rules
    # fp32 meets the dtype rule wherever a flash kernel would otherwise load (fa3's fallback, flash_attention_2, too)
    assert (Rule.fa_dtype.value in rules) == (dtype == "float32" and (policy == "fallback" or rule == Rule.fa_dtype))
    if status == "error" and rule == Rule.fa_dtype:
        assert actor.error == messages.FLASH_ATTN_DTYPE[int(impl[-1])][1]  # flash-attn's own words

    # The rank's load check answers the same for the same inputs, for every attempt of every loaded role.
    plan = load_plan(spec, resolution, actor_folder="actor", critic_folder="critic", env=env.to_dict())
    for role_plan in plan.roles:
        assert role_plan.compute_dtype == dtype
        preview = resolution.roles[role_plan.role]
        walked = engine_walk(role_plan, plan.env)
        assert [name for name, _ in walked] == list(preview.attempts)
        assert [refused.rule.value for _, refused in walked if refused is not None] == \
            [r.rule for r in preview.reasons if " unavailable: " in r.text]
        for name, refused in walked:
            if refused is not None and refused.rule == Rule.fa_dtype:
                assert (refused.raises, refused.error) == messages.FLASH_ATTN_DTYPE[int(name[-1])]


@pytest.mark.parametrize("env_name", ["cpu", "cuda-sm75", "npu"])
def test_no_dtype_rule_where_the_flash_kernels_do_not_run(env_name):
    """On CPU and a T4 flash-attn is not there (that is the first error); on Ascend NPU transformers uses
    the NPU's own kernel, whose dtypes the rule does not speak for."""
    spec = spec_for("flash_attention_2", "strict", **{"actor_rollout_ref.actor.fsdp_config.dtype": "fp32"})
    rules = [r.rule for r in resolve(spec, PROFILES[env_name]).roles["actor"].reasons]
    assert Rule.fa_dtype.value not in rules


def test_the_quoted_load_warning_is_transformers_own(caplog, monkeypatch):
    """transformers' ``_flash_attn_can_dispatch`` on a real fp32 model logs exactly the text the rule quotes.
    flash-attn cannot be installed here, so only its package check is skipped; everything after it is the
    real code (it then refuses for want of a GPU, after the warning)."""
    import logging

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, dtype=torch.float32)
    model = LlamaForCausalLM(config)
    monkeypatch.setattr(model, "_flash_attn_import_error", lambda **kwargs: None)
    with caplog.at_level(logging.WARNING, logger="transformers"), pytest.raises(ValueError, match="no GPU available"):
        model._flash_attn_can_dispatch(2)
    assert messages.flash_attn_dtype_warning(2, "LlamaForCausalLM", "torch.float32") in caplog.messages


# --------------------------------------------------------------------------------------------
# The rank's load check in a real load (one in-process rank, world 1, the built-in tiny model)


def test_the_rank_records_a_refusal_as_a_failure_and_still_loads_what_the_check_allows(tmp_path):
    from worker.engine.models import ensure_builtin_folder
    from worker.engine.rank import LoadPlan, RankWorker, RolePlan

    folder = ensure_builtin_folder("builtin:tiny-llama", tmp_path)
    role = RolePlan(role="actor", loader="causal_lm", folder=str(folder), override_config={},
                    candidates=["flash_attention_2", HUB, "sdpa"], requested="flash_attention_2", forced=False,
                    reasons=[], strategy="fsdp2", sp=1, trained=True, compute_dtype="float32")
    # The node says `kernels` is installed; it is not: the check lets the Hub kernel through, the real load fails.
    env = {**PROFILES["cpu"].to_dict(), "kernels_installed": True}
    loaded = RankWorker(rank=0, world=1, run_id="unit")._load_role(role, LoadPlan([role], "fallback", env, seed=0))
    fa2, hub, sdpa = loaded.report["attempts"]

    assert fa2["refused_by"] == Rule.fa_not_installed.value  # refused before loading, in transformers' words
    assert fa2["error"] == f"ImportError: {messages.flash_attn_not_installed(2, 5)}"
    assert fa2["ok"] is False and fa2["diagnosis"]["category"] == "flash_attn_not_installed"
    assert fa2["diagnosis"]["remedy"]["patch"] == {"actor_rollout_ref.model.override_config.attn_implementation": "eager"}

    assert "refused_by" not in hub and hub["ok"] is False  # a real load, with transformers' real error
    assert "`kernels` is either not installed" in hub["error"] and "Traceback" in hub["traceback"]
    assert hub["diagnosis"]["category"] == "kernels_missing"

    assert sdpa == {"implementation": "sdpa", "ok": True}
    assert (loaded.report["effective"], loaded.report["observed"], loaded.report["fallback"]) == ("sdpa", "sdpa", True)
