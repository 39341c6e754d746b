"""Regenerate worker/spec/verl_defaults.py from the installed verl wheel's generated default config.

    .venv/bin/python scripts/gen_verl_defaults.py

``tests/worker/spec/test_verl_defaults.py`` fails when the committed file differs from what this prints.

verl is located with ``importlib.util.find_spec`` and never imported (it is installed with
``--no-deps``, so importing it would fail). Interpolations of the form ``${key}`` and
``${oc.select:key,default}`` are resolved against the same config so the defaults are the values
verl would see; anything else (nested or custom resolvers) is kept as its text.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
TARGET = ROOT / "worker" / "spec" / "verl_defaults.py"
YAML_NAME = Path("trainer") / "config" / "_generated_ppo_trainer.yaml"
_SELECT = re.compile(r"^\$\{(?:oc\.select:)?\s*([^,{}$]+?)\s*(?:,\s*([^{}$]*?)\s*)?\}$")


def find_generated_yaml() -> Path:
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("verl is not installed: .venv/bin/pip install --no-deps verl==0.9.1")
    for location in spec.submodule_search_locations:
        candidate = Path(location) / YAML_NAME
        if candidate.is_file():
            return candidate
    sys.exit(f"verl is installed but has no {YAML_NAME}")


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def resolve(flat: dict[str, Any], key: str, depth: int = 0) -> Any:
    value = flat[key]
    match = _SELECT.match(value) if isinstance(value, str) else None
    if match is None or depth > 10:
        return value
    target, default = match.group(1), match.group(2)
    if target.startswith("."):
        target = key.rsplit(".", 1)[0] + target
    if target in flat:
        return resolve(flat, target, depth + 1)
    if default is not None:
        return yaml.safe_load(default) if default else None
    return value


def render() -> tuple[str, int, str]:
    """The generated module's text, the number of keys and verl's version."""
    path = find_generated_yaml()
    version = importlib.metadata.version("verl")
    flat = flatten(yaml.safe_load(path.read_text()))
    resolved = {key: resolve(flat, key) for key in sorted(flat)}
    body = "{\n" + "".join(f"    {key!r}: {value!r},\n" for key, value in resolved.items()) + "}"
    text = (
        "# GENERATED FILE, DO NOT EDIT. Regenerate with: .venv/bin/python scripts/gen_verl_defaults.py\n"
        '"""verl\'s known config keys and their defaults, generated from verl '
        f"{version}'s\n``verl/trainer/config/_generated_ppo_trainer.yaml`` by ``scripts/gen_verl_defaults.py``.\n\n"
        "Dotted leaf keys -> default. ``MANDATORY`` (``???``) marks a key verl requires on the command line;\n"
        'an empty dict is a leaf whose sub-keys verl does not declare (``override_config``).\n"""\n\n'
        "from typing import Any\n\n"
        f'VERL_VERSION = "{version}"\n'
        'MANDATORY = "???"\n\n'
        f"VERL_DEFAULTS: dict[str, Any] = {body}\n"
    )
    return text, len(resolved), version


def main() -> None:
    text, count, version = render()
    TARGET.write_text(text)
    print(f"{TARGET.relative_to(ROOT)}: {count} keys from verl {version}")


if __name__ == "__main__":
    main()
