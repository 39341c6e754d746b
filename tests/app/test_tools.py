"""The resolution preview and verl import over HTTP, on the seed's examples."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.errors import AppError
from app.services.interop import MAX_YAML_NODES, check_yaml_safety

SEED = Path(__file__).resolve().parents[1] / "fixtures" / "seed"


@pytest.mark.parametrize("env,actor", [("cpu", ("eager", "ok")), ("cuda-sm80-fa2", ("eager", "ok"))])
def test_resolve_an_override(client, read_headers, env, actor):
    spec = {"actor_rollout_ref.model.override_config.attn_implementation": "eager"}
    body = client.post("/api/resolve", json={"spec": spec, "environment": env}, headers=read_headers).json()
    roles = body["resolution"]["roles"]
    assert (roles["actor"]["effective"], roles["actor"]["status"]) == actor
    assert roles["actor"]["source"] == "override" and body["resolution"]["environment"] == env
    assert set(roles) >= {"actor", "rollout", "reference", "critic"}


def test_resolve_default_on_a_t4_is_an_error_under_strict(client, read_headers):
    body = client.post("/api/resolve", json={"spec": {}, "environment": "cuda-sm75"}, headers=read_headers).json()
    actor = body["resolution"]["roles"]["actor"]
    assert (actor["requested"], actor["source"], actor["status"]) == ("flash_attention_2", "default", "error")
    assert body["resolution"]["ok"] is False


@pytest.mark.parametrize("rollout_name,env,under_verl", [
    ("vllm", "cuda-sm90-fa2", "vllm:FLASH_ATTN"), ("vllm", "cuda-sm75", "vllm:error"), ("sglang", "cuda-sm80-fa2",
                                                                                        "sglang:flashinfer"),
    ("trtllm", "cuda-sm90-fa2", "trtllm:TRTLLM"), ("hf", "cuda-sm90-fa2", None)])
def test_resolve_tells_the_rollout_engine_apart(client, read_headers, rollout_name, env, under_verl):
    """The rollout row: what attnboard runs (the actor's HF model) and, apart, what verl's engine runs."""
    spec = {"actor_rollout_ref.rollout.name": rollout_name}
    roles = client.post("/api/resolve", json={"spec": spec, "environment": env}, headers=read_headers).json()[
        "resolution"]["roles"]
    assert roles["rollout"]["effective"] == roles["actor"]["effective"]
    assert (roles["rollout"]["under_verl"] or {}).get("effective") == under_verl
    if under_verl:
        assert roles["rollout"]["under_verl"]["reached_by_override_config"] is False
        assert "rollout-engine" in [r["rule"] for r in roles["rollout"]["reasons"]]
    assert all(roles[r]["under_verl"] is None for r in ("actor", "reference", "critic"))


def test_resolve_reports_cross_field_issues(client, read_headers):
    spec = {"data.train_batch_size": 10, "actor_rollout_ref.actor.ppo_mini_batch_size": 4, "trainer.n_gpus_per_node": 1}
    body = client.post("/api/resolve", json={"spec": spec, "environment": "cpu"}, headers=read_headers).json()
    # (the warnings say the model folder was not read: not inside ATTNBOARD_MODEL_ROOTS; the paths of verl's
    # defaults lie outside every allowed folder, as POST /api/runs would refuse them)
    assert [(i["field"], i["message"].split(" is outside")[0]) for i in body["issues"] if i["severity"] == "error"] == [
        ("spec.actor_rollout_ref.model.path", "actor_rollout_ref.model.path '~/models/deepseek-llm-7b-chat'"),
        ("spec.critic.model.path", "critic.model.path '~/models/deepseek-llm-7b-chat'"),
        ("spec.data.train_files", "data.train_files '~/data/rlhf/gsm8k/train.parquet'"),
        ("spec.actor_rollout_ref.actor.ppo_mini_batch_size",
         "[actor] data.train_batch_size (10) must be divisible by ppo_mini_batch_size (4)")]


def test_resolve_on_a_probe_dict(client, read_headers):
    probe = {"name": "my-node", "device": "cuda", "compute_capability": [9, 0], "flash_attn_version": "2.8.3"}
    body = client.post("/api/resolve", json={"spec": {}, "environment": probe}, headers=read_headers).json()
    assert body["resolution"]["environment"] == "my-node"


@pytest.mark.parametrize("example,critic", [("critic.sh", "eager"), ("seed.yaml", "eager"), ("eager.sh", None)])
def test_import_seed_examples(client, read_headers, example, critic):
    text = (SEED / example).read_text()
    body = client.post("/api/import", json={"text": text}, headers=read_headers).json()
    assert body["format"] == ("yaml" if example.endswith(".yaml") else "cli")
    assert body["spec"]["actor_rollout_ref"]["model"]["override_config"]["attn_implementation"] == "eager"
    assert body["spec"]["critic"]["model"]["override_config"].get("attn_implementation") == critic
    # what was imported is a valid spec the API accepts as is
    resp = client.post("/api/resolve", json={"spec": body["spec"], "environment": "cpu"}, headers=read_headers)
    assert resp.status_code == 200


def test_import_errors_name_the_token_and_position(client, read_headers):
    text = "python3 -m verl.trainer.main_ppo trainer.devcie=cpu"
    error = client.post("/api/import", json={"text": text}, headers=read_headers).json()["error"]
    first = error["issues"][0]
    assert first["token"] == "trainer.devcie=cpu" and first["position"] == text.index("trainer.devcie")
    assert "trainer.devcie" in error["message"]


@pytest.mark.parametrize("text", [
    "a: &a [x, x]\nb: &b [*a, *a]\nc: [*b, *b]\n",  # small aliases are fine
    "trainer:\n  device: cpu\n",
    "",
])
def test_yaml_guard_accepts_ordinary_documents(text):
    check_yaml_safety(text)


def test_yaml_guard_counts_nodes_with_aliases_followed():
    levels = ["a: &a [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]"]
    for i in range(1, 6):
        prev, cur = chr(96 + i), chr(97 + i)
        levels.append(f"{cur}: &{cur} [{', '.join(['*' + prev] * 10)}]")
    with pytest.raises(AppError) as info:
        check_yaml_safety("\n".join(levels))
    assert info.value.code == "yaml_too_large" and str(MAX_YAML_NODES) in info.value.message


def test_yaml_guard_reports_line_and_column():
    with pytest.raises(AppError) as info:
        check_yaml_safety("a: 1\nb: [2, 3\n")
    assert info.value.code == "invalid_yaml" and "line 3" in info.value.message
