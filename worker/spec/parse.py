"""Parsing untrusted input: ``parse_spec`` turns JSON/YAML data (nested or dotted keys) into a ``RunSpec`` or
raises ``SpecError`` listing every problem with its dotted field, the bad value and what is valid.

Pure logic, no I/O."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from worker.core.implementations import BUILTIN_NAMES, VALID_DESCRIPTION, is_valid_name
from worker.core.pydantic_errors import valid_for
from worker.spec.keys import (
    ALIASES,
    MAX_SUGGESTED_KEYS,
    MAX_UNKNOWN_KEYS,
    OPEN_DICT_FIELDS,
    _more_unknown,
    _unknown_key_issue,
    tree_get,
    unflatten,
)
from worker.spec.passthrough import split_passthrough
from worker.spec.runspec import RunSpec
from worker.spec.schema import PASSTHROUGH, Issue, SpecError

# --------------------------------------------------------------------------------------------
# Parsing untrusted input


def _normalise(data: dict[str, Any]) -> dict[str, Any]:
    """Accept nested or dotted keys (or a mix) and rewrite verl's deprecated aliases."""
    flat_input: dict[str, Any] = {}
    for key, value in data.items():
        if not isinstance(key, str):
            raise SpecError([Issue(str(key), value, "keys must be strings")])
        flat_input[key] = value
    tree = unflatten(flat_input)
    raw_passthrough = tree.pop(PASSTHROUGH, {})
    flat = {}
    for key, value in _flatten_schema_aware(tree).items():
        flat[ALIASES.get(key, key)] = value
    # Keys of the pass-through that attnboard models are read as the spec's own (a spec stored before
    # attnboard modelled a key keeps meaning the same); given twice with two values is an error.
    lifted, passthrough, issues = split_passthrough(raw_passthrough)
    for key, value in lifted.items():
        if key in flat and flat[key] != value:
            issues.append(Issue(f"{PASSTHROUGH}.{key}", value, f"{key} is given twice, in the spec ({_short(flat[key])}) "
                                                               f"and in {PASSTHROUGH} ({_short(value)})"))
        flat[key] = value
    if issues:
        raise SpecError(issues)
    out = unflatten(flat)
    if passthrough:
        out[PASSTHROUGH] = passthrough
    return out


def _flatten_schema_aware(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Flatten, but keep open dicts (override_config) whole so their keys are not mistaken for schema keys."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if dotted in OPEN_DICT_FIELDS:
            out[dotted] = value if not isinstance(value, dict) else unflatten(value)
        elif isinstance(value, dict) and value:
            out.update(_flatten_schema_aware(value, dotted + "."))
        else:
            out[dotted] = value
    return out


def parse_spec(data: Any) -> RunSpec:
    """Untrusted data (nested or dotted keys) -> RunSpec, or SpecError naming every bad field."""
    if not isinstance(data, dict):
        raise SpecError([Issue("(spec)", data, f"a spec must be a mapping of keys to values, got {type(data).__name__}")])
    tree = _normalise(data)
    attn_issues = _attention_issues(tree)
    try:
        spec = RunSpec.model_validate(tree)
    except ValidationError as exc:
        issues = [i for i in _issues_from_validation(exc) if not i.field.endswith("override_config") or not attn_issues]
        raise SpecError(attn_issues + issues) from None
    return spec


def _attention_issues(tree: dict[str, Any]) -> list[Issue]:
    """Unknown attention names, reported on the exact key with the list of valid names."""
    issues = []
    for dotted in OPEN_DICT_FIELDS:
        node = tree_get(tree, dotted)
        attn = node.get("attn_implementation") if isinstance(node, dict) else None
        if attn is not None and (not isinstance(attn, str) or not is_valid_name(attn)):
            issues.append(Issue(f"{dotted}.attn_implementation", attn,
                                f"unknown attn_implementation {_short(attn)}; valid: {VALID_DESCRIPTION}",
                                valid=list(BUILTIN_NAMES)))
    return issues


def _issues_from_validation(exc: ValidationError) -> list[Issue]:
    issues: list[Issue] = []
    unknown = 0
    for err in exc.errors(include_url=False):
        loc = ".".join(str(p) for p in err["loc"])
        value = err.get("input")
        if err["type"] == "extra_forbidden":
            unknown += 1
            if unknown <= MAX_UNKNOWN_KEYS:
                issues.append(_unknown_key_issue(loc, value, suggest=unknown <= MAX_SUGGESTED_KEYS))
            continue
        message = err["msg"]
        if message.startswith("Value error, "):
            message = message[len("Value error, ") :]
        valid = valid_for(err)
        if err["type"] == "enum":
            message = f"{value!r} is not valid; valid: {', '.join(valid)}"
        elif err["type"] in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
            message = f"{_short(value)} is out of range: {message.lower()}"
        else:
            message = f"{_short(value)} is not valid: {message}"
        issues.append(Issue(loc, value, message, valid=valid))
    if unknown > MAX_UNKNOWN_KEYS:
        issues.append(_more_unknown("(spec)", unknown))
    return issues


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
