"""The resolution preview, rule by rule, for every role (tables, STYLE.md 16)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.attention import messages
from worker.attention.resolution import ROLES, ModelSupport, Rule, resolve
from worker.core.environment import PROFILES, Environment, UnknownProfileError, environment_from, get_profile
from worker.core.implementations import BUILTIN_NAMES
from worker.core.vocabulary import ModelInfo
from worker.spec import parse_spec
from worker.spec.engines import ModelEngine

ACTOR_SECTION = "actor_rollout_ref.model.override_config"
CRITIC_SECTION = "critic.model.override_config"


def section(role: str) -> str:
    return CRITIC_SECTION if role == "critic" else ACTOR_SECTION


def role_spec(role: str, attn: str | None = None, **dotted):
    """A spec where `role`'s section requests `attn`; the other section asks for eager so it never interferes."""
    other = ACTOR_SECTION if role == "critic" else CRITIC_SECTION
    data = {f"{other}.attn_implementation": "eager", **dotted}
    if attn is not None:
        data[f"{section(role)}.attn_implementation"] = attn
    return parse_spec(data)


def sp_keys(role: str, strategy: str, sp: int) -> dict:
    if role == "critic":
        return {"critic.strategy": strategy, "critic.ulysses_sequence_parallel_size": sp}
    return {"actor_rollout_ref.actor.strategy": strategy,
            "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size": sp}


def rules_of(result) -> list[str]:
    """The rule ids of a role's reasons, and of what verl's training engine does with it (``verl_engine``)."""
    return [r.rule for r in result.reasons] + [r.rule for r in (result.verl_engine.reasons if result.verl_engine else ())]


CPU, T4, A100, H100, NPU = (PROFILES[n] for n in ("cpu", "cuda-sm75", "cuda-sm80-fa2", "cuda-sm90-fa2", "npu"))
CPU_4X = dataclasses.replace(CPU, name="cpu-tf4", transformers_version="4.57.1")
T4_WITH_FA = dataclasses.replace(T4, name="t4-fa", flash_attn_version="2.8.3")
CPU_WITH_FA = dataclasses.replace(CPU, name="cpu-fa", flash_attn_version="2.8.3")
A100_OLD_FA = dataclasses.replace(A100, name="a100-old-fa", flash_attn_version="2.1.0")
A100_KERNELS = dataclasses.replace(A100, name="a100-kernels", kernels_installed=True)
NO_FA2 = ModelSupport("FalconMambaForCausalLM", flash_attn=False, sdpa=True)
NO_SDPA = ModelSupport("OldModelForCausalLM", flash_attn=True, sdpa=False)

HUB = "kernels-community/flash-attn@main:flash_attn_func"
FP32 = {"actor_rollout_ref.actor.fsdp_config.dtype": "fp32", "actor_rollout_ref.ref.fsdp_config.dtype": "fp32",
        "actor_rollout_ref.rollout.dtype": "fp32", "critic.fsdp.dtype": "fp32"}

