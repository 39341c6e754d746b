"""The four roles of a PPO run, and what each knows about itself: its verl section, where its attention is
configured, whether it trains and whether a rank loads a model for it. Pure.

Actor, rollout and reference share ``actor_rollout_ref`` (one model, one ``override_config``: the rollout
generates with the actor's module, the reference is a frozen copy of its initial weights); the critic has
its own section (ATTENTION_RULES.md).
"""

from __future__ import annotations

from enum import Enum


class Role(str, Enum):
    """A role of a run, in the order the dashboard and the CLI list them."""

    actor = "actor"
    rollout = "rollout"
    reference = "reference"
    critic = "critic"

    @property
    def section(self) -> str:
        """The verl section holding the role's model: ``actor_rollout_ref`` or ``critic``."""
        return "critic" if self is Role.critic else "actor_rollout_ref"

    @property
    def model_section(self) -> str:
        """``actor_rollout_ref.model`` or ``critic.model``."""
        return f"{self.section}.model"

    @property
    def attention_key(self) -> str:
        """The dotted spec key choosing the role's attention implementation (shared within a section)."""
        return f"{self.model_section}.override_config.attn_implementation"

    @property
    def dtype_key(self) -> str:
        """The dotted key of the role's compute dtype, as verl names it."""
        return {Role.actor: "actor_rollout_ref.actor.fsdp_config.dtype",
                Role.rollout: "actor_rollout_ref.rollout.dtype",
                Role.reference: "actor_rollout_ref.ref.fsdp_config.dtype",
                Role.critic: "critic.fsdp.dtype"}[self]

    @property
    def trains(self) -> bool:
        """Actor and critic are optimised; rollout generates and the reference stays frozen."""
        return self in (Role.actor, Role.critic)

    @property
    def loads_model(self) -> bool:
        """Whether a rank loads a model of its own for the role (the rollout uses the actor's)."""
        return self is not Role.rollout

    @property
    def shares_with(self) -> tuple[Role, ...]:
        """Every role configured by the same section (itself included), in order."""
        return tuple(r for r in Role if r.section == self.section)

    @property
    def setting(self) -> Role:
        """The role that names the section's attention setting: the actor for actor_rollout_ref, the critic."""
        return self.shares_with[0]

    @classmethod
    def parse(cls, name: str) -> Role:
        """A role by name; ``ref`` (verl's short name) is the reference. ValueError names what is valid."""
        name = ALIASES.get(name, name)
        try:
            return cls(name)
        except ValueError:
            raise ValueError(f"role={name!r} is not a role; valid: {', '.join(NAMES)} (or ref)") from None


NAMES: tuple[str, ...] = tuple(r.value for r in Role)
ALIASES: dict[str, str] = {"ref": Role.reference.value}
LOADED: tuple[Role, ...] = tuple(r for r in Role if r.loads_model)
TRAINED: tuple[Role, ...] = tuple(r for r in Role if r.trains)
SECTIONS: tuple[str, ...] = tuple(dict.fromkeys(r.section for r in Role))
"""``actor_rollout_ref`` then ``critic``."""
SETTINGS: tuple[Role, ...] = tuple(dict.fromkeys(r.setting for r in Role))
"""The roles with an attention setting of their own: actor (shared by rollout and reference), critic."""


def order(name: str) -> int:
    """Position of a role name in ``Role``'s order (unknown names last), for sorting rows."""
    return NAMES.index(name) if name in NAMES else len(NAMES)
