"""Run spec parsing and the cross-field rules: every message names the field, the value, what is valid."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from worker.spec import (
    SP_PADDING_MESSAGE,
    SPEC_KEYS,
    TURBO_CONFLICT_MESSAGE,
    ModelInfo,
    RunSpec,
    SpecError,
    check_spec,
    flatten,
    nearest_key,
    parse_spec,
    spec_to_flat,
    spec_to_tree,
    unflatten,
    validate_spec,
)

SMALL = {
    "trainer.n_gpus_per_node": 2,
    "data.train_batch_size": 8,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 4,
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 2,
    "critic.ppo_micro_batch_size_per_gpu": 2,
}


def issues_for(data: dict) -> list:
    with pytest.raises(SpecError) as exc:
        parse_spec(data)
    return exc.value.issues


def test_defaults_are_verls():
    spec = RunSpec()
    assert spec.actor_rollout_ref.actor.strategy == "fsdp"
    assert spec.data.train_batch_size == 1024
    assert spec.actor_rollout_ref.actor.ppo_mini_batch_size == 256
    assert spec.critic.optim.lr == 1e-5 and spec.actor_rollout_ref.actor.optim.lr == 1e-6
    assert spec.actor_rollout_ref.model.override_config == {}
    assert spec.world_size == 8 and spec.has_critic


def test_nested_and_dotted_keys_mean_the_same():
    nested = parse_spec({"actor_rollout_ref": {"model": {"override_config": {"attn_implementation": "eager"}}}})
    dotted = parse_spec({"actor_rollout_ref.model.override_config.attn_implementation": "eager"})
    mixed = parse_spec({"actor_rollout_ref.model": {"override_config": {"attn_implementation": "eager"}}})
    assert nested == dotted == mixed


def test_override_config_keeps_any_hf_key_recursively():
    spec = parse_spec({
        "critic.model.override_config.rope_scaling.type": "linear",
        "critic.model.override_config.rope_scaling.factor": 2.0,
        "critic.model.override_config.num_hidden_layers": 4,
    })
    assert spec.critic.model.override_config == {"rope_scaling": {"type": "linear", "factor": 2.0}, "num_hidden_layers": 4}


def test_deprecated_ulysses_alias_is_rewritten():
    spec = parse_spec({"actor_rollout_ref.actor.ulysses_sequence_parallel_size": 2})
    assert spec.actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size == 2


@pytest.mark.parametrize(
    "data,field,fragment",
    [
        ({"actor_rollout_ref.model.override_config.attn_implementation": "flash2"},
         "actor_rollout_ref.model.override_config.attn_implementation", "valid: eager, sdpa, flash_attention_2"),
        ({"critic.model.override_config.attn_implementation": 3},
         "critic.model.override_config.attn_implementation", "unknown attn_implementation 3"),
        ({"critic.lr": 1e-5}, "critic.lr", "did you mean 'critic.optim.lr'"),
        ({"actor_rollout_ref.actor.stratgy": "fsdp"}, "actor_rollout_ref.actor.stratgy",
         "did you mean 'actor_rollout_ref.actor.strategy'"),
        ({"actor_rollout_ref.actor.strategy": "megatron"}, "actor_rollout_ref.actor.strategy",
         "valid: fsdp, fsdp2, fsdp_turbo"),
        ({"algorithm.adv_estimator": "ppo"}, "algorithm.adv_estimator", "valid: gae, grpo"),
        ({"data.train_batch_size": 0}, "data.train_batch_size", "greater than 0"),
        ({"data.train_batch_size": "many"}, "data.train_batch_size", "'many' is not valid"),
        ({"data.max_prompt_length": -5}, "data.max_prompt_length", "out of range"),
        ({"actor_rollout_ref.rollout.top_p": 1.5}, "actor_rollout_ref.rollout.top_p", "less than or equal to 1"),
        ({"actor_rollout_ref.actor.optim.lr": 0}, "actor_rollout_ref.actor.optim.lr", "greater than 0"),
        ({"attnboard.fallback_policy": "sometimes"}, "attnboard.fallback_policy", "valid: strict, fallback"),
        ({"trainer.device": "tpu"}, "trainer.device", "valid: cpu, cuda, npu"),
        ({"attnboard.debug.output_attentions": "maybe"}, "attnboard.debug.output_attentions", "not valid"),
        ({"actor_rollout_ref.model.override_config": {"bad key": 1}}, "actor_rollout_ref.model.override_config",
         "not a Hugging Face config attribute name"),
    ],
)
def test_bad_fields_are_named(data, field, fragment):
    issues = issues_for(data)
    assert issues[0].field == field
    assert fragment in issues[0].message


def test_not_a_mapping():
    issues = issues_for(["a"])  # type: ignore[arg-type]
    assert "must be a mapping" in issues[0].message


def test_hub_kernel_names_are_accepted():
    for name in ("kernels-community/flash-attn", "org/repo@v1.2", "org/repo@main:fwd", "paged|sdpa"):
        assert parse_spec({"critic.model.override_config.attn_implementation": name})


@pytest.mark.parametrize(
    "dotted,field,fragment",
    [
        ({"actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size": 3},
         "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size", "must divide the world size (2"),
        ({"critic.ulysses_sequence_parallel_size": 4, "trainer.n_gpus_per_node": 2},
         "critic.ulysses_sequence_parallel_size", "must divide the world size"),
        ({"actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size": 2,
          "actor_rollout_ref.model.use_remove_padding": False},
         "actor_rollout_ref.model.use_remove_padding", SP_PADDING_MESSAGE),
        ({"actor_rollout_ref.actor.strategy": "fsdp_turbo", "actor_rollout_ref.actor.fsdp_config.turbo_cp_size": 2,
          "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size": 2},
         "actor_rollout_ref.actor.strategy", TURBO_CONFLICT_MESSAGE),
        ({"actor_rollout_ref.actor.fsdp_config.turbo_cp_size": 2},
         "actor_rollout_ref.actor.fsdp_config.turbo_cp_size", "only applies to strategy fsdp_turbo"),
        ({"actor_rollout_ref.actor.ppo_mini_batch_size": 3},
         "actor_rollout_ref.actor.ppo_mini_batch_size", "data.train_batch_size (8) must be divisible by ppo_mini_batch_size (3)"),
        ({"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 3},
         "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
         "(2 = 4 x 1 / 2) must be divisible by ppo_micro_batch_size_per_gpu (3)"),
        ({"critic.ppo_micro_batch_size_per_gpu": 4},
         "critic.ppo_micro_batch_size_per_gpu", "[critic] ppo_mini_batch_size per data-parallel rank"),
        ({"actor_rollout_ref.actor.ppo_mini_batch_size": 1, "data.train_batch_size": 1},
         "actor_rollout_ref.actor.ppo_mini_batch_size", "must be divisible by the data-parallel size (2"),
        ({"algorithm.adv_estimator": "grpo"}, "actor_rollout_ref.rollout.n", "rollout.n must be >= 2"),
        ({"trainer.resume_mode": "resume_path"}, "trainer.resume_from_path",
         "trainer.resume_mode=resume_path needs trainer.resume_from_path"),
    ],
)
def test_cross_field_errors(dotted, field, fragment):
    issues = [i for i in check_spec(parse_spec({**SMALL, **dotted})) if i.severity == "error"]
    assert issues, "expected an error"
    assert issues[0].field == field
    assert fragment in issues[0].message


def test_ulysses_must_divide_the_heads_when_the_model_is_known():
    spec = parse_spec({**SMALL, "trainer.n_gpus_per_node": 4,
                       "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size": 4})
    info = ModelInfo("LlamaForCausalLM", num_attention_heads=4, num_key_value_heads=2)
    issues = check_spec(spec, actor_model=info)
    assert any("num_key_value_heads (2" in i.message for i in issues)
    assert not any("num_attention_heads" in i.message for i in issues)


def test_critic_override_without_a_critic_is_reported():
    spec = parse_spec({**SMALL, "algorithm.adv_estimator": "grpo", "actor_rollout_ref.rollout.n": 2,
                       "critic.model.override_config.attn_implementation": "eager"})
    issues = check_spec(spec)
    assert [i.severity for i in issues] == ["warning"]
    assert "no critic runs with algorithm.adv_estimator=grpo" in issues[0].message


def test_validate_spec_raises_on_errors_and_returns_warnings():
    with pytest.raises(SpecError):
        validate_spec({**SMALL, "actor_rollout_ref.actor.ppo_mini_batch_size": 3})
    _, warnings = validate_spec({**SMALL, "algorithm.use_kl_in_reward": True,
                                    "actor_rollout_ref.actor.use_kl_loss": True})
    assert [w.severity for w in warnings] == ["warning"]


def test_issue_dict_truncates_huge_values():
    issues = issues_for({"data.train_files": "x" * 10_000_000})
    out = issues[0].as_dict()
    assert len(out["value"]) < 300 and "10000000 characters" in out["value"]


@pytest.mark.parametrize("key,expected", [
    ("critic.lr", "critic.optim.lr"),
    ("data.train_batch", "data.train_batch_size"),
    ("trainer.total_steps", "trainer.total_training_steps"),
])
def test_nearest_key(key, expected):
    assert nearest_key(key) == expected


def test_spec_keys_are_leaves():
    assert "actor_rollout_ref.model.override_config" in SPEC_KEYS
    assert "attnboard.debug.output_attentions" in SPEC_KEYS
    assert not any(k.endswith(".model") for k in SPEC_KEYS)


flat_values = st.one_of(st.integers(-5, 5), st.booleans(), st.text(max_size=5), st.none())


@given(st.dictionaries(st.from_regex(r"[a-z]{1,3}(\.[a-z]{1,3}){0,3}", fullmatch=True), flat_values, max_size=6))
def test_unflatten_then_flatten_keeps_leaves(flat):
    # Keys that are prefixes of other keys collapse: only check keys that are leaves.
    leaves = {k: v for k, v in flat.items() if not any(o.startswith(k + ".") for o in flat)}
    back = flatten(unflatten(leaves))
    assert {k: v for k, v in back.items() if k in leaves} == leaves


def test_tree_and_flat_round_trip():
    spec = parse_spec({**SMALL, "critic.model.override_config.rope_scaling.type": "linear"})
    assert parse_spec(spec_to_tree(spec)) == spec
    assert parse_spec(spec_to_flat(spec)) == spec


@pytest.mark.parametrize("where", ["spec", "passthrough"])
def test_unknown_keys_are_capped_per_spec(where):
    """5,000 unknown keys cost ~MAX_SUGGESTED_KEYS "did you mean" matches, not 5,000 (issue 18: 8.3 s of CPU)."""
    import time

    from worker.spec.schema import MAX_SUGGESTED_KEYS, MAX_UNKNOWN_KEYS

    keys = {f"trainer.totl_training_steps_{i}": 1 for i in range(1_900)}
    data = keys if where == "spec" else {"verl_passthrough": keys}
    t0 = time.perf_counter()
    with pytest.raises(SpecError) as caught:
        parse_spec(data)
    assert time.perf_counter() - t0 < 1.0
    issues = caught.value.issues
    assert len(issues) == MAX_UNKNOWN_KEYS + 1
    assert issues[-1].message.startswith(f"{1_900 - MAX_UNKNOWN_KEYS} more unknown keys are not listed")
    hinted = [i for i in issues if "did you mean" in i.message]
    assert 1 <= len(hinted) <= MAX_SUGGESTED_KEYS