# (case id, attn requested or None for the default, extra dotted keys, env, support,
#  expected effective, status, source, rule that must appear, exact error text or None)
CASES = [
    ("default-fa2-on-a100", None, {}, A100, None, "flash_attention_2", "ok", "default", Rule.default, None),
    ("override-eager", "eager", {}, CPU, None, "eager", "ok", "override", Rule.override, None),
    ("override-sdpa", "sdpa", {}, CPU, None, "sdpa", "ok", "override", Rule.override, None),
    ("default-on-cpu-strict", None, {}, CPU, None, None, "error", "default", Rule.fa_not_installed,
     messages.flash_attn_not_installed(2, 5)),
    ("default-on-cpu-transformers-4", None, {}, CPU_4X, None, None, "error", "default", Rule.fa_not_installed,
     messages.flash_attn_not_installed(2, 4)),
    ("default-on-cpu-fallback", None, {"attnboard.fallback_policy": "fallback"}, CPU, None, "sdpa", "fallback",
     "default", Rule.fallback_step, messages.flash_attn_not_installed(2, 5)),
    ("fa-installed-but-cpu", "flash_attention_2", {}, CPU_WITH_FA, None, None, "error", "override",
     Rule.fa_not_on_cpu, messages.flash_attn_not_on_cpu(2, 5)),
    ("t4-without-fa", "flash_attention_2", {}, T4, None, None, "error", "override", Rule.fa_not_installed,
     messages.flash_attn_not_installed(2, 5)),
    ("t4-with-fa-pre-ampere", "flash_attention_2", {}, T4_WITH_FA, None, None, "error", "override",
     Rule.fa_compute_capability, messages.PRE_AMPERE),
    ("t4-with-fa-fallback", "flash_attention_2", {"attnboard.fallback_policy": "fallback"}, T4_WITH_FA, None,
     "sdpa", "fallback", "override", Rule.fa_compute_capability, messages.PRE_AMPERE),
    ("old-flash-attn", "flash_attention_2", {}, A100_OLD_FA, None, None, "error", "override", Rule.fa_too_old,
     messages.flash_attn_too_old("2.1.0", 5)),
    ("architecture-without-fa2", "flash_attention_2", {}, A100, NO_FA2, None, "error", "override",
     Rule.fa_architecture, messages.architecture_without_flash_attn("FalconMambaForCausalLM", 2, 5)),
    ("architecture-without-fa2-fallback", "flash_attention_2", {"attnboard.fallback_policy": "fallback"}, A100,
     NO_FA2, "sdpa", "fallback", "override", Rule.fa_architecture, None),
    ("architecture-without-sdpa", "sdpa", {}, A100, NO_SDPA, None, "error", "override", Rule.sdpa_architecture,
     messages.architecture_without_sdpa("OldModelForCausalLM")),
    ("architecture-without-sdpa-fallback", "sdpa", {"attnboard.fallback_policy": "fallback"}, A100, NO_SDPA,
     "eager", "fallback", "override", Rule.sdpa_architecture, None),
    ("chain-to-eager", None, {"attnboard.fallback_policy": "fallback"}, CPU, NO_SDPA, "eager", "fallback",
     "default", Rule.sdpa_architecture, None),
    ("fa3-on-a100", "flash_attention_3", {}, A100, None, None, "error", "override", Rule.fa_compute_capability,
     messages.flash_attn_compute_capability(3, 9, (8, 0))),
    ("fa3-on-h100-not-installed", "flash_attention_3", {}, H100, None, None, "error", "override",
     Rule.fa_not_installed, messages.flash_attn_not_installed(3, 5)),
    ("fa3-fallback-to-fa2", "flash_attention_3", {"attnboard.fallback_policy": "fallback"}, H100, None,
     "flash_attention_2", "fallback", "override", Rule.fallback_step, None),
    ("npu-short-circuit", None, {}, NPU, None, "flash_attention_2", "ok", "default", Rule.default, None),
    ("hub-kernel-without-kernels", HUB, {}, A100, None, None, "error", "override", Rule.hub_kernel_missing,
     messages.KERNELS_MISSING),
    ("hub-kernel-with-kernels", HUB, {}, A100_KERNELS, None, HUB, "ok", "override", Rule.hub_kernel, None),
    ("paged-sdpa", "paged|sdpa", {}, CPU, None, "paged|sdpa", "ok", "override", Rule.override, None),
    ("output-attentions-strict", "sdpa", {"attnboard.debug.output_attentions": True}, CPU, None, None, "error",
     "override", Rule.output_attentions, messages.SDPA_OUTPUT_ATTENTIONS),
    ("output-attentions-fallback", "sdpa", {"attnboard.debug.output_attentions": True,
                                            "attnboard.fallback_policy": "fallback"}, CPU, None, "eager",
     "fallback", "override", Rule.output_attentions, messages.SDPA_OUTPUT_ATTENTIONS),
    ("output-attentions-eager-fine", "eager", {"attnboard.debug.output_attentions": True}, CPU, None, "eager",
     "ok", "override", Rule.override, None),
    ("strict-names-the-policy", "flash_attention_2", {}, CPU, None, None, "error", "override", Rule.strict, None),
    ("fa2-in-fp32-strict", "flash_attention_2", FP32, A100, None, None, "error", "override", Rule.fa_dtype,
     messages.FLASH_ATTN_DTYPE[2][1]),
    ("fa2-in-fp32-fallback", "flash_attention_2", {**FP32, "attnboard.fallback_policy": "fallback"}, H100, None,
     "sdpa", "fallback", "override", Rule.fa_dtype, messages.FLASH_ATTN_DTYPE[2][1]),
    ("fa2-in-fp16", "flash_attention_2", dict.fromkeys(FP32, "fp16"), A100, None, "flash_attention_2", "ok", "override",
     Rule.override, None),
]


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize(
    "case,attn,dotted,env,support,effective,status,source,rule,error", CASES, ids=[c[0] for c in CASES]
)
def test_rule_table(role, case, attn, dotted, env, support, effective, status, source, rule, error):
    spec = role_spec(role, attn, **dotted)
    support_kw = {"critic_support": support} if role == "critic" else {"actor_support": support}
    result = resolve(spec, env, **support_kw).roles[role]
    assert (result.effective, result.status, result.source) == (effective, status, source)
    assert rule.value in rules_of(result)
    if error is not None:
        assert result.error == error
    if status == "error":
        assert result.error, "an error status always carries the exact message"


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("attn", [None, "sdpa", "flash_attention_2", "eager"])
def test_fsdp_turbo_with_ulysses_forces_eager(role, attn):
    spec = role_spec(role, attn, **sp_keys(role, "fsdp_turbo", 2))
    result = resolve(spec, A100).roles[role]
    assert result.effective == "eager"
    assert result.status == ("ok" if attn == "eager" else "forced")
    assert Rule.forced_turbo_ulysses.value in rules_of(result)
    assert result.badge == ("override" if attn == "eager" else "forced")


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("strategy", ["fsdp", "fsdp2"])
def test_plain_ulysses_keeps_the_request(role, strategy):
    spec = role_spec(role, "sdpa", **sp_keys(role, strategy, 2))
    result = resolve(spec, CPU).roles[role]
    assert (result.effective, result.status) == ("sdpa", "ok")
    assert Rule.ulysses.value in rules_of(result)
    assert Rule.forced_turbo_ulysses.value not in rules_of(result)


