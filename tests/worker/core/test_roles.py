"""The one Role enum: its section, attention key, dtype key, whether it trains and loads a model."""

from __future__ import annotations

import pytest

from worker.core import roles
from worker.core.roles import Role
from worker.spec import RunSpec, tree_get

ARR_KEY = "actor_rollout_ref.model.override_config.attn_implementation"
CRITIC_KEY = "critic.model.override_config.attn_implementation"


@pytest.mark.parametrize("role,section,key,dtype_key,trains,loads,setting", [
    (Role.actor, "actor_rollout_ref", ARR_KEY, "actor_rollout_ref.actor.fsdp_config.dtype", True, True, Role.actor),
    (Role.rollout, "actor_rollout_ref", ARR_KEY, "actor_rollout_ref.rollout.dtype", False, False, Role.actor),
    (Role.reference, "actor_rollout_ref", ARR_KEY, "actor_rollout_ref.ref.fsdp_config.dtype", False, True, Role.actor),
    (Role.critic, "critic", CRITIC_KEY, "critic.fsdp.dtype", True, True, Role.critic),
])
def test_each_role_knows_its_section_keys_and_training(role, section, key, dtype_key, trains, loads, setting):
    assert (role.section, role.attention_key, role.dtype_key) == (section, key, dtype_key)
    assert (role.trains, role.loads_model, role.setting) == (trains, loads, setting)
    assert role.model_section == f"{section}.model"


def test_the_keys_exist_in_the_spec_and_the_dtype_key_is_what_precision_reads():
    spec = RunSpec()
    tree = spec.model_dump()
    for role in Role:
        assert tree_get(tree, role.model_section) is not None
        dtype = str(tree_get(tree, role.dtype_key))
        assert spec.precision(role.value)[0].endswith(dtype.replace("bf16", "bfloat16").replace("fp32", "float32")
                                                      .replace("fp16", "float16"))


def test_order_names_and_derived_tuples():
    assert roles.NAMES == ("actor", "rollout", "reference", "critic")
    assert [r.value for r in roles.LOADED] == ["actor", "reference", "critic"]
    assert [r.value for r in roles.TRAINED] == ["actor", "critic"]
    assert roles.SECTIONS == ("actor_rollout_ref", "critic")
    assert [r.value for r in roles.SETTINGS] == ["actor", "critic"]
    assert sorted(["critic", "zzz", "actor", "reference"], key=roles.order) == ["actor", "reference", "critic", "zzz"]


def test_parse_reads_verl_short_name_and_names_what_is_valid():
    assert Role.parse("ref") is Role.reference and Role.parse("critic") is Role.critic
    with pytest.raises(ValueError, match=r"role='policy' is not a role; valid: actor, rollout, reference, critic \(or ref\)"):
        Role.parse("policy")
