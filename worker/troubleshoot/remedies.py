"""What a remedy patches and what the rules read from a match: the spec keys of each role, the patches
(attention implementation, compute dtype), the node's availability context and the implementation an error
is about. Pure."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from worker.attention.availability import FLASH_MIN_COMPUTE_CAPABILITY, Context
from worker.core.environment import Environment
from worker.core.implementations import Impl
from worker.core.roles import ALIASES, NAMES, SECTIONS, Role
from worker.troubleshoot.diagnosis import CATEGORY_STEP, Category, Diagnosis, ErrorInfo, Remedy

ROLE_SECTIONS: dict[str, str] = {name: Role.parse(name).section for name in (*NAMES, *ALIASES)}
"""Where each role's attention is configured (ATTENTION_RULES.md: actor, rollout and reference share one key);
``ref`` is verl's short name of the reference."""

ATTN_KEY = "{section}.model.override_config.attn_implementation"
ACTOR_SP_KEY = "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size"
DTYPE_KEYS: dict[str, tuple[str, ...]] = {section: tuple(r.dtype_key for r in Role if r.section == section)
                                          for section in SECTIONS}
"""The compute-dtype keys (verl's) per section: actor, rollout and reference share one model."""
HALF_DTYPE = "bfloat16"
"""What the dtype remedy sets: verl's default compute dtype."""


@dataclass(frozen=True)
class MatchContext:
    error: ErrorInfo
    env: Environment | None
    role: str | None
    match: re.Match[str]


def attn_patch(role: str | None, impl: str) -> dict[str, str]:
    """The spec patch setting ``impl`` for a role (both sections when role is None)."""
    sections = sorted(set(ROLE_SECTIONS.values())) if role is None else [ROLE_SECTIONS[role]]
    return {ATTN_KEY.format(section=section): impl for section in sections}


def who(role: str | None) -> str:
    if role is None:
        return "every role"
    if Role.parse(role) is Role.critic:
        return "the critic"
    return "the actor, rollout and reference (they share one key)"


def shown(patch: Mapping[str, Any]) -> str:
    return " and ".join(f"{key}={value}" for key, value in patch.items())


def eager_remedy(roles: Iterable[str]) -> Remedy:
    """The guide's second step for roles that cannot run their attention: eager on every setting those roles
    share (the actor, rollout and reference share one key), so one retry recovers them all. The preview's
    preflight, its one-click fix and the run page's retry button all say and apply this one.

    >>> sorted(eager_remedy(["critic", "actor"]).patch)
    ['actor_rollout_ref.model.override_config.attn_implementation', 'critic.model.override_config.attn_implementation']
    """
    sections = sorted({ROLE_SECTIONS[r] for r in roles})
    patch = {ATTN_KEY.format(section=s): Impl.eager.value for s in sections}
    names = " and ".join("the critic" if s == "critic" else "the actor, rollout and reference" for s in sections)
    sentence = (f"Fall back to eager on {names} (the guide's order: check compatibility, then eager, then the "
                f"hardware, then read the error): set {shown(patch)}.")
    return Remedy(patch, sentence)


def eager_patch(role: str | None) -> dict[str, str]:
    """``eager_remedy``'s patch for the one role an error is about (every role when None): what a
    troubleshooting entry of the guide's second step sets, the same the run page's button and the preflight
    set for that role."""
    return eager_remedy(ROLE_SECTIONS if role is None else [role]).patch


def node_context(ctx: MatchContext) -> Context:
    """The availability context of the role that failed: the node known (None: unknown, assumed able)."""
    # the rollout's module is the actor's, which trains; only the reference never runs a backward pass
    trained = ctx.role is None or Role.parse(ctx.role) is not Role.reference
    return Context(ctx.env, trained=trained)


# Where to look for the implementation an error is about, most specific first.
_IMPL_PATTERNS: tuple[tuple[re.Pattern[str], Callable[[re.Match[str]], str]], ...] = (
    (re.compile(r"attn_implementation\s*=\s*[\"'`]?(?P<name>[A-Za-z0-9_|./@:\-]*[A-Za-z0-9_])"), lambda m: m["name"]),
    (re.compile(r"Flash ?Attention ?(?P<v>\d)", re.I), lambda m: f"flash_attention_{m['v']}"),
    (re.compile(r"flash_attn_interface"), lambda m: Impl.flash_attention_3.value),
    (re.compile(r"flash[_ ]?attn|flash_attention|FlashAttention|Flash Attention", re.I),
     lambda m: Impl.flash_attention_2.value),
    (re.compile(r"scaled_dot_product_attention|sdpa_attention_forward|\bsdpa\b"), lambda m: Impl.sdpa.value),
    (re.compile(r"flex_attention|FlexAttention"), lambda m: Impl.flex_attention.value),
    (re.compile(r"eager_attention_forward"), lambda m: Impl.eager.value),
)


def impl_in(text: str) -> str | None:
    for pattern, name in _IMPL_PATTERNS:
        found = pattern.search(text)
        if found:
            return name(found)
    return None


def implementation_of(ctx: MatchContext) -> str | None:
    """The implementation involved: from the matched excerpt, else the start of its line (the subject of
    "... does not support ..."), else the message, else the traceback."""
    text = ctx.match.string
    subject = text[text.rfind("\n", 0, ctx.match.start()) + 1: ctx.match.start()]
    for place in (ctx.match.group(0), subject, ctx.error.head, ctx.error.traceback):
        impl = impl_in(place)
        if impl:
            return impl
    return None


def flash_impl(ctx: MatchContext) -> str:
    impl = implementation_of(ctx)
    return impl if impl in FLASH_MIN_COMPUTE_CAPABILITY else Impl.flash_attention_2.value


def min_cc(impl: str) -> list[int]:
    return list(FLASH_MIN_COMPUTE_CAPABILITY.get(impl, (8, 0)))


def evidence_of(ctx: MatchContext) -> str:
    """The line of text holding the match (the whole match when it spans lines), at most 400 characters."""
    text = ctx.match.string
    start = text.rfind("\n", 0, ctx.match.start()) + 1
    end = text.find("\n", ctx.match.end())
    line = text[start: end if end >= 0 else len(text)].strip()
    return line if len(line) <= 400 else line[:397] + "..."


def diagnosis_for(
    ctx: MatchContext,
    category: Category,
    *,
    impl: str | None,
    patch: dict[str, Any],
    sentence: str,
    summary: str,
    return_when: dict[str, Any] | None = None,
    role: str | None = None,
) -> Diagnosis:
    return Diagnosis(
        category=category,
        implementation=impl,
        step=CATEGORY_STEP[category],
        remedy=Remedy(patch, sentence),
        summary=summary,
        evidence=evidence_of(ctx),
        return_to_fast_path_when=return_when,
        role=role if role is not None else ctx.role,
    )


def dtype_patch(role: str | None, dtype: str = HALF_DTYPE) -> dict[str, str]:
    """The spec patch setting the compute dtype of a role's model (every role when None)."""
    sections = sorted(set(ROLE_SECTIONS.values())) if role is None else [ROLE_SECTIONS[role]]
    return {key: dtype for section in sections for key in DTYPE_KEYS[section]}
