"""Small valid specs and helpers for the app tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from app.models import Run
from app.services.launcher import LauncherUnavailable

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


def engine_headers(client, run_id: int) -> dict[str, str]:
    """The headers the engine posts run ``run_id``'s events with (its ingest credential); user tokens cannot.
    ``client`` is a TestClient or the app itself."""
    from app.services.events import INGEST_HEADER, ingest_credential

    app = getattr(client, "app", client)
    return {INGEST_HEADER: ingest_credential(app.state.settings.SECRET_KEY, run_id)}


def status_event(seq: int, status: str, reason: str | None = None) -> dict[str, Any]:
    payload: dict[str, Any] = {"status": status}
    if reason is not None:
        payload["reason"] = reason
    return {"seq": seq, "kind": "status", "payload": payload}


def log_event(seq: int, text: str = "hello") -> dict[str, Any]:
    return {"seq": seq, "kind": "log", "payload": {"text": text}}


class RecordingLauncher:
    """A launcher that accepts every run and remembers the calls, so API tests reach the submitted-run paths
    without starting compute (the Ray launcher's own tests run real runs)."""

    def __init__(self, fail: bool = False):
        self.submitted: list[int] = []
        self.cancelled: list[int] = []
        self.fail = fail

    def submit(self, run: Run) -> str | None:
        if self.fail:
            raise LauncherUnavailable("Ray at 127.0.0.1:6379 is not reachable")
        self.submitted.append(run.id)
        return f"job-{run.id}"

    def cancel(self, run: Run) -> None:
        self.cancelled.append(run.id)


# Qwen2.5-0.5B's config.json: 14 attention heads, 2 key/value heads.
QWEN2_05B_CONFIG = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864,
    "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2, "vocab_size": 151936,
    "max_position_embeddings": 32768, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "tie_word_embeddings": True,
    "torch_dtype": "bfloat16", "use_sliding_window": False, "hidden_act": "silu",
}
HEADS_ERRORS = [
    "[actor] ulysses_sequence_parallel_size (4) must divide the model's num_attention_heads (14, Qwen2ForCausalLM)",
    "[actor] ulysses_sequence_parallel_size (4) must divide the model's num_key_value_heads (2, Qwen2ForCausalLM)",
]


def sp4_spec(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    """A Qwen2.5-0.5B-shaped folder (14 heads, 2 kv heads) and a spec asking Ulysses SP 4 of it."""
    model = tmp_path / "models" / "qwen2-0.5b"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps(QWEN2_05B_CONFIG))
    spec = {"actor_rollout_ref.model.path": str(model),
            "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size": 4,
            "actor_rollout_ref.model.override_config.attn_implementation": "sdpa",
            "algorithm.adv_estimator": "grpo", "actor_rollout_ref.rollout.n": 2,
            "data.train_batch_size": 64, "actor_rollout_ref.actor.ppo_mini_batch_size": 16,
            "trainer.n_gpus_per_node": 8, "data.train_files": "builtin:count"}
    return model, spec