def test_turbo_without_ulysses_is_not_forced():
    spec = role_spec("actor", "sdpa", **sp_keys("actor", "fsdp_turbo", 1))
    assert resolve(spec, CPU).roles["actor"].effective == "sdpa"


def test_turbo_own_cp_group_also_forces_eager():
    spec = parse_spec({"actor_rollout_ref.actor.strategy": "fsdp_turbo",
                       "actor_rollout_ref.actor.fsdp_config.turbo_cp_size": 2,
                       f"{ACTOR_SECTION}.attn_implementation": "sdpa"})
    assert resolve(spec, CPU).roles["actor"].status == "forced"


@pytest.mark.parametrize("role,expected", [("actor", "error"), ("critic", "error"), ("reference", "ok")])
def test_flex_attention_backward_on_cpu(role, expected):
    result = resolve(role_spec(role, "flex_attention"), CPU).roles[role]
    assert result.status == expected
    if expected == "error":
        assert result.error == messages.FLEX_BACKWARD_CPU
        assert Rule.flex_backward_cpu.value in rules_of(result)


def test_rollout_runs_what_the_actor_loaded():
    spec = role_spec("actor", "flex_attention", **{"attnboard.fallback_policy": "fallback"})
    roles = resolve(spec, CPU).roles
    assert roles["actor"].effective == "flash_attention_2" or roles["actor"].effective == "sdpa"
    assert roles["rollout"].effective == roles["actor"].effective
    assert roles["reference"].effective == "flex_attention"  # frozen: no backward, flex loads
    assert Rule.shared_section.value in rules_of(roles["rollout"])


