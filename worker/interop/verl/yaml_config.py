"""A verl YAML config in: bounded (depth, values after aliases), keys read as overrides of verl's defaults."""

from __future__ import annotations

import re
from typing import Any

import yaml

from worker.core import yaml_guard
from worker.interop.shell import Word
from worker.interop.verl.apply import _apply, _check_size, _finish, _State
from worker.interop.verl.hydra import Override, decode_omegaconf
from worker.interop.verl.results import _VERL_SEARCHPATH, ImportResult, VerlImportError, _word_end
from worker.spec.engines import MODEL_ENGINE_KEY

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
"""A mapping whose keys are all names is read key by key; one keyed otherwise (an FSDP-Turbo plan keyed by
``blocks.{*}``) is one value."""


def _yaml_overrides(node: yaml.Node, loader: yaml_guard.BoundedLoader, text: str, prefix: str = "") -> list[Override]:
    """Leaves of a composed mapping as ``set`` overrides carrying each key's position."""
    out: list[Override] = []
    for key_node, value_node in node.value:
        start = key_node.start_mark.index
        word_text = text[start : value_node.end_mark.index] if value_node.end_mark else key_node.value
        word = Word(word_text, word_text, start)
        if not isinstance(key_node, yaml.ScalarNode) or key_node.tag != "tag:yaml.org,2002:str":
            raise VerlImportError(f"YAML keys must be strings, got {key_node.value!r}", word_text, start)
        key = f"{prefix}{key_node.value}"
        if isinstance(value_node, yaml.MappingNode) and value_node.value and all(
                isinstance(k, yaml.ScalarNode) and _NAME.match(k.value) for k, _ in value_node.value):
            out.extend(_yaml_overrides(value_node, loader, text, key + "."))
            continue
        try:
            value = _decode_tree(loader.construct_object(value_node, deep=True))
        except ValueError as exc:
            raise VerlImportError(f"{key}: {exc}", word_text, start) from None
        raw = value_node.value if isinstance(value_node, yaml.ScalarNode) else None
        out.append(Override("set", key, value, raw, word))
    return out




def _is_verl_searchpath(value: Any) -> bool:
    """The ``hydra:`` block ``export_yaml`` writes so that ``defaults: [ppo_trainer]`` is found."""
    return value == _VERL_SEARCHPATH


def _decode_tree(value: Any) -> Any:
    """``decode_omegaconf`` on every string of a YAML value, at any depth."""
    if isinstance(value, str):
        return decode_omegaconf(value)
    if isinstance(value, list):
        return [_decode_tree(v) for v in value]
    if isinstance(value, dict):
        return {k: _decode_tree(v) for k, v in value.items()}
    return value


def import_yaml(text: str) -> ImportResult:
    """A verl YAML config (nested keys, as in the seed's example) -> a spec and its warnings."""
    _check_size(text)
    try:
        root, loader = yaml_guard.compose(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        index = mark.index if mark else 0
        raise VerlImportError(f"invalid YAML: {exc.problem or exc.context}", text[index : _word_end(text, index)],
                              index) from None
    except yaml.YAMLError as exc:
        raise VerlImportError(str(exc), text[:40], 0) from None
    except RecursionError:
        raise VerlImportError("YAML nests too deeply", text[:40], 0) from None
    loader.dispose()  # as safe_load does; constructing from the composed nodes still works
    state = _State()
    if root is None:
        return _finish(state, text)
    if not isinstance(root, yaml.MappingNode):
        raise VerlImportError("a verl YAML config must be a mapping of sections (actor_rollout_ref:, critic:, ...)",
                              text[:40], root.start_mark.index)
    body = []
    for key_node, value_node in root.value:
        if isinstance(key_node, yaml.ScalarNode) and key_node.value == "hydra" and isinstance(
                value_node, yaml.MappingNode):
            value_node.value = [(k, v) for k, v in value_node.value
                                if not (isinstance(k, yaml.ScalarNode) and k.value == "searchpath" and _is_verl_searchpath(
                                    {"searchpath": loader.construct_object(v, deep=True)}))]
            if not value_node.value:
                continue
        if isinstance(key_node, yaml.ScalarNode) and key_node.value == "defaults":
            names = loader.construct_object(value_node, deep=True)
            if not (isinstance(names, list) and "ppo_trainer" in names):
                state.warn("ignored: the defaults list; keys are read against verl's ppo_trainer defaults")
            for entry in names if isinstance(names, list) else []:
                group = {k.removeprefix("override ").strip(): v for k, v in entry.items()} if isinstance(entry, dict) else {}
                if MODEL_ENGINE_KEY in group:
                    _apply(state, Override("set", MODEL_ENGINE_KEY, group[MODEL_ENGINE_KEY], None,
                                           Word(key_node.value, key_node.value, key_node.start_mark.index)),
                           command_line=False)
            continue
        body.append((key_node, value_node))
    root.value = body
    for override in _yaml_overrides(root, loader, text):
        _apply(state, override, command_line=False)
    return _finish(state, text)

