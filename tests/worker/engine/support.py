"""What the engine's trial tests share: the smallest spec a trial trains (tiny llama on the count data, CPU, one rank)."""

from __future__ import annotations

from typing import Any

TINY: dict[str, Any] = {
    "actor_rollout_ref.model.path": "builtin:tiny-llama",
    "critic.model.path": "builtin:tiny-llama",
    "data.train_files": "builtin:count",
    "data.train_batch_size": 4,
    "data.max_response_length": 8,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 2,
    "trainer.device": "cpu",
    "trainer.n_gpus_per_node": 1,
}
