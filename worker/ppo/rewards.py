"""Rule-based reward functions with verl's signature, in a registry filled by a decorator.

``compute_score(data_source, solution_str, ground_truth) -> float``: ``solution_str`` is the decoded
response (special tokens removed, nothing after EOS), ``ground_truth`` the row's
``reward_model.ground_truth``. ``get_reward_fn(name, data_source)`` picks a function by its registered
name (``custom_reward_function.name``) or, when no name is given, by the row's ``data_source``.
Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

RewardFn = Callable[[str, str, str], float]


@dataclass(frozen=True)
class RewardEntry:
    name: str
    fn: RewardFn
    data_sources: tuple[str, ...]


REWARDS: dict[str, RewardEntry] = {}
_BY_DATA_SOURCE: dict[str, str] = {}


def register_reward(name: str, *, data_sources: tuple[str, ...] = ()) -> Callable[[RewardFn], RewardFn]:
    """Register ``fn`` under ``name``; it also serves rows whose data_source is ``name`` or one of
    ``data_sources``. Registering a name or a data source twice raises."""

    def decorator(fn: RewardFn) -> RewardFn:
        if name in REWARDS:
            raise ValueError(f"reward function {name!r} is already registered ({REWARDS[name].fn.__qualname__})")
        sources = (name, *data_sources)
        taken = [s for s in sources if s in _BY_DATA_SOURCE]
        if taken:
            raise ValueError(f"data_source {taken[0]!r} is already served by reward function "
                             f"{_BY_DATA_SOURCE[taken[0]]!r}")
        REWARDS[name] = RewardEntry(name, fn, sources)
        for source in sources:
            _BY_DATA_SOURCE[source] = name
        return fn

    return decorator


def get_reward_fn(name: str | None, data_source: str) -> RewardFn:
    """The function registered as ``name``; with no name, the one serving ``data_source``."""
    if name:
        if name not in REWARDS:
            raise ValueError(f"custom_reward_function.name {name!r} is not a registered reward function; "
                             f"valid: {', '.join(sorted(REWARDS))}")
        return REWARDS[name].fn
    if data_source not in _BY_DATA_SOURCE:
        raise ValueError(f"no reward function serves data_source {data_source!r}; set custom_reward_function.name "
                         f"to one of: {', '.join(sorted(REWARDS))} (or use a data_source among: "
                         f"{', '.join(sorted(_BY_DATA_SOURCE))})")
    return REWARDS[_BY_DATA_SOURCE[data_source]].fn


# --------------------------------------------------------------------------------------------
# Helpers


def positional_credit(solution: str, target: str, partial: Callable[[str, str], float]) -> float:
    """Sum over the target's positions of ``partial(solution_char, target_char)``, divided by the longer
    of the two lengths, so missing and extra characters both cost. In [0, 1] when ``partial`` is."""
    length = max(len(solution), len(target))
    if length == 0:
        return 1.0
    # Positions past the shorter string score nothing (the division by the longer length charges them).
    return sum(partial(s, t) for s, t in zip(solution, target, strict=False)) / length


def _exact(s: str, t: str) -> float:
    return 1.0 if s == t else 0.0


# --------------------------------------------------------------------------------------------
# Rewards


@register_reward("count")
def count_score(data_source: str, solution_str: str, ground_truth: str) -> float:
    """Ascending digits (``builtin:count``): per target position, 1 for the right digit, 0.5 for any other
    digit, 0 otherwise; divided by max(response length, target length). A dense signal: emitting
    digits pays before emitting the right ones, and stopping at the right length pays too."""
    return positional_credit(solution_str.strip(), ground_truth,
                             lambda s, t: 1.0 if s == t else (0.5 if s.isdigit() else 0.0))


@register_reward("copy")
def copy_score(data_source: str, solution_str: str, ground_truth: str) -> float:
    """Copy the word (``builtin:copy``): the fraction of positions matching, over the longer length."""
    return positional_credit(solution_str.strip(), ground_truth, _exact)


_GSM8K_ANSWER = re.compile(r"#### (\-?[0-9\.\,]+)")


@register_reward("gsm8k", data_sources=("openai/gsm8k", "arith"))
def gsm8k_score(data_source: str, solution_str: str, ground_truth: str) -> float:
    """verl's GSM8K rule (strict): the number after the last ``#### `` must equal the ground truth
    (commas ignored). 1.0 if so, 0.0 otherwise (verl's format_score 0). A ground truth written as
    ``#### 7`` is accepted as ``7``."""
    matches = _GSM8K_ANSWER.findall(solution_str)
    if not matches:
        return 0.0
    answer = matches[-1].replace(",", "").rstrip(".")
    truth = ground_truth.strip().removeprefix("####").strip().replace(",", "")
    return 1.0 if answer == truth else 0.0
