"""Every invalid request gets a 4xx JSON error naming the field (and, where the contract in
``tests/app/error_shape.py`` asks, the value and what is valid), never a 500.

Each row: (method, path, request kwargs, expected status, the field the error must name). ``{run}`` and
``{spec}`` in paths are an existing run and saved spec. The TestClient re-raises server exceptions,
so a would-be 500 fails the test with its traceback.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.app.error_shape import assert_error_shape
from tests.app.factories import engine_headers, tiny_spec

ALIAS_BOMB = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8)
)


def spec_case(dotted: str, value: Any, field: str | None = None, status: int = 422) -> tuple:
    """An inline run whose spec has ``dotted`` set to ``value``: the error must name that key."""
    return ("POST", "/api/runs", {"json": {"spec": tiny_spec(**{dotted: value})}}, status, field or f"spec.{dotted}")


CASES = [
    # -- every kind of spec field with a wrong type or an out-of-range value
    spec_case("data.train_batch_size", "many"),
    spec_case("data.train_batch_size", 0),
    spec_case("data.train_batch_size", -5),
    spec_case("data.max_prompt_length", 10**12),
    spec_case("data.train_files", ""),
    spec_case("actor_rollout_ref.actor.ppo_mini_batch_size", 3),  # 4 % 3: batch arithmetic
    spec_case("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", 0),
    spec_case("actor_rollout_ref.actor.optim.lr", 0),
    spec_case("actor_rollout_ref.actor.optim.lr", "fast"),
    spec_case("actor_rollout_ref.actor.clip_ratio", -1),
    spec_case("actor_rollout_ref.actor.strategy", "deepspeed"),
    spec_case("actor_rollout_ref.actor.kl_loss_type", "kl2"),
    spec_case("actor_rollout_ref.actor.use_kl_loss", "sometimes"),
    spec_case("actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size", 3),
    spec_case("actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size", 0),
    spec_case("actor_rollout_ref.model.path", ""),
    spec_case("actor_rollout_ref.model.path", ["a", "b"]),
    spec_case("actor_rollout_ref.model.override_config.attn_implementation", "flash_attention_9"),
    spec_case("critic.model.override_config.attn_implementation", 7),
    spec_case("actor_rollout_ref.model.override_config", "eager"),
    spec_case("actor_rollout_ref.rollout.n", 0),
    spec_case("actor_rollout_ref.rollout.temperature", -1.0),
    spec_case("actor_rollout_ref.rollout.top_p", 2),
    spec_case("actor_rollout_ref.rollout.name", "trt"),
    spec_case("critic.cliprange_value", 0),
    spec_case("critic.strategy", "ddp"),
    spec_case("algorithm.adv_estimator", "reinforce"),
    spec_case("algorithm.gamma", 1.5),
    spec_case("algorithm.lam", "high"),
    spec_case("algorithm.kl_ctrl.kl_coef", -0.1),
    spec_case("trainer.device", "tpu"),
    spec_case("trainer.n_gpus_per_node", 0),
    spec_case("trainer.total_training_steps", -1),
    spec_case("trainer.project_name", "p" * 500),
    spec_case("attnboard.fallback_policy", "maybe"),
    spec_case("attnboard.seed", -1),
    spec_case("attnboard.debug.output_attentions", "yes please"),
    spec_case("trainer.n_gpu_per_node", 1),  # unknown key (nearest: n_gpus_per_node)
    spec_case("colour", "red"),  # unknown top-level key
    ("POST", "/api/runs", {"content": b'{"spec": {"trainer": {"total_training_steps": Infinity}}}'}, 422,
     "spec.trainer.total_training_steps"),
    # -- the request around the spec
    ("POST", "/api/runs", {"json": {"spec": [1, 2]}}, 422, "spec"),
    ("POST", "/api/runs", {"json": {"spec": "python3 -m verl"}}, 422, "spec"),
    ("POST", "/api/runs", {"json": {"spec": {}, "colour": "red"}}, 422, "colour"),
    ("POST", "/api/runs", {"json": {"spec": {}, "spec_id": 1}}, 422, "spec_id"),
    ("POST", "/api/runs", {"json": {"name": "nothing to run"}}, 422, "spec"),
    ("POST", "/api/runs", {"json": {"spec_id": "abc"}}, 422, "spec_id"),
    ("POST", "/api/runs", {"json": {"spec_id": 987654}}, 404, "spec_id"),
    ("POST", "/api/runs", {"json": {"spec_id": 2**40}}, 422, "spec_id"),
    ("POST", "/api/runs", {"json": {"name": "", "spec": {}}}, 422, "name"),
    ("POST", "/api/runs", {"json": {"name": "n" * 300, "spec": {}}}, 422, "name"),
    ("POST", "/api/runs", {"json": {"name": "a\x00b", "spec": {}}}, 422, "name"),
    ("POST", "/api/runs", {"json": {"name": 12, "spec": {}}}, 422, "name"),
    ("POST", "/api/runs", {"content": b'{"name": "\\ud800", "spec": {}}'}, 422, "name"),
    ("POST", "/api/runs", {"content": b'{"spec": {"trainer.project_name": "\\ud83d"}}'}, 422, "spec.trainer.project_name"),
    ("POST", "/api/runs", {"content": b'{"spec": {"\\udc00": 1}}'}, 422, "spec.\\udc00"),
    ("POST", "/api/runs", {"content": b'{"spec": {"data": {"train_batch_size": NaN}}}'}, 422, "spec.data.train_batch_size"),
    ("POST", "/api/runs", {"json": {"name": "x" * 10_000_000, "spec": {}}}, 413, "(body)"),
    ("POST", "/api/runs", {"content": b'{"name": "\xff\xfe", "spec": {}}'}, 400, "(body)"),
    ("POST", "/api/runs", {"content": b'{"name": "run", "spec": {'}, 422, "(body)"),
    ("POST", "/api/runs", {"content": b"[]"}, 422, "(body)"),
    ("POST", "/api/runs", {"content": b""}, 422, "(body)"),
    ("POST", "/api/specs", {"json": {"spec": {}}}, 422, "name"),
    ("POST", "/api/specs", {"json": {"name": "s", "spec": tiny_spec(**{"trainer.device": "gpu"})}}, 422,
     "spec.trainer.device"),
    ("PUT", "/api/specs/{spec}", {"json": {"description": "d" * 5000}}, 422, "description"),
    # -- resolution preview
    ("POST", "/api/resolve", {"json": {"spec": {}, "environment": "tpu-v5"}}, 422, "environment"),
    ("POST", "/api/resolve", {"json": {"spec": {}, "environment": {"name": "x", "device": "tpu"}}}, 422,
     "environment.device"),
    ("POST", "/api/resolve", {"json": {"spec": {}, "environment": {"name": "x", "gpus": 8}}}, 422, "environment"),
    ("POST", "/api/resolve", {"json": {"spec": {}, "environment": 42}}, 422, "environment"),
    ("POST", "/api/resolve", {"json": {"spec": {"critic.model.override_config.attn_implementation": "fast"}}}, 422,
     "spec.critic.model.override_config.attn_implementation"),
    ("POST", "/api/troubleshooting/recheck", {"json": {"environment": {"name": "x", "gpus": 8}}}, 422,
     "environment.gpus"),
    ("POST", "/api/troubleshooting/recheck", {"json": {"environment": "tpu-v5"}}, 422, "environment"),
    ("POST", "/api/troubleshooting/recheck", {"json": {"environment": 7}}, 422, "environment"),
    # -- verl import
    ("POST", "/api/import", {"json": {"text": "a: [1, 2\nb: {", "format": "yaml"}}, 422, "text"),
    ("POST", "/api/import", {"json": {"text": ALIAS_BOMB}}, 422, "text"),
    ("POST", "/api/import", {"json": {"text": "python3 -m verl.trainer.main_ppo trainer.device='cpu"}}, 422, "text"),
    ("POST", "/api/import", {"json": {"text": "python3 -m verl.trainer.main_ppo trainer.devcie=cpu"}}, 422, "text"),
    ("POST", "/api/import",
     {"json": {"text": "python3 -m verl.trainer.main_ppo actor_rollout_ref.model.override_config.attn_implementation=fa9"}},
     422, "attn_implementation"),
    ("POST", "/api/import", {"json": {"text": "   \n  "}}, 422, "text"),
    ("POST", "/api/import", {"json": {"text": 123}}, 422, "text"),
    ("POST", "/api/import", {"json": {"text": "trainer:\n  device: cpu\n", "format": "toml"}}, 422, "format"),
    ("POST", "/api/import", {"json": {"text": "x" * 300_000}}, 422, "text"),
    ("POST", "/api/import", {"json": {"text": ""}}, 422, "text"),
    # -- lists, ids and pagination
    ("GET", "/api/runs?status=exploded", {}, 422, "status"),
    ("GET", "/api/runs?limit=0", {}, 422, "limit"),
    ("GET", "/api/runs?limit=100000", {}, 422, "limit"),
    ("GET", "/api/runs?limit=ten", {}, 422, "limit"),
    ("GET", "/api/runs?offset=-1", {}, 422, "offset"),
    ("GET", "/api/runs?created_after=yesterday", {}, 422, "created_after"),
    ("GET", "/api/runs?created_after=2030-01-01T00:00:00Z&created_before=2020-01-01T00:00:00Z", {}, 422,
     "created_after"),
    ("GET", "/api/runs?name=%00", {}, 422, "name"),
    ("GET", "/api/runs?created_before=0001-01-01T00:00:00%2B01:00", {}, 422, "created_before"),
    ("GET", "/api/runs?created_after=2026", {}, 422, "created_after"),  # not 1970-01-01T00:33:46Z
    ("GET", "/api/runs?created_before=0.5", {}, 422, "created_before"),
    ("GET", "/api/specs?limit=-3", {}, 422, "limit"),
    ("GET", "/api/runs/987654", {}, 404, "run_id"),
    ("GET", "/api/runs/abc", {}, 422, "run_id"),
    ("GET", "/api/runs/99999999999999999999", {}, 422, "run_id"),
    ("GET", "/api/specs/0", {}, 422, "spec_id"),
    ("GET", "/api/runs/{run}/events?after=-1", {}, 422, "after"),
    ("GET", "/api/runs/{run}/events?limit=5000", {}, 422, "limit"),
    ("GET", "/api/runs/987654/events", {}, 404, "run_id"),
    # -- exports
    ("GET", "/api/runs/{run}/export?format=toml", {}, 422, "format"),
    ("GET", "/api/specs/{spec}/export?format=json", {}, 422, "format"),
    # -- actions
    ("POST", "/api/runs/987654/cancel", {}, 404, "run_id"),
    ("POST", "/api/runs/{run}/retry", {"json": {"patch": {"trainer.device": "tpu"}}}, 422, "spec.trainer.device"),
    ("POST", "/api/runs/{run}/retry", {"json": {"patch": {"trainer..device": "cpu"}}}, 422, "patch.trainer..device"),
    ("POST", "/api/runs/{run}/retry", {"json": {"patch": "eager"}}, 422, "patch"),
    ("POST", "/api/runs/{run}/clone", {"json": {"name": ""}}, 422, "name"),
    ("POST", "/api/runs/{run}/events", {"json": [{"seq": 5, "kind": "log", "payload": {}}]}, 409, "seq"),
    ("POST", "/api/runs/{run}/events", {"json": [{"seq": 1, "kind": "weird", "payload": {}}]}, 422, "0.kind"),
    ("POST", "/api/runs/{run}/events", {"json": [{"seq": 0, "kind": "log", "payload": {}}]}, 422, "0.seq"),
    ("POST", "/api/runs/{run}/events", {"json": [{"seq": 1, "kind": "log", "payload": {}, "ts": 0}]}, 422, "0.ts"),
    ("POST", "/api/runs/{run}/events", {"json": [{"seq": 1, "kind": "status", "payload": {"status": "done"}}]}, 422,
     "payload.status"),
    ("POST", "/api/runs/{run}/events", {"json": [{"seq": 1, "kind": "status", "payload": {"status": "succeeded"}}]},
     409, "status"),
    ("POST", "/api/tokens", {"json": {"name": "ci", "scopes": ["root"]}}, 422, "scopes"),
    ("POST", "/api/tokens", {"json": {"name": "ci", "scopes": []}}, 422, "scopes"),
    # -- routing
    ("GET", "/api/nothing-here", {}, 404, "path"),
    ("DELETE", "/api/runs", {}, 405, "method"),
]


@pytest.fixture
def existing(client, write_headers) -> dict[str, int]:
    spec = client.post("/api/specs", json={"name": "saved", "spec": tiny_spec()}, headers=write_headers).json()
    run = client.post("/api/runs", json={"spec_id": spec["id"]}, headers=write_headers).json()
    return {"spec": spec["id"], "run": run["id"]}


def test_there_are_enough_distinct_cases():
    distinct = {(m, p, repr(k)) for m, p, k, _, _ in CASES}
    assert len(distinct) == len(CASES) >= 40


@pytest.mark.parametrize("method,path,kwargs,status,field", CASES, ids=[f"{c[0]} {c[1][:40]} {c[4]}" for c in CASES])
def test_bad_input_is_a_clear_4xx(client, write_headers, admin_headers, existing, method, path, kwargs, status, field):
    headers = {**(admin_headers if path.startswith("/api/tokens") else write_headers)}
    if path.endswith("/events") and method == "POST":  # only the engine posts events
        headers.update(engine_headers(client, existing["run"]))
    if "content" in kwargs:
        headers["content-type"] = "application/json"
    resp = client.request(method, path.format(**existing), headers=headers, **kwargs)
    assert resp.status_code == status, resp.text[:2000]
    assert resp.headers["content-type"].startswith("application/json")
    assert_error_shape(resp.status_code, resp.json())
    error = resp.json()["error"]
    named = [error["field"] or ""] + [i.get("field") or "" for i in error["issues"]]
    assert any(n == field or n.startswith(field + ".") or n.endswith("." + field) for n in named), (field, error)


@pytest.mark.parametrize("body,field,known", [
    ({"spec": {}, "colour": "red"}, "colour", ["environment", "name", "spec", "spec_id"]),
    ({"spec": {"": 1}}, "spec.", ["actor_rollout_ref", "algorithm", "attnboard", "critic", "custom_reward_function",
                                  "data", "model_engine", "trainer"]),
])
def test_an_unknown_key_lists_the_valid_ones(client, write_headers, body, field, known):
    error = client.post("/api/runs", json=body, headers=write_headers).json()["error"]
    assert (error["field"], error["valid"]) == (field, known)


@pytest.mark.parametrize("query,valid", [
    ("limit=0", ">= 1"), ("limit=ten", "an integer"), ("offset=-1", ">= 0"), ("status=exploded", None),
    ("name=" + "n" * 300, "at most 200 characters"),
])
def test_a_query_error_says_what_is_valid(client, query, valid):
    error = client.get(f"/api/runs?{query}").json()["error"]
    if valid is None:  # the run states, from the enum
        assert error["valid"] == ["queued", "starting", "running", "succeeded", "failed", "cancelled"]
    else:
        assert error["valid"] == valid
