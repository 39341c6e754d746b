"""verl's training engines on the spec side: which keys each engine's config has (from the wheel), the + rule per
engine, retired keys, and the issues a spec gets for keys its model_engine does not read."""

from __future__ import annotations

import pytest

from worker.spec import check_spec, classify_key, needs_plus, parse_spec
from worker.spec.engines import (
    ModelEngine,
    engine_default,
    engine_keys,
    engines_with,
    key_outside_engine,
    retired_message,
)
from worker.spec.schema import MEGATRON_LAUNCH_MESSAGE

VEOMNI_ATTN = "actor_rollout_ref.actor.veomni.attn_implementation"
FSDP_KEY = "actor_rollout_ref.actor.fsdp_config.wrap_policy.min_num_params"


@pytest.mark.parametrize("key,engines", [
    (VEOMNI_ATTN, ("veomni",)),
    ("critic.veomni.attn_implementation", ("veomni",)),
    ("actor_rollout_ref.actor.torchtitan.attn_type", ("torchtitan",)),
    ("actor_rollout_ref.actor.megatron.override_transformer_config.attention_backend", ("megatron",)),
    ("actor_rollout_ref.actor.automodel_config.backend_config.attn", ("automodel",)),
    (FSDP_KEY, ("dp", "automodel")),
    ("trainer.logger", ("dp", "megatron", "torchtitan", "veomni", "automodel")),
    ("trainer.no_such_key", ()),
])
def test_which_engines_config_has_a_key(key, engines) -> None:
    assert engines_with(key) == engines
    assert classify_key(key) == ("verl" if engines else "unknown")


@pytest.mark.parametrize("engine,key,default", [
    ("veomni", VEOMNI_ATTN, "flash_attention_2"),
    ("veomni", "actor_rollout_ref.ref.veomni.attn_implementation", "flash_attention_2"),  # ${oc.select:actor's}
    ("torchtitan", "actor_rollout_ref.actor.torchtitan.attn_type", "flex"),
    ("megatron", "critic.megatron.override_transformer_config.attention_backend", "flash"),
    ("automodel", "actor_rollout_ref.actor.automodel_config.backend_config.attn", "sdpa"),
    ("dp", "actor_rollout_ref.actor.fsdp_config.wrap_policy.min_num_params", 0),
])
def test_engine_defaults(engine, key, default) -> None:
    assert key in engine_keys(engine)
    assert engine_default(engine, key) == default


def test_the_plus_rule_depends_on_the_engine() -> None:
    assert not needs_plus("model_engine")  # a config group: model_engine=veomni, never +model_engine
    assert not needs_plus(VEOMNI_ATTN, "veomni") and needs_plus(VEOMNI_ATTN, "dp")
    assert needs_plus(FSDP_KEY, "veomni") and not needs_plus(FSDP_KEY, "dp")
    assert not needs_plus(VEOMNI_ATTN)  # some engine has it: the spec keeps it bare


def test_a_key_of_another_engine_is_named_with_its_engines() -> None:
    assert key_outside_engine(VEOMNI_ATTN, "veomni") is None
    assert key_outside_engine("trainer.no_such_key", "dp") is None
    assert key_outside_engine(VEOMNI_ATTN, "dp") == (
        f"{VEOMNI_ATTN} belongs to the config of model_engine=veomni, not dp: verl refuses it (Hydra: not in the "
        "struct) or, given with +, adds it and never reads it")


@pytest.mark.parametrize("key,replacement", [
    ("trainer.use_legacy_worker_impl", "model_engine"),
    ("actor_rollout_ref.rollout.mode", "async is the only rollout mode"),
    ("actor_rollout_ref.actor.ppo_micro_batch_size", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"),
    ("critic.forward_micro_batch_size", "critic.forward_micro_batch_size_per_gpu"),
])
def test_retired_keys_name_what_replaced_them(key, replacement) -> None:
    message = retired_message(key)
    assert message.startswith(f"{key} is retired in verl 0.9.1: use ") and replacement in message
    assert retired_message("trainer.nnodes") is None


def issues(data: dict, **kw) -> list[tuple[str, str, str]]:
    return [(i.field, i.severity, i.message) for i in check_spec(parse_spec(data), **kw)]


def test_spec_issues_for_engines() -> None:
    assert issues({"model_engine": "veomni", "verl_passthrough": {VEOMNI_ATTN: "sdpa"}}) == []
    foreign = issues({"verl_passthrough": {VEOMNI_ATTN: "sdpa"}})
    assert foreign == [(f"verl_passthrough.{VEOMNI_ATTN}", "warning", key_outside_engine(VEOMNI_ATTN, "dp"))]
    modelled = issues({"model_engine": "veomni", "actor_rollout_ref.actor.fsdp_config.param_offload": True})
    assert ("actor_rollout_ref.actor.fsdp_config.param_offload", "warning",
            "model_engine=veomni's config has no actor_rollout_ref.actor.fsdp_config.param_offload (dp's config has "
            "it): verl refuses it") in modelled
    automodel = issues({"model_engine": "automodel"})
    assert automodel[0][:2] == ("model_engine", "warning") and "no model_engine/automodel config" in automodel[0][2]
    sync = issues({"verl_passthrough": {"actor_rollout_ref.rollout.mode": "sync"}})
    assert sync[0][1] == "error" and "Rollout mode 'sync' has been removed." in sync[0][2]
    retired = issues({"verl_passthrough": {"actor_rollout_ref.rollout.mode": "async"}})
    assert [r[1] for r in retired] == ["warning"] and "is retired in verl 0.9.1" in retired[0][2]


@pytest.mark.parametrize("engine", [e.value for e in ModelEngine])
def test_only_megatron_is_refused_for_a_launch(engine) -> None:
    launch = [i for i in issues({"model_engine": engine}, launch=True) if i[0] == "model_engine" and i[1] == "error"]
    preview = [i for i in issues({"model_engine": engine}) if i[0] == "model_engine" and i[1] == "error"]
    assert preview == []
    assert launch == ([("model_engine", "error", MEGATRON_LAUNCH_MESSAGE)] if engine == "megatron" else [])
