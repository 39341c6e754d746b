"""``verl_passthrough``: the keys of verl's config attnboard does not model, checked and put in canonical form.

Pure logic, no I/O. ``RunSpec``'s validator calls ``split_passthrough`` and imports this module when it runs:
this module reads the keys ``RunSpec`` models (``worker.spec.keys``), so ``worker.spec.schema`` cannot import it
at its top."""

from __future__ import annotations

import math
import re
from typing import Any

from worker.spec.keys import (
    ALIASES,
    DOTTED_KEY,
    MAX_SUGGESTED_KEYS,
    MAX_UNKNOWN_KEYS,
    SPEC_NAMES,
    _more_unknown,
    _unknown_key_issue,
    classify_key,
    nearest_verl_key,
    needs_plus,
    typed_like_verl,
)
from worker.spec.schema import PASSTHROUGH, Issue, _jsonable
from worker.spec.verl_defaults import VERL_VERSION

MAX_PASSTHROUGH_KEYS = 2000
MAX_PASSTHROUGH_DEPTH = 16
_HYDRA_DICT_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
HYDRA_WRITABLE_KEY = re.compile(r"^[A-Za-z0-9_/+.%*@?|(){}\[\]:=,-]+$")
"""A dict key Hydra's override grammar reads (``()[]{}:=,`` written escaped): FSDP-Turbo plans key modules
by path patterns such as ``model.visual.blocks.{*}``. A dict whose keys are all names is spread into dotted
keys; one with other keys is kept whole, one value."""


def _passthrough_value_problem(value: Any, depth: int = 0) -> str | None:
    """Why a value cannot go through to verl on a command line and back, or None."""
    if depth > MAX_PASSTHROUGH_DEPTH:
        return f"nested more than {MAX_PASSTHROUGH_DEPTH} levels deep"
    if value is None or isinstance(value, (bool, int)):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{value} cannot be stored (JSON has no NaN or Infinity)"
    if isinstance(value, str):
        if "\x00" in value:
            return "a NUL character cannot be passed on a command line"
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return "a lone surrogate (\\ud800-\\udfff) is not valid Unicode"
        return None
    if isinstance(value, list):
        return next((p for p in (_passthrough_value_problem(v, depth + 1) for v in value) if p), None)
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str) or not HYDRA_WRITABLE_KEY.match(k):
                return f"dict key {k!r} is not a key Hydra can write ({HYDRA_WRITABLE_KEY.pattern})"
            problem = _passthrough_value_problem(v, depth + 1)
            if problem:
                return problem
        return None
    return f"a {type(value).__name__} is not a value verl's config can hold"


def split_passthrough(raw: Any) -> tuple[dict[str, Any], dict[str, Any], list[Issue]]:
    """Pass-through data -> (keys attnboard models, found among them; the canonical pass-through; issues).

    The canonical form: one dotted key per value, dict values spread into sub-keys (an empty dict
    stays a value), ``+`` in front exactly when verl 0.9.1's config lacks the key (``++`` is read as
    ``+``). A key that attnboard models is handed back to be set in the spec; a key verl's config
    lacks needs the ``+`` (as on verl's command line), so a typo is an error naming the nearest key."""
    if not isinstance(raw, dict):
        return {}, {}, [Issue(PASSTHROUGH, raw, f"must be a mapping of dotted verl keys to values, got "
                                                f"{type(raw).__name__}")]
    lifted: dict[str, Any] = {}
    out: dict[str, Any] = {}
    issues: list[Issue] = []
    unknown = 0

    def add(given: str, value: Any, depth: int) -> None:
        nonlocal unknown
        where = f"{PASSTHROUGH}.{given}"
        plus = given.startswith("+")
        key = given.lstrip("+")
        if len(given) - len(key) > 2 or not DOTTED_KEY.match(key):
            issues.append(Issue(where, value, f"{given!r} is not a dotted key (such as data.val_files), "
                                              "optionally after + to add a key verl's config lacks"))
            return
        key = ALIASES.get(key, key)
        kind = classify_key(key)
        if kind in ("spec", "open"):
            lifted[SPEC_NAMES.get(key, key)] = value
            return
        nested = kind in ("section", "verl", "unknown", "hydra") and depth < MAX_PASSTHROUGH_DEPTH
        names_only = isinstance(value, dict) and all(not isinstance(s, str) or _HYDRA_DICT_KEY.match(s) for s in value)
        if isinstance(value, dict) and value and nested and names_only:
            for sub, sub_value in value.items():
                if not isinstance(sub, str) or not _HYDRA_DICT_KEY.match(sub):
                    issues.append(Issue(f"{where}.{sub}", sub_value, f"{sub!r} is not a key name"))
                    continue
                add(("+" if plus else "") + f"{key}.{sub}", sub_value, depth + 1)
            return
        if kind == "section":
            issues.append(Issue(where, value, f"{key} is a section of verl's config, not a value: give its keys"))
            return
        if kind == "under_value":
            issues.append(Issue(where, value, f"{key} lies under a key of verl's config that holds a value, "
                                              "not a section"))
            return
        if kind == "unknown" and (not plus or key.split(".", 1)[0] == "attnboard"):
            unknown += 1
            if unknown > MAX_UNKNOWN_KEYS:
                return
        if kind == "unknown" and key.split(".", 1)[0] == "attnboard":
            issues.append(_unknown_key_issue(key, value, suggest=unknown <= MAX_SUGGESTED_KEYS))
            return
        if kind == "unknown" and not plus:
            near = nearest_verl_key(key) if unknown <= MAX_SUGGESTED_KEYS else None
            hint = f"; did you mean {near}?" if near else ""
            issues.append(Issue(where, value, f"unknown key {key}: verl {VERL_VERSION}'s config lacks it; write "
                                              f"+{key} to add it{hint}", valid=near))
            return
        problem = _passthrough_value_problem(value)
        if problem:
            issues.append(Issue(where, _jsonable(value), problem))
            return
        out[("+" if needs_plus(key) else "") + key] = typed_like_verl(key, value)

    if len(raw) > MAX_PASSTHROUGH_KEYS:
        return {}, {}, [Issue(PASSTHROUGH, f"{len(raw)} keys", f"at most {MAX_PASSTHROUGH_KEYS} keys")]
    for given, value in raw.items():
        if not isinstance(given, str):
            issues.append(Issue(PASSTHROUGH, given, "keys must be strings"))
            continue
        add(given, value, 0)
    if unknown > MAX_UNKNOWN_KEYS:
        issues.append(_more_unknown(PASSTHROUGH, unknown))
    return lifted, out, issues
