"""A spec out as a verl command line or YAML config that verl composes to the same run."""

from __future__ import annotations

import re
import shlex
from typing import Any

import yaml

from worker.interop.verl.apply import _SPEC_DEFAULTS, KEPT_INTERPOLATIONS, _spec_flat
from worker.interop.verl.hydra import _KEY, encode_omegaconf, hydra_value
from worker.interop.verl.results import (
    _VERL_SEARCHPATH,
    ATTNBOARD_KEYS_WARNING,
    CRITIC_ATTN_WARNING,
    DEFAULT_ENTRYPOINT,
    HF_ROLLOUT_WARNING,
    ExportResult,
    engine_rollout_warning,
)
from worker.spec import (
    OPEN_DICT_FIELDS,
    SPEC_KEYS,
    VERL_NAMES,
    RunSpec,
    needs_plus,
    unflatten,
)
from worker.spec.engines import MODEL_ENGINE_KEY, ModelEngine
from worker.spec.verl_defaults import MANDATORY, VERL_DEFAULTS


def _export_items(spec: RunSpec, *, full: bool) -> list[tuple[str, Any]]:
    """The (dotted key, value) pairs to write, override_config expanded one leaf per key."""
    flat = _spec_flat(spec)
    items: list[tuple[str, Any]] = []
    for key in SPEC_KEYS:
        if key in OPEN_DICT_FIELDS:
            items.extend((k, v) for k, v in flat.items() if k.startswith(key + "."))
            continue
        value = flat[key]
        verl_key = VERL_NAMES.get(key, key)
        verl_default = VERL_DEFAULTS.get(verl_key, _SPEC_DEFAULTS[key])
        if full or verl_default == MANDATORY or not _same(value, verl_default) or not _same(value, _SPEC_DEFAULTS[key]):
            items.append((verl_key, value))
    # Every pass-through key, as given: a key verl's config lacks keeps its + (see split_passthrough).
    items.extend(spec.verl_passthrough.items())
    return items


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b if isinstance(a, bool) or isinstance(b, bool) else a == b


def _export_warnings(spec: RunSpec, keys: list[str]) -> list[str]:
    warnings: list[str] = []
    if "attn_implementation" in spec.critic.model.override_config:
        warnings.append(CRITIC_ATTN_WARNING)
    if any(k.startswith("attnboard.") for k in keys):
        warnings.append(ATTNBOARD_KEYS_WARNING)
    name = spec.actor_rollout_ref.rollout.name
    warnings.append(HF_ROLLOUT_WARNING if name == "hf" else engine_rollout_warning(name))
    return warnings


_SHELL_EXPANSION = re.compile(
    r"(?<!\\)\$(?:[A-Za-z_][A-Za-z0-9_]*|[0-9]"
    r"|\{[A-Za-z_0-9][A-Za-z0-9_]*(?:[:#%/^,@*?+=-][^{}]*)?\}"
    r"|\((?:[^()]|\([^()]*\))*\))"
)
"""What a value holds for the shell to expand when the command runs, as the import kept it from the script:
``$HOME``, ``${HOME}``, ``${NNODES:-8}``, ``$(date +%Y%m%d)``. OmegaConf's ``${trainer.project_name}`` and
``${oc.env:HOME}`` are not shell syntax and stay verl's; nor is a ``$`` after a backslash."""


def _expandable(value: Any, spans: list[str], mark: str) -> Any:
    """``value`` with every shell expansion in its strings replaced by a token, the spans kept in order."""
    if isinstance(value, str):
        def token(match: re.Match) -> str:
            spans.append(match.group(0))
            return f"{mark}{len(spans) - 1}{mark}"
        return _SHELL_EXPANSION.sub(token, value)
    if isinstance(value, list):
        return [_expandable(v, spans, mark) for v in value]
    if isinstance(value, dict):
        return {k: _expandable(v, spans, mark) for k, v in value.items()}
    return value


def _shell_word(text: str, spans: list[str], mark: str) -> str:
    """One shell word for ``text``: single-quoted when nothing in it expands; else double-quoted, every
    character literal but the expansions, so bash expands them when the command runs."""
    if not spans:
        return shlex.quote(text)
    parts = re.split(f"{mark}([0-9]+){mark}", text)
    out = ['"']
    for k, part in enumerate(parts):
        out.append(spans[int(part)] if k % 2 else re.sub(r'([\\"$`])', r"\\\1", part))
    return "".join(out) + '"'


