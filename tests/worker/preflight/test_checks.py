"""Preflight, pure: a spec, its preview and the facts -> findings with keys and suggested values."""

from __future__ import annotations

import pytest

from worker.attention.preview import preview
from worker.core.environment import PROFILES
from worker.preflight import Facts, adapt_patch, preflight, resource_findings
from worker.spec import RunSpec, parse_spec, validate_spec
from worker.spec.presets import TINY_CPU, tiny_cpu_spec

CPU = PROFILES["cpu"]
ATTN = "actor_rollout_ref.model.override_config.attn_implementation"
CRITIC_ATTN = "critic.model.override_config.attn_implementation"


def _run(spec: RunSpec, facts: Facts | None = None, env=CPU):
    shown = preview(spec, env)
    return preflight(spec, env, issues=shown.issues, resolution=shown.resolution, facts=facts or Facts())


def test_the_tiny_cpu_preset_finds_nothing_on_cpu():
    result = _run(tiny_cpu_spec(), Facts(cluster_total={"CPU": 2}))
    assert result.findings == [] and result.ok and adapt_patch(result) == {}


def test_strict_flash_attention_on_cpu_gets_eager_on_every_failing_setting():
    spec = tiny_cpu_spec(**{"actor_rollout_ref.model.override_config": {"attn_implementation": "flash_attention_2"},
                            "critic.model.override_config": {"attn_implementation": "flash_attention_2"}})
    result = _run(spec)
    assert not result.ok
    attention = {f.key: f for f in result.findings if f.kind == "attention"}
    assert set(attention) == {ATTN, CRITIC_ATTN}
    assert attention[ATTN].value == "flash_attention_2" and attention[ATTN].suggested == "eager"
    assert "actor" in attention[ATTN].problem and "critic" in attention[CRITIC_ATTN].problem
    assert result.remedy["patch"] == {ATTN: "eager", CRITIC_ATTN: "eager"}
    assert set(result.remedy["roles"]) == {"actor", "rollout", "reference", "critic"}
    assert "Fall back to eager" in result.remedy["sentence"]


@pytest.mark.parametrize("nodes,per_node,device,total,key,suggested", [
    (1, 8, "cpu", {"CPU": 2}, "trainer.n_gpus_per_node", 2),
    (1, 2, "cpu", {"CPU": 2}, None, None),
    (1, 4, "cuda", {"CPU": 16, "GPU": 2}, "trainer.n_gpus_per_node", 2),
    (2, 1, "cpu", {"CPU": 1}, "trainer.nnodes", 1),
    (1, 1, "cuda", {"CPU": 16}, "trainer.n_gpus_per_node", None),
])
def test_resources_the_cluster_can_never_offer(nodes, per_node, device, total, key, suggested):
    spec = tiny_cpu_spec(**{"trainer.nnodes": nodes, "trainer.n_gpus_per_node": per_node})
    found = resource_findings(spec, device, total)
    if key is None:
        assert found == []
        return
    assert [(f.key, f.suggested, f.kind, f.blocking) for f in found] == [(key, suggested, "resources", True)]
    assert "more than the cluster has in all" in found[0].problem
    assert resource_findings(spec, device, None) == []  # unknown cluster: no finding


def test_device_against_the_target():
    found = [f for f in _run(tiny_cpu_spec(**{"trainer.device": "cuda"})).findings if f.kind == "device"]
    assert [(f.key, f.value, f.suggested) for f in found] == [("trainer.device", "cuda", "cpu")]
    assert found[0].problem == "ranks on cuda cannot start on the target cpu, a CPU node"


def test_models_and_data_the_engine_cannot_find_get_the_builtins():
    spec = tiny_cpu_spec(**{"actor_rollout_ref.model.path": "Qwen/Qwen2.5-0.5B-Instruct",
                            "critic.model.path": "/elsewhere/critic", "data.train_files": ["$HOME/data/train.parquet"]})
    facts = Facts(model_problems={"actor_rollout_ref.model.path": "not inside the allowed roots",
                                  "critic.model.path": "does not exist"},
                  data_problems={"$HOME/data/train.parquet": "does not exist"})
    result = _run(spec, facts)
    by_key = {f.key: f for f in result.findings}
    assert "Hugging Face Hub id" in by_key["actor_rollout_ref.model.path"].problem
    assert "Hub id" not in by_key["critic.model.path"].problem
    assert adapt_patch(result) == {"actor_rollout_ref.model.path": "builtin:tiny-llama",
                                   "critic.model.path": "builtin:tiny-llama", "data.train_files": "builtin:count"}


def test_a_critic_path_left_at_verls_placeholder_is_named_with_the_actors_path():
    flat = {k: v for k, v in TINY_CPU.items() if k != "critic.model.path"}
    spec, _ = validate_spec({**flat, "actor_rollout_ref.model.path": "/models/qwen"})
    facts = Facts(model_problems={"critic.model.path": "~/models/deepseek-llm-7b-chat does not exist"})
    found = [f for f in _run(spec, facts).findings if f.key == "critic.model.path"]
    assert [(f.kind, f.value, f.suggested, f.blocking) for f in found] == [
        ("verl_default", "~/models/deepseek-llm-7b-chat", "/models/qwen", True)]
    assert "holds verl's default" in found[0].problem
    # the actor's folder cannot be found either: the built-in preset for both
    facts = Facts(model_problems={**facts.model_problems, "actor_rollout_ref.model.path": "missing"})
    assert adapt_patch(_run(spec, facts))["critic.model.path"] == "builtin:tiny-llama"


def test_the_previews_errors_are_findings_with_their_key():
    spec = parse_spec({**TINY_CPU, "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size": 3})
    found = [f for f in _run(spec).findings if f.kind == "spec"]
    assert {f.key for f in found} == {"actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size"}
    assert found[0].blocking and "must divide the world size" in found[0].problem