@pytest.mark.parametrize("engine,env,dtype,backend,error", [
    ("vllm", CPU, "bf16", "CPU_ATTN", None),
    ("vllm", A100, "bf16", "FLASH_ATTN", None),
    ("vllm", H100, "bf16", "FLASH_ATTN", None),
    ("vllm", A100, "fp32", "TRITON_ATTN", None),  # neither FLASH_ATTN nor FLASHINFER takes fp32
    ("vllm", T4, "fp16", "FLASHINFER", None),  # FLASH_ATTN needs 8.0 on vLLM
    ("vllm", T4, "bf16", None, "Bfloat16 is only supported on GPUs with compute capability of at least 8.0. Your "
                               "Tesla T4 GPU has compute capability 7.5. You can use float16 instead by explicitly "
                               "setting the `dtype` flag in CLI, for example: --dtype=half."),
    ("vllm", NPU, "bf16", None, None),
    ("sglang", A100, "bf16", "flashinfer", None),  # verl 0.9.1 sets it for sglang >= 0.5.12
    ("sglang", H100, "bf16", "flashinfer", None),
    ("sglang", CPU, "bf16", None, None),
    ("trtllm", H100, "bf16", "TRTLLM", None),
    ("trtllm", CPU, "bf16", None, None),
])
def test_rollout_engine_backend_under_verl(engine, env, dtype, backend, error):
    spec = role_spec("actor", "flash_attention_2", **{"actor_rollout_ref.rollout.name": engine,
                                                      "actor_rollout_ref.rollout.dtype": dtype})
    resolution = resolve(spec, env)
    rollout, actor = resolution.roles["rollout"], resolution.roles["actor"]
    # Under attnboard: the actor's HF model, so the actor's answer.
    assert (rollout.requested, rollout.effective, rollout.status, rollout.attempts) == \
        (actor.requested, actor.effective, actor.status, actor.attempts)
    # Under verl: the engine's own backend; override_config does not reach it, and the preview says so.
    choice = rollout.under_verl
    assert (choice.engine, choice.backend, choice.error) == (engine, backend, error)
    assert choice.effective == f"{engine}:{'error' if error else backend or '?'}"
    assert not choice.reached_by_override_config
    assert choice.setting == f"actor_rollout_ref.rollout.engine_kwargs.{engine}." + (
        "attn_backend" if engine == "trtllm" else "attention_backend")
    reason = next(r.text for r in rollout.reasons if r.rule == Rule.rollout_engine.value)
    assert "override_config does not reach it" in reason and choice.setting in reason
    assert f"attnboard's own engine does not run {engine}" in reason
    assert any(r.rule == Rule.shared_section.value and "under attnboard" in r.text for r in rollout.reasons)
    data = resolution.to_dict()["roles"]["rollout"]
    assert data["under_verl"]["effective"] == choice.effective and data["effective"] == actor.effective
    assert resolution.to_dict()["roles"]["actor"]["under_verl"] is None


def test_hf_rollout_has_no_other_engine():
    result = resolve(role_spec("actor", "sdpa", **{"actor_rollout_ref.rollout.name": "hf"}), A100).roles["rollout"]
    assert result.under_verl is None and result.effective == "sdpa"


def test_rollout_engine_reason():
    spec = role_spec("actor", "sdpa", **{"actor_rollout_ref.rollout.name": "vllm"})
    assert Rule.rollout_engine.value in rules_of(resolve(spec, CPU).roles["rollout"])
    spec = role_spec("actor", "sdpa", **{"actor_rollout_ref.rollout.name": "hf"})
    assert Rule.rollout_engine.value not in rules_of(resolve(spec, CPU).roles["rollout"])


def test_critic_override_carries_the_verl_defect_warning():
    result = resolve(role_spec("critic", "sdpa"), T4).roles["critic"]
    assert (result.effective, result.status) == ("sdpa", "ok")
    assert Rule.verl_critic_defect.value in rules_of(result)
    default = resolve(parse_spec({}), A100).roles["critic"]
    assert Rule.verl_critic_defect.value not in rules_of(default)


def test_no_critic_without_gae():
    spec = parse_spec({"algorithm.adv_estimator": "grpo", "actor_rollout_ref.rollout.n": 4})
    assert set(resolve(spec, A100).roles) == {"actor", "rollout", "reference"}


