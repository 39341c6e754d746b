"""One fallback chain: the preview's attempts are exactly what the engine's loader tries.

For every implementation name x every environment profile x policy x (forced eager, Ulysses SP > 1, plain)
x output_attentions, the implementations ``resolve()`` reports in ``attempts`` for a role are the ones the
engine's load plan (``worker.engine.plan.load_plan`` -> ``RolePlan.candidates``) tries, in the same order:
the plan starts with the preview's attempts, and when the preview finds nothing loadable the plan has
nothing more to try either.
"""

from __future__ import annotations

import pytest

from worker.attention import BUILTIN_NAMES, PAGED_NAMES
from worker.engine.plan import load_plan
from worker.environment import PROFILES
from worker.resolution import resolve
from worker.spec import parse_spec

HUB = "kernels-community/flash-attn"
NAMES = [*BUILTIN_NAMES, *PAGED_NAMES, HUB]
LAYOUTS = {
    "plain": {},
    "ulysses-sp2": {"actor_rollout_ref.actor.strategy": "fsdp2", "critic.strategy": "fsdp2",
                    "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size": 2,
                    "critic.ulysses_sequence_parallel_size": 2},
    "forced-turbo": {"actor_rollout_ref.actor.strategy": "fsdp_turbo", "critic.strategy": "fsdp_turbo",
                     "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size": 2,
                     "critic.ulysses_sequence_parallel_size": 2},
}
LOADED_ROLES = ("actor", "reference", "critic")


def spec_for(name: str, policy: str, layout: str, output_attentions: bool):
    return parse_spec({
        "actor_rollout_ref.model.override_config.attn_implementation": name,
        "critic.model.override_config.attn_implementation": name,
        "attnboard.fallback_policy": policy,
        "attnboard.debug.output_attentions": output_attentions,
        **LAYOUTS[layout],
    })


@pytest.mark.parametrize("output_attentions", [False, True], ids=["weights-off", "weights-on"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("policy", ["strict", "fallback"])
@pytest.mark.parametrize("profile", list(PROFILES))
@pytest.mark.parametrize("name", NAMES)
def test_preview_attempts_are_what_the_engine_tries(name, profile, policy, layout, output_attentions):
    env = PROFILES[profile]
    spec = spec_for(name, policy, layout, output_attentions)
    resolution = resolve(spec, env)
    plan = load_plan(spec, resolution, actor_folder="actor", critic_folder="critic", env=env.to_dict())
    for role_plan in plan.roles:
        preview = resolution.roles[role_plan.role]
        attempts = list(preview.attempts)
        assert role_plan.candidates[:len(attempts)] == attempts, (role_plan.role, attempts, role_plan.candidates)
        if preview.status == "error":
            assert role_plan.candidates == attempts, (role_plan.role, attempts, role_plan.candidates)
    assert {p.role for p in plan.roles} == set(LOADED_ROLES)