def export_command(spec: RunSpec, *, entrypoint: str = DEFAULT_ENTRYPOINT, full: bool = False) -> ExportResult:
    """The spec as a verl command line, one override per line. Keys in verl's default config are
    written bare, the others (override_config sub-keys, attnboard.*, pass-through keys verl's config
    lacks) with ``+``. Without ``full``, only modelled keys that differ from verl's defaults, plus the
    mandatory ones; the pass-through keys are always written."""
    items = _export_items(spec, full=full)
    lines = [entrypoint]
    warnings: list[str] = []
    expanded: list[str] = []
    for key, value in items:
        spans: list[str] = []
        mark = _token_mark(value)
        try:
            text = value if key in KEPT_INTERPOLATIONS and value == KEPT_INTERPOLATIONS[key] else \
                hydra_value(_expandable(value, spans, mark))
        except TypeError as exc:
            warnings.append(f"skipped {key}: {exc}")
            continue
        bare = key.lstrip("+")
        if "\x00" in text:
            warnings.append(f"skipped {key}: a NUL character cannot be passed on a command line")
            continue
        if not _KEY.match(bare):
            warnings.append(f"skipped {key}: not a dotted key Hydra can read")
            continue
        plus = "+" if key.startswith("+") or needs_plus(bare, spec.model_engine) else ""
        lines.append("    " + _shell_word(f"{plus}{bare}={text}", spans, mark))
        expanded.extend(s for s in spans if s not in expanded)
    if expanded:
        warnings.append("expanded by the shell when the command runs, as in the script it came from: " +
                        ", ".join(expanded))
    warnings = _export_warnings(spec, [k for k, _ in items]) + warnings
    return ExportResult(text=" \\\n".join(lines) + "\n", warnings=warnings)


def _token_mark(value: Any) -> str:
    """A letter run that ``value`` does not hold, to mark tokens Hydra reads as plain characters."""
    text = repr(value)
    return next(m for m in ("Qz", "Qzx", "Qzxq", "QzxqZ" * 4) if m not in text)


class _Unescaped(str):
    """A kept interpolation (``KEPT_INTERPOLATIONS``): written as is, for verl to resolve."""


def _tree_for_yaml(value: Any) -> Any:
    if isinstance(value, _Unescaped):
        return str(value)
    if isinstance(value, dict):
        return {k: _tree_for_yaml(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_tree_for_yaml(v) for v in value]
    if isinstance(value, str):
        return encode_omegaconf(value)
    return value


def export_yaml(spec: RunSpec, *, full: bool = True) -> ExportResult:
    """The spec as a verl YAML config: ``defaults: [ppo_trainer, _self_]`` then the nested keys, so
    ``python3 -m verl.trainer.main_ppo --config-path=DIR --config-name=FILE`` runs it. No ``+`` is
    needed in a config file: composition may add keys that the defaults lack."""
    items = _export_items(spec, full=full)
    tree = unflatten({k.lstrip("+"): _Unescaped(v) if k in KEPT_INTERPOLATIONS and v == KEPT_INTERPOLATIONS[k] else v
                      for k, v in items})
    keys = [k for k, _ in items]
    engine = tree.pop(MODEL_ENGINE_KEY, ModelEngine.dp.value)
    document = {
        "hydra": {**_VERL_SEARCHPATH, **_tree_for_yaml(tree.pop("hydra", {}))},
        "defaults": ["ppo_trainer", *([{f"override {MODEL_ENGINE_KEY}": engine}] if engine != ModelEngine.dp.value else []),
                     "_self_"],
        **_tree_for_yaml(tree),
    }
    text = yaml.safe_dump(document, sort_keys=False, allow_unicode=True, default_flow_style=False, width=100)
    if yaml.safe_load(text) != document:
        # PyYAML writes some characters (NEL, LS, PS) raw that read back as line breaks: escape them all.
        text = yaml.safe_dump(document, sort_keys=False, allow_unicode=False, default_flow_style=False, width=100)
    return ExportResult(text=text, warnings=_export_warnings(spec, keys))