def test_unknown_name_is_an_error_even_if_validation_was_bypassed():
    spec = parse_spec({})
    spec.actor_rollout_ref.model.override_config["attn_implementation"] = "flsh"
    result = resolve(spec, CPU).roles["actor"]
    assert result.status == "error" and 'attn_implementation="flsh"' in result.error
    assert Rule.unknown_name.value in rules_of(result)


def test_support_unknown_is_said():
    result = resolve(role_spec("actor", "sdpa"), CPU).roles["actor"]
    assert Rule.support_unknown.value in rules_of(result)
    result = resolve(role_spec("actor", "sdpa"), CPU, actor_support=ModelSupport("LlamaForCausalLM")).roles["actor"]
    assert Rule.support_unknown.value not in rules_of(result)


def test_every_rule_is_exercised():
    """Meta-test: every rule id appears in at least one resolution produced by this module's cases."""
    seen: set[str] = set()
    for role in ROLES:
        for _, attn, dotted, env, support, *_ in CASES:
            kw = {"critic_support": support} if role == "critic" else {"actor_support": support}
            seen.update(rules_of(resolve(role_spec(role, attn, **dotted), env, **kw).roles[role]))
        for extra in (sp_keys(role, "fsdp_turbo", 2), sp_keys(role, "fsdp2", 2), {"actor_rollout_ref.rollout.name": "vllm"}):
            seen.update(rules_of(resolve(role_spec(role, "sdpa", **extra), CPU).roles[role]))
        seen.update(rules_of(resolve(role_spec(role, "flash_attention_2", **sp_keys(role, "fsdp2", 2)), A100).roles[role]))
        seen.update(rules_of(resolve(role_spec(role, "flex_attention"), CPU).roles[role]))
        seen.update(rules_of(resolve(role_spec(role, "flex_attention"), CPU,
                                     actor_support=ModelSupport("X", flex_attn=False),
                                     critic_support=ModelSupport("X", flex_attn=False)).roles[role]))
    spec = parse_spec({})
    spec.actor_rollout_ref.model.override_config["attn_implementation"] = "flsh"
    seen.update(rules_of(resolve(spec, CPU).roles["actor"]))
    for engine in ModelEngine:  # verl's training engines (their table: tests/worker/attention/test_verl_engines.py)
        for env in (CPU, H100):
            engine_spec = parse_spec({"model_engine": engine.value, "actor_rollout_ref.rollout.name": "sglang",
                                      "actor_rollout_ref.model.override_config.attn_implementation": "sdpa",
                                      "verl_passthrough": {"critic.veomni.attn_implementation": "sdpa",
                                                           "+actor_rollout_ref.rollout.engine_kwargs.sglang."
                                                           "attention_backend": "fa3"}})
            seen.update(r for role in engine_spec_roles(engine_spec, env) for r in role)
    # Kernel sources and head-dim limits (their table: tests/worker/attention/test_kernel_sources.py)
    offline = dataclasses.replace(H100, flash_attn_version=None, kernels_installed=True, hub_reachable=False)
    gemma = ModelInfo("Gemma4ForCausalLM", 8, 2, 2048, extra={"head_dim": 256, "global_head_dim": 512})
    for env, attn, model in ((offline, "flash_attention_2", None), (H100, "flash_attention_2", gemma),
                             (H100, "sdpa", gemma)):
        seen.update(rules_of(resolve(role_spec("actor", attn), env, actor_model=model).roles["actor"]))
    assert {r.value for r in Rule} - seen == set()


def engine_spec_roles(spec, env) -> list[list[str]]:
    return [rules_of(r) for r in resolve(spec, env).roles.values()]


def test_to_dict_is_json_ready():
    import json

    data = resolve(role_spec("critic", "sdpa"), CPU).to_dict()
    json.dumps(data)
    assert data["roles"]["critic"]["badge"] == "override"
    assert data["roles"]["actor"]["badge"] == "override"
    assert data["ok"] is True


# ---- environments


def test_profiles_are_the_named_five():
    assert set(PROFILES) == {"cpu", "cuda-sm75", "cuda-sm80-fa2", "cuda-sm90-fa2", "npu"}


