"""Applying overrides to a spec, the part shared by the command line and YAML: aliases, the spec's keys,
verl's pass-through keys and Hydra's ``+`` rule, interpolations resolved, the spec validated."""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from worker.core import yaml_guard
from worker.core.limits import MAX_INPUT_BYTES
from worker.interop.shell import Word
from worker.interop.verl.hydra import STRATEGY_KEYS, Interpolation, Override, decode_omegaconf, parse_hydra_value
from worker.interop.verl.results import (
    CRITIC_ATTN_WARNING,
    HF_ROLLOUT_WARNING,
    MAX_INTERPOLATION_DEPTH,
    MEGATRON_MESSAGE,
    ImportResult,
    VerlImportError,
    engine_rollout_warning,
)
from worker.spec import (
    ALIASES,
    DEFAULT_LOCAL_DIR,
    PASSTHROUGH,
    PASSTHROUGH_NOTE,
    SPEC_KEYS,
    SPEC_NAMES,
    RunSpec,
    SpecError,
    classify_key,
    flatten,
    nearest_key,
    nearest_verl_key,
    needs_plus,
    parse_spec,
    typed_like_verl,
)
from worker.spec.engines import (
    ENGINE_STRATEGY,
    MODEL_ENGINE_KEY,
    ModelEngine,
    group_message,
    key_outside_engine,
    retired_message,
)
from worker.spec.verl_defaults import VERL_DEFAULTS, VERL_VERSION

# --------------------------------------------------------------------------------------------
# Applying overrides: the part shared by the command line and YAML


