"""The remove-padding cost sentence per implementation (``worker.attention.packing``) and the preview's
``remove-padding-cost`` reason: on the roles that train or score, following each role's own key, never on
the rollout (generation does not pack)."""

from __future__ import annotations

import pytest

from worker.attention.packing import family, remove_padding_cost
from worker.attention.resolution import Rule, resolve
from worker.core.environment import PROFILES
from worker.spec import parse_spec


@pytest.mark.parametrize("impl,expected", [
    ("flash_attention_2", "varlen"), ("flash_attention_3", "varlen"), ("kernels-community/flash-attn", "varlen"),
    ("flex_attention", "flex"), ("sdpa", "dense-mask"), ("paged|sdpa", "dense-mask"), ("eager", "dense-mask"),
])
def test_family(impl, expected):
    assert family(impl) == expected


@pytest.mark.parametrize("impl,remove_padding,sp,says", [
    ("flash_attention_2", True, 1, "varlen, one causal block per sequence"),
    ("sdpa", True, 1, "(T, T) block-diagonal mask transformers infers from position_ids"),
    ("sdpa", True, 1, "on CUDA the explicit mask keeps sdpa off its flash backend"),
    ("eager", True, 1, "materialises the (heads, T, T) scores"),
    ("flex_attention", True, 1, "skips the empty blocks"),
    ("sdpa", False, 1, "use_remove_padding=false: padded rows"),
    ("flash_attention_2", False, 1, "use_remove_padding=false: padded rows"),
    ("sdpa", True, 2, "with Ulysses size 2: attnboard shards the padded rows"),
])
def test_the_cost_sentence_names_what_each_implementation_does(impl, remove_padding, sp, says):
    assert says in remove_padding_cost(impl, remove_padding=remove_padding, sp=sp)


@pytest.mark.parametrize("actor_rp,critic_rp", [(True, True), (False, True), (True, False)])
def test_the_preview_says_the_cost_per_role_from_its_own_key(actor_rp, critic_rp):
    spec = parse_spec({"actor_rollout_ref.model.override_config.attn_implementation": "sdpa",
                       "critic.model.override_config.attn_implementation": "eager",
                       "actor_rollout_ref.model.use_remove_padding": actor_rp,
                       "critic.model.use_remove_padding": critic_rp})
    roles = resolve(spec, PROFILES["cpu"]).roles
    for role, rp, impl in (("actor", actor_rp, "sdpa"), ("reference", actor_rp, "sdpa"), ("critic", critic_rp, "eager")):
        said = [r.text for r in roles[role].reasons if r.rule == Rule.remove_padding.value]
        assert said == [remove_padding_cost(impl, remove_padding=rp)], role
    assert Rule.remove_padding.value not in [r.rule for r in roles["rollout"].reasons]


def test_a_role_that_cannot_load_gets_no_cost_sentence():
    spec = parse_spec({"actor_rollout_ref.model.override_config.attn_implementation": "flash_attention_2"})
    roles = resolve(spec, PROFILES["cpu"]).roles
    assert Rule.remove_padding.value not in [r.rule for r in roles["actor"].reasons]
