"""The one YAML guard: size, depth and values with aliases followed."""

from __future__ import annotations

import pytest
import yaml

from worker.core import yaml_guard
from worker.core.limits import MAX_INPUT_BYTES, MAX_YAML_DEPTH, MAX_YAML_NODES, utf8_size


def bomb(levels: int) -> str:
    lines = ["a: &a [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]"]
    for i in range(1, levels):
        prev, cur = chr(96 + i), chr(97 + i)
        lines.append(f"{cur}: &{cur} [{', '.join(['*' + prev] * 10)}]")
    return "\n".join(lines)


@pytest.mark.parametrize("text,expected", [
    ("", None),
    ("trainer:\n  device: cpu\n", {"trainer": {"device": "cpu"}}),
    ("a: &a [x, x]\nb: [*a, *a]\n", {"a": ["x", "x"], "b": [["x", "x"], ["x", "x"]]}),
])
def test_ordinary_documents_load_as_safe_load_does(text, expected):
    assert yaml_guard.safe_load(text) == expected == yaml.safe_load(text)


def test_an_alias_bomb_is_refused_by_its_expanded_size():
    yaml_guard.safe_load(bomb(3))  # 1,000 values
    with pytest.raises(yaml_guard.YamlTooLarge, match=f"more than {MAX_YAML_NODES} values"):
        yaml_guard.safe_load(bomb(6))


def test_deep_nesting_is_refused():
    yaml_guard.safe_load("[" * (MAX_YAML_DEPTH - 1) + "]" * (MAX_YAML_DEPTH - 1))
    with pytest.raises(yaml_guard.YamlTooLarge, match=f"deeper than {MAX_YAML_DEPTH} levels"):
        yaml_guard.safe_load("[" * (MAX_YAML_DEPTH + 1) + "]" * (MAX_YAML_DEPTH + 1))


def test_size_is_counted_in_utf8_bytes():
    yaml_guard.check_size("x" * MAX_INPUT_BYTES)
    text = "é" * (MAX_INPUT_BYTES // 2 + 1)
    assert utf8_size(text) == MAX_INPUT_BYTES + 2
    with pytest.raises(yaml_guard.InputTooLarge, match=f"input is {MAX_INPUT_BYTES + 2} bytes; the limit is"):
        yaml_guard.check_size(text)


def test_a_cycle_of_aliases_and_bad_syntax_are_yaml_errors():
    with pytest.raises(yaml.MarkedYAMLError):
        yaml_guard.compose("a: [1, 2\n")
