"""The tiny CPU spec: valid, warning-free, and what the tests and the smoke run rely on."""

from __future__ import annotations

import pytest

from worker.spec import SpecError, check_spec, spec_to_tree, validate_spec
from worker.spec.presets import tiny_cpu_spec


@pytest.mark.parametrize("estimator", ["gae", "grpo"])
def test_tiny_cpu_spec_is_valid_without_warnings(estimator):
    spec = tiny_cpu_spec(**{"algorithm.adv_estimator": estimator})
    again, warnings = validate_spec(spec_to_tree(spec))
    assert again == spec
    assert warnings == []
    assert spec.has_critic == (estimator == "gae")


def test_tiny_cpu_spec_values():
    spec = tiny_cpu_spec()
    arr = spec.actor_rollout_ref
    assert (spec.trainer.device, spec.world_size) == ("cpu", 2)
    assert arr.model.path == spec.critic.model.path == "builtin:tiny-llama"
    assert arr.model.override_config == spec.critic.model.override_config == {"attn_implementation": "sdpa"}
    assert spec.attnboard.fallback_policy == "strict"
    assert spec.data.train_files == "builtin:count"
    assert (spec.data.max_prompt_length, spec.data.max_response_length) == (16, 8)
    assert spec.total_steps == 30
    # per data-parallel rank: mini batch x n / world, split in micro batches
    per_rank = arr.actor.ppo_mini_batch_size * arr.rollout.n // spec.world_size
    assert per_rank % arr.actor.ppo_micro_batch_size_per_gpu == 0
    assert per_rank % spec.critic.ppo_micro_batch_size_per_gpu == 0


def test_overrides_apply_and_invalid_ones_are_named():
    spec = tiny_cpu_spec(**{"trainer.total_training_steps": 3,
                            "critic.model.override_config": {"attn_implementation": "eager"}})
    assert spec.total_steps == 3 and spec.critic.model.override_config == {"attn_implementation": "eager"}
    assert check_spec(spec) == []
    with pytest.raises(SpecError, match=r"data.train_batch_size \(6\) must be divisible by ppo_mini_batch_size \(4\)"):
        tiny_cpu_spec(**{"data.train_batch_size": 6})
    with pytest.raises(SpecError, match=r"trainer\.n_gpu"):
        tiny_cpu_spec(**{"trainer.n_gpu": 2})