def _field_annotations(model: type[BaseModel], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        ann = info.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out.update(_field_annotations(ann, f"{prefix}{name}."))
        else:
            out[f"{prefix}{name}"] = ann
    return out


def _holds_str(annotation: Any) -> bool:
    """Whether a field takes a string (``str``, ``str | None``, ``Annotated[str, ...] | list[...]``)."""
    if annotation is str:
        return True
    if typing.get_origin(annotation) is typing.Annotated:
        return _holds_str(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(_holds_str(a) for a in typing.get_args(annotation))
    return False


_ANNOTATIONS = _field_annotations(RunSpec)
_STRING_KEYS = frozenset(k for k, ann in _ANNOTATIONS.items() if _holds_str(ann))


def _spec_tree(spec: RunSpec) -> dict[str, Any]:
    # Python mode, not JSON: JSON mode turns an override_config float inf into null.
    tree = spec.model_dump()
    tree.pop(PASSTHROUGH, None)
    return tree


def _spec_flat(spec: RunSpec) -> dict[str, Any]:
    return flatten(_spec_tree(spec))


_SPEC_DEFAULTS = _spec_flat(RunSpec())

KEPT_INTERPOLATIONS: dict[str, str] = {"trainer.default_local_dir": DEFAULT_LOCAL_DIR}
"""verl defaults that are interpolations and that the spec keeps as text, resolved when the engine uses
them (``worker.engine.checkpoint.checkpoint_folder``): the import leaves the exact default unresolved, the export
writes it unescaped, so verl reads it as its own default and a spec at verl's defaults round-trips."""


def _unknown_key_message(key: str) -> str:
    retired = retired_message(key) or group_message(key)
    if retired:
        return f"unknown key {key}: {retired}"
    near = nearest_key(key) or nearest_verl_key(key)
    hint = f"; did you mean {near}?" if near else ""
    return (f"unknown key {key}: neither attnboard nor verl {VERL_VERSION} has it{hint} (write +{key}=... to add "
            "a key verl's config lacks)")


@dataclass
class _Given:
    value: Any
    raw: str | None
    word: Word


@dataclass
class _State:
    given: dict[str, _Given] = field(default_factory=dict)
    """Modelled keys (override_config sub-keys dotted in full), in the order given."""
    passthrough: dict[str, _Given] = field(default_factory=dict)
    """Keys of verl's config that attnboard does not model (and ``+`` keys verl's config lacks, with their
    ``+``): passed through to verl, not run by attnboard."""
    warnings: list[str] = field(default_factory=list)
    aliased: dict[str, _Given] = field(default_factory=dict)
    """Deprecated keys given (``ALIASES``), by their verl name: verl's config may read them under that name."""
    engine_strategies: dict[str, tuple[str, Word]] = field(default_factory=dict)
    """``strategy`` keys set to a non-dp engine's own strategy (``megatron``): checked against ``model_engine``."""
    added_plus: set[str] = field(default_factory=set)
    """Pass-through keys a command line added with ``+`` that some engine's config has: Hydra rejects the ``+``
    under an engine whose config has the key."""
    set_bare: set[str] = field(default_factory=set)
    """Pass-through keys a command line set without ``+``: Hydra refuses those the chosen engine's config lacks."""

    def warn(self, message: str) -> None:
        if message not in self.warnings:
            self.warnings.append(message)


def _assign(table: dict[str, _Given], key: str, given: _Given) -> None:
    bare = key.lstrip("+")
    for other in list(table):
        other_bare = other.lstrip("+")
        if other_bare.startswith(bare + ".") or (bare.startswith(other_bare + ".") and not isinstance(table[other].value, dict)):
            del table[other]
    table.pop("+" + bare, None)
    table.pop(bare, None)
    table[key] = given


def _delete(table: dict[str, _Given], key: str) -> bool:
    found = False
    for other in list(table):
        bare = other.lstrip("+")
        if bare == key or bare.startswith(key + "."):
            del table[other]
            found = True
    return found


def _apply(state: _State, override: Override, *, command_line: bool) -> None:
    key = override.key
    if key in ALIASES:
        state.warn(f"{key} is deprecated in verl; read as {ALIASES[key]}")
        if override.op != "delete":
            state.aliased[key] = _Given(override.value, override.raw_value, override.word)
        key = ALIASES[key]
    key = SPEC_NAMES.get(key, key)
    kind = classify_key(key)
    given = _Given(override.value, override.raw_value, override.word)
    if key in STRATEGY_KEYS and override.value in ENGINE_STRATEGY.values():
        state.engine_strategies[key] = (override.value, override.word)
        return
    if kind == "section":
        if override.op == "delete":
            for table in (state.given, state.passthrough):
                _delete(table, key)
            state.warn(f"~{override.key}: reset to attnboard's and verl's defaults")
            return
        if not isinstance(override.value, dict):
            example = next(k for k in (*SPEC_KEYS, *VERL_DEFAULTS) if k.startswith(key + "."))
            raise VerlImportError(f"{key} is a section, not a value: give one of its keys, e.g. {example}",
                                  override.word.raw, override.word.position)
        for sub, value in override.value.items():
            _apply(state, Override(override.op, f"{key}.{sub}", value, None, override.word), command_line=command_line)
        return
    if kind == "under_value":
        parent = key.rsplit(".", 1)[0]
        raise VerlImportError(f"{key}: {parent} holds a value in verl's config, not a section",
                              override.word.raw, override.word.position)
    if kind == "unknown" and (key.split(".", 1)[0] == "attnboard" or (override.op == "set" and command_line)):
        raise VerlImportError(_unknown_key_message(key), override.word.raw, override.word.position)
    if kind == "unknown" and not command_line:
        near = nearest_key(key) or nearest_verl_key(key)
        typo = near is not None and "." in key and near.rsplit(".", 1)[0] == key.rsplit(".", 1)[0]
        if typo and override.op == "set":  # trainer.total_trainig_steps: a typo in a section verl has, refused as
            raise VerlImportError(_unknown_key_message(key), override.word.raw, override.word.position)
        state.warn(f"{key} is not in verl {VERL_VERSION}'s config: a config file adds it (passed through as "
                   f"+{key}){f'; did you mean {near}?' if near else ''}")
    if kind in ("verl", "hydra", "unknown"):
        stored = ("+" if needs_plus(key) else "") + key
        if command_line and override.op == "add" and not needs_plus(key):
            state.added_plus.add(key)  # whether verl rejects the + depends on model_engine: checked at the end
        if command_line and override.op == "set" and needs_plus(key):
            state.warn(f"verl needs +{key}: the key is not in its default config; the export adds the +")
        if override.op == "delete":
            if not _delete(state.passthrough, key):
                state.warn(f"~{key}: verl deletes the key from its config; attnboard keeps no record of it")
            return
        if kind == "verl":
            given = _Given(typed_like_verl(key, override.value, override.raw_value), override.raw_value,
                           override.word)
            if command_line and override.op == "set":
                state.set_bare.add(key)
        _assign(state.passthrough, stored, given)
        return
    if command_line:
        in_verl = not needs_plus(override.key)
        if override.op == "set" and not in_verl:
            state.warn(f"verl needs +{key}: the key is not in its default config; the export adds the +")
        if override.op == "add" and in_verl:
            state.warn(f"verl rejects +{override.key}: the key exists in its default config; "
                       f"write {override.key}= or ++{override.key}=")
    if override.op == "delete":
        _delete(state.given, key)
        state.warn(f"~{override.key}: reset to attnboard's default")
        return
    if key in state.given:
        state.warn(f"{key} is given twice; the last value wins")
    _assign(state.given, key, given)


def _lookup(state: _State, ref: str, key: str) -> Any:
    if ref.startswith("oc.select:"):
        target, _, default_text = ref[len("oc.select:") :].partition(",")
        target, default_text = target.strip(), default_text.strip()
        default: Any = parse_hydra_value(default_text) if default_text else None
        has_default = bool(default_text)
    elif ":" in ref:
        raise KeyError(f"resolver {ref.split(':', 1)[0]} is not supported; attnboard resolves ${{key}} "
                       "and ${oc.select:key,default}")
    else:
        target, default, has_default = ref, None, False
    if target.startswith("."):
        target = key.rsplit(".", 1)[0] + target
    target = ALIASES.get(target, target)
    for table, name in ((state.given, target), (state.passthrough, target), (state.passthrough, "+" + target)):
        if name in table:
            return _kept(target, table[name].value)
    for defaults in (_SPEC_DEFAULTS, VERL_DEFAULTS):
        if target in defaults:
            return _kept(target, defaults[target])
    if has_default or ref.startswith("oc.select:"):
        return default
    raise KeyError(f"${{{ref}}} refers to {target}, which neither the import nor verl's defaults have")


def _kept(key: str, value: Any) -> Any:
    """A kept interpolation (``KEPT_INTERPOLATIONS``) read by another key's interpolation: resolved there."""
    return decode_omegaconf(value) if isinstance(value, str) and KEPT_INTERPOLATIONS.get(key) == value else value


def _resolve(state: _State, key: str, value: Any, depth: int = 0) -> Any:
    if isinstance(value, list):
        return [_resolve(state, key, v, depth) for v in value]
    if isinstance(value, dict):
        return {k: _resolve(state, key, v, depth) for k, v in value.items()}
    if not isinstance(value, Interpolation):
        return value
    if depth >= MAX_INTERPOLATION_DEPTH:
        raise KeyError(f"interpolations nest deeper than {MAX_INTERPOLATION_DEPTH} (a cycle?)")
    resolved = [p if isinstance(p, str) else _resolve(state, key, _lookup(state, p[0], key), depth + 1)
                for p in value.parts]
    if len(resolved) == 1 and not isinstance(value.parts[0], str):
        return resolved[0]
    return "".join(v if isinstance(v, str) else _omegaconf_str(v) for v in resolved)


def _omegaconf_str(value: Any) -> str:
    return "None" if value is None else str(value)


def _resolved(state: _State, table: dict[str, _Given]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, given in table.items():
        if isinstance(given.value, Interpolation) and given.value.text() == KEPT_INTERPOLATIONS.get(key):
            out[key] = KEPT_INTERPOLATIONS[key]
            continue
        try:
            out[key] = _resolve(state, key.lstrip("+"), given.value)
        except (KeyError, ValueError) as exc:
            message = exc.args[0] if exc.args else str(exc)
            raise VerlImportError(f"{key}: {message}", given.word.raw, given.word.position) from None
    return out


ALIAS_READERS: dict[str, tuple[str, ...]] = {
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size": ("actor_rollout_ref.ref.ulysses_sequence_parallel_size",),
}
"""verl 0.9.1's keys whose default reads a deprecated key (``ALIASES``) under its old name: verl's
``ref/dp_ref.yaml`` has ``ulysses_sequence_parallel_size: ${oc.select:actor_rollout_ref.actor.ulysses_sequence_parallel_size,1}``.
A test checks this table against every interpolation of the wheel's ``_generated_ppo_trainer.yaml``."""


def _pin_alias_readers(state: _State) -> None:
    """A deprecated key given is read by verl under its own name too: each of verl's keys whose default reads
    it, and that the script does not give, keeps the value verl composes for it (kept in the pass-through), so
    the export (which writes the key's new name) launches the same run: the reference keeps the actor's SP."""
    for alias, given in state.aliased.items():
        for reader in ALIAS_READERS.get(alias, ()):
            if reader not in state.passthrough and "+" + reader not in state.passthrough:
                state.passthrough[reader] = given
                state.warn(f"{reader} reads the deprecated {alias} in verl: kept as {given.raw or given.value}")


def _asks(state: _State, flat: dict[str, Any]) -> dict[str, str]:
    """Modelled keys that must be numbers or flags and hold a value from the environment the script runs in
    (``trainer.nnodes=$SLURM_JOB_NUM_NODES``): taken out of ``flat`` (the spec keeps its default) and asked for."""
    asks: dict[str, str] = {}
    for key in list(flat):
        given = state.given.get(key)
        if given is not None and given.word.verbatim and key in _ANNOTATIONS and key not in _STRING_KEYS and \
                isinstance(flat[key], str):
            asks[key] = flat.pop(key)
            state.warn(f"{key}={asks[key]}: its value is known only where the script runs; the spec keeps "
                       f"{_SPEC_DEFAULTS.get(key)!r} until it is given (import again with the variable's value)")
    return asks


def _check_engine_strategies(state: _State, engine: str) -> None:
    """``strategy=megatron`` (veomni, ...) is that engine's own value under its ``model_engine``, where the export
    keeps it through ``model_engine``; without it verl keeps dp's sections (refused, naming the fix)."""
    for key, (value, word) in state.engine_strategies.items():
        if ENGINE_STRATEGY.get(engine) != value:
            engine_name = next(e for e, s in ENGINE_STRATEGY.items() if s == value)
            raise VerlImportError(MEGATRON_MESSAGE.format(what=f"{key}={value}", engine=engine_name, version=VERL_VERSION),
                                  word.raw, word.position)
        state.warn(f"{key}={value} is model_engine={engine}'s own default: kept through model_engine")
    for key in sorted(state.added_plus):
        if not needs_plus(key, engine):
            state.warn(f"verl rejects +{key}: the key exists in its default config; write {key}= or ++{key}=")
    for key in state.set_bare & set(state.passthrough):
        outside = key_outside_engine(key, engine)
        if outside:
            word = state.passthrough[key].word
            raise VerlImportError(outside, word.raw, word.position)


def _finish(state: _State, source_text: str) -> ImportResult:
    _pin_alias_readers(state)
    flat = _resolved(state, state.given)
    _check_engine_strategies(state, str(flat.get(MODEL_ENGINE_KEY, ModelEngine.dp.value)))
    for key, value in flat.items():
        raw = state.given[key].raw
        if key in _STRING_KEYS and isinstance(value, (bool, int, float)):
            flat[key] = raw.strip() if raw is not None else str(value)
    asks = _asks(state, flat)
    passthrough = _resolved(state, state.passthrough)
    try:
        spec = parse_spec({**flat, PASSTHROUGH: passthrough} if passthrough else flat)
    except SpecError as exc:
        errors = [i for i in exc.issues if i.severity == "error"] or exc.issues
        first = errors[0]
        word = _word_for(state, first.field) or Word(source_text[:80], source_text[:80], 0)
        message = "; ".join(f"{i.field}: {i.message}" for i in errors)
        if "$" in message and any(isinstance(i.value, str) and "$" in i.value for i in errors):
            message += " (a value from the environment or the script's arguments is not known here)"
        raise VerlImportError(message, word.raw, word.position, issues=errors) from None
    if "attn_implementation" in spec.critic.model.override_config:
        state.warn(CRITIC_ATTN_WARNING)
    if "actor_rollout_ref.rollout.name" in flat:
        name = spec.actor_rollout_ref.rollout.name
        state.warn(HF_ROLLOUT_WARNING if name == "hf" else engine_rollout_warning(name))
    if spec.verl_passthrough:
        state.warn(f"{PASSTHROUGH_NOTE}: {', '.join(spec.verl_passthrough)}")
    for key in spec.verl_passthrough:
        retired = retired_message(key.lstrip("+"))
        if retired:
            state.warn(retired)
    return ImportResult(spec=spec, warnings=state.warnings, overrides=flat, asks=asks)


def _word_for(state: _State, field_name: str) -> Word | None:
    if field_name.startswith(PASSTHROUGH + "."):
        field_name = field_name[len(PASSTHROUGH) + 1:]
    best: tuple[int, Word] | None = None
    for table in (state.given, state.passthrough):
        for stored, given in table.items():
            key = stored.lstrip("+")
            bare_field = field_name.lstrip("+")
            if key == bare_field or bare_field.startswith(key + ".") or key.startswith(bare_field + "."):
                score = len(key) if bare_field.startswith(key) else len(bare_field)
                if best is None or score > best[0]:
                    best = (score, given.word)
    return best[1] if best else None


def _check_size(text: str) -> None:
    try:
        yaml_guard.check_size(text)
    except yaml_guard.InputTooLarge as exc:
        raise VerlImportError(str(exc), text[MAX_INPUT_BYTES - 20 : MAX_INPUT_BYTES], MAX_INPUT_BYTES) from None

