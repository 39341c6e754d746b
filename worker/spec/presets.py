"""Ready-made specs. ``tiny_cpu_spec`` is the one place that says how a small CPU run (tests, demos,
the smoke run) is configured; tune the learning settings here."""

from __future__ import annotations

from typing import Any

from worker.ppo import advantage
from worker.spec import RunSpec, validate_spec

TINY_CPU: dict[str, Any] = {
    # models: built-in presets, attention explicit on both roles so nothing depends on verl's FA2 default
    "actor_rollout_ref.model.path": "builtin:tiny-llama",
    "actor_rollout_ref.model.override_config": {"attn_implementation": "sdpa"},
    "actor_rollout_ref.model.enable_gradient_checkpointing": False,
    "critic.model.path": "builtin:tiny-llama",
    "critic.model.override_config": {"attn_implementation": "sdpa"},
    "critic.model.enable_gradient_checkpointing": False,
    "actor_rollout_ref.actor.strategy": "fsdp2",
    "critic.strategy": "fsdp2",
    # batches: 8 prompts x 4 samples = 32 sequences a step; per rank (2 ranks) a mini batch of
    # 4 x 4 / 2 = 8 sequences in micro batches of 2
    "data.train_files": "builtin:count",
    "data.train_batch_size": 8,
    "data.max_prompt_length": 16,
    "data.max_response_length": 8,
    "actor_rollout_ref.rollout.n": 4,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 4,
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 2,
    "critic.ppo_micro_batch_size_per_gpu": 2,
    # learning: rates at which the tiny model measurably learns builtin:count within 30 steps
    # (tests/worker/ppo/test_data.py measures 0.05 -> 0.2 mean reward in 15 plain policy-gradient steps at 3e-3)
    "actor_rollout_ref.actor.optim.lr": 3e-3,
    "critic.optim.lr": 3e-3,
    "actor_rollout_ref.actor.optim.weight_decay": 0.0,
    "critic.optim.weight_decay": 0.0,
    "algorithm.adv_estimator": "gae",
    "algorithm.gamma": 1.0,
    "algorithm.lam": 1.0,
    # precision, out loud: fp32 everywhere (verl's default is bf16 compute over fp32 master weights;
    # this machine's CPUs run bf16 matmuls slowly)
    "actor_rollout_ref.actor.fsdp_config.dtype": "fp32",
    "actor_rollout_ref.ref.fsdp_config.dtype": "fp32",
    "actor_rollout_ref.rollout.dtype": "fp32",
    "critic.fsdp.dtype": "fp32",
    # a 2-rank CPU run with gloo
    "trainer.device": "cpu",
    "trainer.n_gpus_per_node": 2,
    "trainer.nnodes": 1,
    "trainer.total_training_steps": 30,
    "trainer.project_name": "attnboard",
    "trainer.experiment_name": "tiny-cpu",
    "attnboard.fallback_policy": "strict",
    "attnboard.seed": 0,
}


def tiny_cpu_spec(**dotted_overrides: Any) -> RunSpec:
    """A small, valid spec for CPU runs and tests; keys as dotted names, given with ``**``::

        tiny_cpu_spec(**{"algorithm.adv_estimator": "grpo", "trainer.total_training_steps": 5})

    An override of ``...override_config`` replaces the whole dict. Without an estimator that reads a critic
    (gae) there is no critic, so the critic's override_config is left empty unless given. Raises SpecError
    when the result is not a valid spec (each problem named by its key).
    """
    flat = {**TINY_CPU, **dotted_overrides}
    if not advantage.needs_critic(flat["algorithm.adv_estimator"]) and "critic.model.override_config" not in dotted_overrides:
        flat["critic.model.override_config"] = {}  # no critic runs: an override would only draw a warning
    spec, _warnings = validate_spec(flat)
    return spec