def test_unknown_profile_lists_valid_names():
    with pytest.raises(UnknownProfileError) as exc:
        get_profile("tpu")
    assert "cuda-sm80-fa2" in str(exc.value) and "'tpu'" in str(exc.value)


@pytest.mark.parametrize(
    "data,fragment",
    [
        ({"device": "tpu"}, "environment.device"),
        ({"compute_capability": [8]}, "environment.compute_capability"),
        ({"compute_capability": "8.0"}, "environment.compute_capability"),
        ({"flash_attn_version": 2}, "environment.flash_attn_version"),
        ({"gpus": 8}, "environment.gpus"),
        ({"kernels_installed": "yes"}, "environment.kernels_installed"),
        ([], "must be a profile name or an object"),
    ],
)
def test_environment_from_dict_names_the_bad_field(data, fragment):
    with pytest.raises(ValueError) as exc:
        environment_from(data)
    assert fragment in str(exc.value)


@given(st.sampled_from(list(PROFILES.values())))
def test_environment_round_trip(env: Environment):
    assert Environment.from_dict(env.to_dict()) == env


@settings(max_examples=200, deadline=None)
@given(
    role_attn=st.sampled_from([None, *BUILTIN_NAMES, "paged|eager", HUB]),
    critic_attn=st.sampled_from([None, *BUILTIN_NAMES]),
    env=st.sampled_from([CPU, T4, A100, H100, NPU, T4_WITH_FA, A100_KERNELS]),
    policy=st.sampled_from(["strict", "fallback"]),
    strategy=st.sampled_from(["fsdp", "fsdp2", "fsdp_turbo"]),
    sp=st.sampled_from([1, 2]),
    output_attentions=st.booleans(),
)
def test_invariants(role_attn, critic_attn, env, policy, strategy, sp, output_attentions):
    data = {"attnboard.fallback_policy": policy, "attnboard.debug.output_attentions": output_attentions,
            **sp_keys("actor", strategy, sp)}
    if role_attn:
        data[f"{ACTOR_SECTION}.attn_implementation"] = role_attn
    if critic_attn:
        data[f"{CRITIC_SECTION}.attn_implementation"] = critic_attn
    resolution = resolve(parse_spec(data), env)
    for role in resolution.roles.values():
        assert role.reasons[0].rule in (Rule.default.value, Rule.override.value)
        if role.status == "error":
            assert role.effective is None and role.error
        else:
            assert role.effective is not None and role.attempts[-1] == role.effective
        if role.status == "fallback":
            assert policy == "fallback" and role.effective != role.requested
        if role.status == "forced":
            assert role.effective == "eager"
        if output_attentions and role.effective is not None:
            assert role.effective in ("eager", "paged|eager")
        if policy == "strict":
            assert role.status != "fallback"
    assert resolution.roles["rollout"].effective == resolution.roles["actor"].effective


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("policy,effective,status", [("strict", None, "error"), ("fallback", "sdpa", "fallback")])
def test_plain_ulysses_wraps_eager_and_sdpa_only(role, policy, effective, status):
    """attnboard's Ulysses wrapper runs eager and sdpa: flash_attention_2 with SP 2 on an A100 cannot run."""
    spec = role_spec(role, "flash_attention_2", **sp_keys(role, "fsdp2", 2), **{"attnboard.fallback_policy": policy})
    result = resolve(spec, A100).roles[role]
    assert (result.effective, result.status) == (effective, status)
    assert Rule.ulysses_kernel.value in rules_of(result)
    assert result.error == messages.ulysses_kernel("flash_attention_2")
    why = next(r.text for r in result.reasons if r.rule == Rule.ulysses_kernel.value)
    assert "verl itself runs Ulysses with flash_attention_2" in why and "limit of attnboard's engine" in why
    if policy == "strict":
        assert "though verl would run it" in next(r.text for r in result.reasons if r.rule == Rule.strict.value)


def test_every_rule_id_is_in_the_readme_table():
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text(encoding="utf-8")
    table = readme.split("## Attention rules", 1)[1].split("\n## ", 1)[0]
    assert [r.value for r in Rule if f"`{r.value}`" not in table] == []
