"""``worker/spec/verl_defaults.py`` is generated from the installed verl wheel: it must be exactly what
``scripts/gen_verl_defaults.py`` renders now, so a hand edit or a verl upgrade without regeneration fails."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _generator():
    spec = importlib.util.spec_from_file_location("gen_verl_defaults", ROOT / "scripts" / "gen_verl_defaults.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_committed_defaults_equal_the_generators_output():
    gen = _generator()
    text, count, version = gen.render()
    committed = gen.TARGET.read_text()
    assert committed == text, "worker/spec/verl_defaults.py differs from the wheel: run scripts/gen_verl_defaults.py"
    assert count > 800 and version == "0.9.1"
    assert committed.startswith("# GENERATED FILE, DO NOT EDIT. Regenerate with: ")


def test_committed_engine_keys_equal_the_generators_output():
    gen = _generator()
    text, counts = gen.render_engines()
    committed = gen.ENGINE_TARGET.read_text()
    assert committed == text, "worker/spec/verl_engine_keys.py differs from the wheel: run scripts/gen_verl_defaults.py"
    assert committed.startswith("# GENERATED FILE, DO NOT EDIT. Regenerate with: ")
    assert set(counts) == {"megatron", "torchtitan", "veomni", "automodel"} and min(counts.values()) > 50
