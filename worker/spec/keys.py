"""The run spec's dotted keys: flattening and the tree writer, every key attnboard models, how a key of
verl's config is classified, whether verl's command line needs ``+``, and the nearest valid key to a typo.

Pure logic, no I/O."""

from __future__ import annotations

import difflib
import re
from typing import Any, Literal

from pydantic import BaseModel

from worker.spec.engines import (
    ANY_ENGINE_DEFAULTS,
    CONFIG_GROUPS,
    engine_keys,
)
from worker.spec.schema import PASSTHROUGH, Issue, RunSpecFields
from worker.spec.verl_defaults import VERL_DEFAULTS

# --------------------------------------------------------------------------------------------
# Dotted keys


def flatten(tree: dict[str, Any], prefix: str = "", *, stop_at: frozenset[str] = frozenset()) -> dict[str, Any]:
    """``{"a": {"b": 1}} -> {"a.b": 1}``. Dicts under a key in ``stop_at`` are expanded too
    (override_config sub-keys become ``...override_config.attn_implementation``) unless empty."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, dotted + ".", stop_at=stop_at))
        else:
            out[dotted] = value
    return out


def unflatten(flat: dict[str, Any]) -> dict[str, Any]:
    """``{"a.b": 1} -> {"a": {"b": 1}}``; nested dict values are merged, later keys win."""
    tree: dict[str, Any] = {}
    for dotted, value in flat.items():
        tree_set(tree, str(dotted), value, merge=True)
    return tree


REMOVE: Any = type("Remove", (), {"__repr__": lambda self: "REMOVE"})()
"""The value ``tree_set`` reads as "remove the key"."""


def tree_set(tree: dict[str, Any], dotted: str, value: Any, *, merge: bool = False) -> None:
    """The one dotted-key writer: set ``dotted`` in ``tree`` in place, making the dicts on the way (a value that
    is not a dict on the way is replaced by one); ``REMOVE`` removes the key; ``merge`` merges a dict value
    into a dict already there (later keys win).

    >>> t = {"a": {"b": 1}}; tree_set(t, "a.c.d", 2); tree_set(t, "a.b", REMOVE); t
    {'a': {'c': {'d': 2}}}
    """
    parts = dotted.split(".")
    node = tree
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    leaf = parts[-1]
    if value is REMOVE:
        node.pop(leaf, None)
    elif merge and isinstance(value, dict) and isinstance(node.get(leaf), dict):
        node[leaf] = _merge(node[leaf], value)
    else:
        node[leaf] = value


def tree_get(tree: dict[str, Any], dotted: str) -> Any:
    """``tree_get({"a": {"b": 1}}, "a.b") -> 1``; None where a part of the path is missing."""
    node: Any = tree
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


OPEN_DICT_FIELDS = ("actor_rollout_ref.model.override_config", "critic.model.override_config")
"""Fields whose sub-keys are free (any HF config key); everything else is a closed schema."""


def _schema_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    keys: list[str] = []
    for name, info in model.model_fields.items():
        ann = info.annotation
        dotted = prefix + name
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            keys.extend(_schema_keys(ann, dotted + "."))
        else:
            keys.append(dotted)
    return keys


SPEC_KEYS: tuple[str, ...] = tuple(k for k in _schema_keys(RunSpecFields) if k != PASSTHROUGH)
"""Every leaf key attnboard models, dotted (override_config counts as one leaf; ``verl_passthrough`` is not one)."""

# verl's deprecated aliases, accepted on input and rewritten to their current key.
ALIASES: dict[str, str] = {
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size":
        "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size",
}


VERL_NAMES: dict[str, str] = {
    spec_key: verl_key
    for spec_key, verl_key in (
        ("actor_rollout_ref.actor.fsdp_config.turbo_cp_size",
         "actor_rollout_ref.actor.fsdp_config.turbo_config.distributed.ulysses_parallel_size"),
        ("critic.turbo_cp_size", "critic.fsdp.turbo_config.distributed.ulysses_parallel_size"),
    )
    if spec_key in SPEC_KEYS and verl_key in VERL_DEFAULTS
}
"""Spec keys that verl spells differently: FSDP-Turbo's CP group size is verl's
``turbo_config.distributed.ulysses_parallel_size``. Read on import, written on export."""
SPEC_NAMES: dict[str, str] = {verl_key: spec_key for spec_key, verl_key in VERL_NAMES.items()}

DOTTED_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*(?:\.[A-Za-z0-9_\-]+)*$")
"""A dotted key as Hydra's override grammar reads one."""
_MODELLED = frozenset(SPEC_KEYS) - frozenset(OPEN_DICT_FIELDS)
_SECTIONS = frozenset(k.rsplit(".", i)[0] for k in SPEC_KEYS for i in range(1, k.count(".") + 1))
_VERL_SECTIONS = frozenset(k.rsplit(".", i)[0] for k in ANY_ENGINE_DEFAULTS for i in range(1, k.count(".") + 1))

KeyKind = Literal["spec", "open", "section", "verl", "hydra", "under_value", "unknown"]


