"""One guard for untrusted YAML: the size of the text, the nesting depth while composing, and the number of
values once aliases are expanded (an alias bomb composes to a few nodes and expands to billions). The
importer (``worker.interop.verl.import_yaml``), spec files and the app's import all compose through it.
"""

from __future__ import annotations

from typing import Any

import yaml

from worker.core.limits import MAX_INPUT_BYTES, MAX_YAML_DEPTH, MAX_YAML_NODES, utf8_size


class InputTooLarge(ValueError):
    """The text is larger than ``MAX_INPUT_BYTES``."""

    def __init__(self, size: int, limit: int = MAX_INPUT_BYTES):
        self.size, self.limit = size, limit
        super().__init__(f"input is {size} bytes; the limit is {limit} bytes")


class YamlTooLarge(yaml.YAMLError):
    """The document nests deeper than ``MAX_YAML_DEPTH`` or expands past ``MAX_YAML_NODES`` values."""


def check_size(text: str, limit: int = MAX_INPUT_BYTES) -> None:
    """Raise ``InputTooLarge`` when ``text`` is over the limit."""
    size = utf8_size(text)
    if size > limit:
        raise InputTooLarge(size, limit)


class BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses to compose deeper than ``MAX_YAML_DEPTH`` levels."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        if self._depth > MAX_YAML_DEPTH:
            mark = self.peek_event().start_mark
            raise YamlTooLarge(f"YAML nests deeper than {MAX_YAML_DEPTH} levels at character {mark.index}")
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def expanded_size(node: yaml.Node, limit: int = MAX_YAML_NODES) -> int:
    """How many values ``node`` holds with aliases followed (each shared node counted once per use);
    ``YamlTooLarge`` past ``limit``, ``yaml.YAMLError`` when aliases form a cycle."""
    memo: dict[int, int] = {}
    active: set[int] = set()

    def size_of(node: yaml.Node) -> int:
        ident = id(node)
        if ident in memo:
            return memo[ident]
        if ident in active:
            raise yaml.YAMLError("YAML aliases form a cycle")
        active.add(ident)
        size = 1
        if isinstance(node, yaml.SequenceNode):
            size += sum(size_of(child) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            size += sum(size_of(k) + size_of(v) for k, v in node.value)
        active.discard(ident)
        memo[ident] = size
        if size > limit:
            raise YamlTooLarge(f"YAML expands to more than {limit} values (an alias bomb?)")
        return size

    return size_of(node)


def compose(text: str) -> tuple[yaml.Node | None, BoundedLoader]:
    """The text's single YAML document, composed within every limit, and the loader (to construct values from
    its nodes; the caller disposes it). Raises ``InputTooLarge``, ``YamlTooLarge``, ``yaml.YAMLError`` (a
    ``yaml.MarkedYAMLError`` with the position of a syntax error) or ``RecursionError``."""
    check_size(text)
    loader = BoundedLoader(text)
    try:
        root = loader.get_single_node()
        if root is not None:
            expanded_size(root)
    except BaseException:
        loader.dispose()
        raise
    return root, loader


def safe_load(text: str) -> Any:
    """``yaml.safe_load`` within the limits."""
    root, loader = compose(text)
    try:
        return None if root is None else loader.construct_document(root)
    finally:
        loader.dispose()
