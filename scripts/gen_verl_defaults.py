"""Regenerate worker/spec/verl_defaults.py and worker/spec/verl_engine_keys.py from the installed verl wheel.

    .venv/bin/python scripts/gen_verl_defaults.py

``tests/worker/spec/test_verl_defaults.py`` fails when a committed file differs from what this renders.

``verl_defaults.py`` is verl's default config (``model_engine=dp``); ``verl_engine_keys.py`` holds, per other
``model_engine`` (megatron, torchtitan, veomni: their ``_generated_ppo_<engine>_trainer.yaml``), the keys its
config adds to dp's with their defaults, the dp keys it lacks, and the keys whose default is another key's
value (the reference inheriting the actor's ``veomni.attn_implementation``). Automodel has no PPO config in
verl 0.9.1 (newer verl's ``model_engine=automodel`` puts the wheel's ``engine/automodel.yaml`` under
``actor_rollout_ref.{actor,ref}.automodel_config``): its keys are that file's, placed there.

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
ENGINE_TARGET = ROOT / "worker" / "spec" / "verl_engine_keys.py"
CONFIG_DIR = Path("trainer") / "config"
YAML_NAME = CONFIG_DIR / "_generated_ppo_trainer.yaml"
ENGINES = ("megatron", "torchtitan", "veomni")
AUTOMODEL_YAML = CONFIG_DIR / "engine" / "automodel.yaml"
AUTOMODEL_SECTIONS = ("actor_rollout_ref.actor.automodel_config", "actor_rollout_ref.ref.automodel_config")
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


def _config_file(name: Path) -> Path:
    return find_generated_yaml().parents[2] / name


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


_SELECT_ANY = re.compile(r"^\$\{oc\.select:\s*([A-Za-z_][\w.]*)\s*,.*\}$")


def _inherits(flat: dict[str, Any], key: str) -> str | None:
    """The key (or section) whose value ``key`` takes by default (``${oc.select:other,default}``)."""
    match = _SELECT_ANY.match(flat[key]) if isinstance(flat[key], str) else None
    return match.group(1) if match is not None else None


def _dict_text(name: str, annotation: str, values: dict[str, Any]) -> str:
    body = "".join(f"    {key!r}: {_tuple_text(value) if isinstance(value, tuple) else repr(value)},\n"
                   for key, value in values.items())
    return f"{name}: {annotation} = {{\n{body}}}\n"


def render_engines() -> tuple[str, dict[str, int]]:
    """The engine key module's text and, per engine, how many keys it adds."""
    version = importlib.metadata.version("verl")
    dp = flatten(yaml.safe_load(find_generated_yaml().read_text()))
    added: dict[str, dict[str, Any]] = {}
    absent: dict[str, list[str]] = {}
    inherits: dict[str, str] = {}
    for engine in ENGINES:
        flat = flatten(yaml.safe_load(_config_file(CONFIG_DIR / f"_generated_ppo_{engine}_trainer.yaml").read_text()))
        added[engine] = {key: resolve(flat, key) for key in sorted(flat) if key not in dp}
        absent[engine] = sorted(key for key in dp if key not in flat)
        inherits.update({key: target for key in sorted(added[engine]) if (target := _inherits(flat, key))})
    automodel = flatten(yaml.safe_load(_config_file(AUTOMODEL_YAML).read_text()))
    added["automodel"] = {f"{section}.{key}": value for section in AUTOMODEL_SECTIONS for key, value in automodel.items()}
    absent["automodel"] = []
    counts = {engine: len(keys) for engine, keys in added.items()}
    text = (
        "# GENERATED FILE, DO NOT EDIT. Regenerate with: .venv/bin/python scripts/gen_verl_defaults.py\n"
        f'"""The keys verl {version}\'s other training engines add to its default (``model_engine=dp``) config, generated\n'
        "by ``scripts/gen_verl_defaults.py`` from the wheel's ``_generated_ppo_<engine>_trainer.yaml`` (automodel: its\n"
        "``engine/automodel.yaml`` under ``actor_rollout_ref.{actor,ref}.automodel_config``, as newer verl places it).\n\n"
        "``ENGINE_KEYS``: engine -> dotted key -> default. ``ENGINE_ABSENT``: engine -> the keys of dp's config it lacks.\n"
        "``ENGINE_INHERITS``: a key whose default is another key's value (``${oc.select:other,default}``).\n"
        '"""\n\n'
        "from typing import Any\n\n"
        + _dict_text("ENGINE_KEYS", "dict[str, dict[str, Any]]",
                     {engine: _Raw(_dict_inline(keys)) for engine, keys in added.items()})
        + "\n"
        + _dict_text("ENGINE_ABSENT", "dict[str, tuple[str, ...]]", {e: tuple(keys) for e, keys in absent.items()})
        + "\n"
        + _dict_text("ENGINE_INHERITS", "dict[str, str]", inherits)
    )
    return text, counts


class _Raw(str):
    """Text written into the generated module as is."""

    def __repr__(self) -> str:
        return str(self)


def _tuple_text(values: tuple[str, ...]) -> str:
    return "(\n" + "".join(f"        {value!r},\n" for value in values) + "    )"


def _dict_inline(values: dict[str, Any]) -> str:
    return "{\n" + "".join(f"        {key!r}: {value!r},\n" for key, value in values.items()) + "    }"


def main() -> None:
    text, count, version = render()
    TARGET.write_text(text)
    print(f"{TARGET.relative_to(ROOT)}: {count} keys from verl {version}")
    engine_text, counts = render_engines()
    ENGINE_TARGET.write_text(engine_text)
    print(f"{ENGINE_TARGET.relative_to(ROOT)}: " + ", ".join(f"{e} +{n} keys" for e, n in counts.items()))


if __name__ == "__main__":
    main()