def open_field(key: str) -> str | None:
    """The override_config field ``key`` is, or lies under."""
    return next((f for f in OPEN_DICT_FIELDS if key == f or key.startswith(f + ".")), None)


def classify_key(key: str) -> KeyKind:
    """What a dotted key (aliases already rewritten) is: a key attnboard models (``spec``), an
    override_config key (``open``), a section holding keys (``section``), a key of verl 0.9.1's config
    that attnboard does not model (``verl``, including keys under a verl key whose default is ``{}`` or
    null), Hydra's own (``hydra``), a sub-key of a verl value that has none (``under_value``), or none of
    these (``unknown``)."""
    key = SPEC_NAMES.get(key, key)
    if key in _MODELLED:
        return "spec"
    if open_field(key):
        return "open"
    if key in _SECTIONS or key in _VERL_SECTIONS:
        return "section"
    if key == "hydra" or key.startswith("hydra."):
        return "hydra"
    if key in ANY_ENGINE_DEFAULTS:
        return "verl"
    parts = key.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        ancestor = ".".join(parts[:cut])
        if ancestor in ANY_ENGINE_DEFAULTS:
            return "verl" if ANY_ENGINE_DEFAULTS[ancestor] in ({}, None) else "under_value"
        if ancestor in _MODELLED:
            return "under_value"
    return "unknown"


def nearest_verl_key(key: str) -> str | None:
    """The key of verl's config a typo most likely meant (``gpu_memory_utilisation`` -> ``..._utilization``)."""
    leaf = key.rsplit(".", 1)[-1]
    candidates = [k for k in VERL_DEFAULTS if k.startswith(key.split(".", 1)[0] + ".")] or list(VERL_DEFAULTS)
    found = difflib.get_close_matches(key, candidates, n=1, cutoff=0.85)
    if not found:
        found = [k for k in candidates if k.rsplit(".", 1)[-1] == leaf][:1]
    return found[0] if found else None


MAX_SUGGESTED_KEYS = 20
"""Unknown keys per spec that get a "did you mean" (string matching costs ~1.7 ms a key); later ones are named
without one, so a request of thousands of unknown keys costs no more than this many matches."""
MAX_UNKNOWN_KEYS = 100
"""Unknown keys per spec named one by one; past this, one issue counts the rest."""


def _more_unknown(field: str, count: int) -> Issue:
    return Issue(field, f"{count} unknown keys", f"{count - MAX_UNKNOWN_KEYS} more unknown keys are not listed "
                 f"(at most {MAX_UNKNOWN_KEYS} are named one by one)", valid=f"<= {MAX_UNKNOWN_KEYS} unknown keys")


def needs_plus(key: str, engine: str | None = None) -> bool:
    """Whether verl's command line needs ``+key=`` (Hydra's struct mode): the key is not in verl's config under
    ``model_engine=engine`` (None: under any engine), nor a config group, nor one of Hydra's own."""
    if key in CONFIG_GROUPS:
        return False
    known = ANY_ENGINE_DEFAULTS if engine is None else engine_keys(engine)
    return key not in known and classify_key(key) != "hydra"


def typed_like_verl(key: str, value: Any, raw: str | None = None) -> Any:
    """A value typed as verl's generated config has ``key``: a string key given a number or a bool
    (``trainer.project_name=2024``) keeps its text (``raw``, the text as written, when there is one)."""
    if isinstance(ANY_ENGINE_DEFAULTS.get(key), str) and isinstance(value, (bool, int, float)):
        if raw is not None:
            return raw.strip()
        return ("true" if value else "false") if isinstance(value, bool) else repr(value)
    return value


def nearest_key(key: str) -> str | None:
    """The valid key a typo most likely meant: string similarity plus shared words (``total_steps`` ->
    ``total_training_steps``), preferring keys whose last component matches (``critic.lr`` -> ``critic.optim.lr``)."""

    def words(k: str) -> set[str]:
        return set(k.replace(".", "_").split("_")) - {""}

    def score(candidate: str) -> float:
        ratio = difflib.SequenceMatcher(None, key, candidate).ratio()
        shared = len(words(key) & words(candidate)) / max(len(words(key)), 1)
        same_leaf = key.rsplit(".", 1)[-1] == candidate.rsplit(".", 1)[-1]
        return ratio + 0.5 * shared + (0.5 if same_leaf else 0.0)

    best = max(SPEC_KEYS, key=score)
    return best if score(best) >= 0.9 else None


def keys_near(key: str) -> list[str]:
    """The valid keys of the deepest section of ``key`` that exists (``trainer.foo`` -> the ``trainer.*``
    keys), or the top-level sections when none does."""
    parts = key.split(".")
    for n in range(len(parts) - 1, 0, -1):
        prefix = ".".join(parts[:n]) + "."
        under = [k for k in SPEC_KEYS if k.startswith(prefix)]
        if under:
            return under
    return sorted({k.split(".", 1)[0] for k in SPEC_KEYS})


def _unknown_key_issue(key: str, value: Any, *, suggest: bool = True) -> Issue:
    near = nearest_key(key) if suggest else None
    hint = f"; did you mean {near!r}?" if near else ""
    return Issue(key, value, f"unknown key {key!r}{hint}", valid=near or keys_near(key))
