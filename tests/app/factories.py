"""Small valid specs and helpers for the app tests."""

from __future__ import annotations

from typing import Any

TINY_SPEC: dict[str, Any] = {
    "actor_rollout_ref.model.path": "builtin:tiny-llama",
    "critic.model.path": "builtin:tiny-llama",
    "data.train_files": "builtin:count",
    "data.train_batch_size": 4,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 2,
    "trainer.device": "cpu",
    "trainer.n_gpus_per_node": 1,
    "trainer.total_training_steps": 3,
}


def tiny_spec(**overrides: Any) -> dict[str, Any]:
    """TINY_SPEC with dotted-key overrides (``tiny_spec(**{"algorithm.adv_estimator": "grpo"})``)."""
    return {**TINY_SPEC, **overrides}


def make_run(client, headers, name: str = "run", **spec_overrides: Any) -> dict[str, Any]:
    resp = client.post("/api/runs", json={"name": name, "spec": tiny_spec(**spec_overrides)}, headers=headers)
    assert resp.status_code == 201, resp.text
    return resp.json()


def status_event(seq: int, status: str, reason: str | None = None) -> dict[str, Any]:
    payload: dict[str, Any] = {"status": status}
    if reason is not None:
        payload["reason"] = reason
    return {"seq": seq, "kind": "status", "payload": payload}


def log_event(seq: int, text: str = "hello") -> dict[str, Any]:
    return {"seq": seq, "kind": "log", "payload": {"text": text}}
