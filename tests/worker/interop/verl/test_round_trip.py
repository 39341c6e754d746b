"""verl interop: export -> import is the identity (hypothesis over every spec field and pass-through key)."""

from __future__ import annotations

import math
import shlex
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from worker.core.implementations import BUILTIN_NAMES
from worker.interop.shell import read_script
from worker.interop.verl import (
    export_command,
    export_yaml,
    hydra_value,
    import_command,
    import_yaml,
    parse_hydra_value,
)
from worker.spec import (
    ALIASES,
    PASSTHROUGH_NOTE,
    RunSpec,
    classify_key,
    parse_spec,
)
from worker.spec.verl_defaults import VERL_DEFAULTS

# --------------------------------------------------------------------------------------------
# Round trips (hypothesis)

AWKWARD = st.sampled_from(["", " ", "true", "False", "null", "~", "1", "-2", "1e5", "inf", "nan", "0x10", "a,b",
                           "[x]", "{a:1}", "k=v", "it's", 'say "hi"', "\\", "back\\", "\\'", "${x}", "\\${y}",
                           "$HOME", "a b ", "注意力", "tab\there", "line\nbreak", "#hash", "yes", "on"])
# No NUL: a shell word cannot hold one (the export skips such a value, the API refuses it).
TEXT = st.one_of(AWKWARD, st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12),
                 st.builds(lambda a, b: a + b, AWKWARD, AWKWARD))
IDENT = st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True).filter(lambda k: k != "attn_implementation")
LEAF = st.one_of(st.none(), st.booleans(), st.integers(-(2**40), 2**40),
                 st.floats(allow_nan=False, width=64), TEXT)
HF_VALUE = st.recursive(LEAF, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                      st.dictionaries(IDENT, inner, max_size=3)), max_leaves=6)
OVERRIDE_CONFIG = st.builds(
    lambda attn, rest: ({"attn_implementation": attn} if attn else {}) | rest,
    st.one_of(st.none(), st.sampled_from((*BUILTIN_NAMES, "paged|sdpa", "kernels-community/flash-attn@main:fwd"))),
    st.dictionaries(IDENT, HF_VALUE, max_size=3),
)


PASSTHROUGH_LEAF = st.one_of(st.none(), st.booleans(), st.integers(-(2**40), 2**40),
                             st.floats(allow_nan=False, allow_infinity=False), TEXT.filter(lambda s: "\x00" not in s))
PASSTHROUGH_VALUE = st.recursive(PASSTHROUGH_LEAF, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(IDENT, inner, max_size=3)), max_leaves=5)
VERL_ONLY_KEYS = sorted(k for k in VERL_DEFAULTS if classify_key(k) == "verl" and k not in ALIASES)
ADDED_KEY = st.builds(lambda a, b: f"+{a}.x_{b}", st.sampled_from(["trainer", "reward_model", "zz"]), IDENT)
PASSTHROUGH_DATA = st.one_of(
    st.dictionaries(st.sampled_from(VERL_ONLY_KEYS), st.one_of(PASSTHROUGH_LEAF, st.lists(PASSTHROUGH_LEAF, max_size=3)),
                    max_size=5),
    st.dictionaries(ADDED_KEY, PASSTHROUGH_VALUE, max_size=3),
)


def _field_strategy(info: Any) -> st.SearchStrategy:
    ann = info.annotation
    if info.description and info.description.startswith(PASSTHROUGH_NOTE):
        return PASSTHROUGH_DATA
    if ann == (str | list[str]) or "list of parquet files" in (info.description or ""):
        file_name = TEXT.filter(lambda s: s and "\x00" not in s)
        return st.one_of(file_name, st.lists(file_name, min_size=1, max_size=3))
    bounds = {type(m).__name__: m for m in info.metadata}
    optional = ann in (int | None, str | None)
    if ann in (int, int | None):
        low = bounds["Gt"].gt + 1 if "Gt" in bounds else bounds["Ge"].ge if "Ge" in bounds else -(2**31)
        strategy = st.integers(low, bounds["Le"].le if "Le" in bounds else 2**31)
    elif ann is float:
        strategy = st.floats(min_value=bounds["Gt"].gt if "Gt" in bounds else bounds["Ge"].ge if "Ge" in bounds else None,
                             max_value=bounds["Le"].le if "Le" in bounds else 1e6, exclude_min="Gt" in bounds,
                             allow_nan=False, allow_infinity=False)
    elif ann is bool:
        strategy = st.booleans()
    elif ann in (str, str | None):
        min_size = bounds["MinLen"].min_length if "MinLen" in bounds else 0
        # a NUL cannot be in a shell word (the export skips it, the API refuses it)
        strategy = TEXT.filter(lambda s: len(s) >= min_size and "\x00" not in s)
    elif ann == dict[str, Any]:
        strategy = OVERRIDE_CONFIG
    elif isinstance(ann, type) and issubclass(ann, BaseModel):
        strategy = _model_strategy(ann)
    else:
        strategy = st.sampled_from([member.value for member in ann])
    return st.one_of(st.none(), strategy) if optional else strategy


def _model_strategy(model: type[BaseModel]) -> st.SearchStrategy:
    return st.fixed_dictionaries({name: _field_strategy(info) for name, info in model.model_fields.items()})


SPECS = _model_strategy(RunSpec).map(parse_spec)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(SPECS)
def test_command_round_trip(spec: RunSpec) -> None:
    assert import_command(export_command(spec).text).spec == spec


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(SPECS)
def test_full_command_round_trip(spec: RunSpec) -> None:
    assert import_command(export_command(spec, full=True).text).spec == spec


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(SPECS, st.booleans())
def test_yaml_round_trip(spec: RunSpec, full: bool) -> None:
    assert import_yaml(export_yaml(spec, full=full).text).spec == spec


@settings(max_examples=300, deadline=None)
@given(HF_VALUE)
def test_hydra_value_round_trip(value: Any) -> None:
    assert parse_hydra_value(hydra_value(value)) == value


@settings(max_examples=200, deadline=None)
@given(TEXT.filter(lambda s: "\x00" not in s))
def test_shell_quoting_round_trip(s: str) -> None:
    """A value exported inside a shell-quoted word reads back through both layers unchanged (a NUL
    character cannot be in a shell word at all)."""
    words = read_script("python3 " + shlex.quote("+k.v=" + hydra_value(s))).commands[0].words[1:]
    assert len(words) == 1
    assert parse_hydra_value(words[0].text.split("=", 1)[1]) == s


def test_round_trip_keeps_floats_exact() -> None:
    spec = parse_spec({"actor_rollout_ref.actor.optim.lr": 1 / 3, "algorithm.gamma": 0.1 + 0.2})
    again = import_command(export_command(spec).text).spec
    assert again.actor_rollout_ref.actor.optim.lr == 1 / 3
    assert math.isclose(again.algorithm.gamma, 0.30000000000000004, rel_tol=0, abs_tol=0)


# --------------------------------------------------------------------------------------------
# verl's training engines (model_engine) in and out


VEOMNI_COMMAND = ("python3 -m verl.trainer.main_ppo model_engine=veomni "
                  "actor_rollout_ref.actor.veomni.attn_implementation=flash_attention_2 "
                  "critic.veomni.attn_implementation=sdpa actor_rollout_ref.actor.veomni.ulysses_parallel_size=2")


def test_model_engine_is_imported_and_exported_as_a_config_group() -> None:
    spec = import_command(VEOMNI_COMMAND).spec
    assert spec.model_engine == "veomni"
    assert spec.verl_passthrough == {"actor_rollout_ref.actor.veomni.attn_implementation": "flash_attention_2",
                                     "critic.veomni.attn_implementation": "sdpa",
                                     "actor_rollout_ref.actor.veomni.ulysses_parallel_size": 2}
    lines = [line.strip(" \\") for line in export_command(spec).text.splitlines()]
    assert "model_engine=veomni" in lines  # a group: never +model_engine
    assert "actor_rollout_ref.actor.veomni.attn_implementation=flash_attention_2" in lines  # in veomni's config: bare
    assert import_command(export_command(spec).text).spec == spec
    document = yaml.safe_load(export_yaml(spec).text)
    assert document["defaults"] == ["ppo_trainer", {"override model_engine": "veomni"}, "_self_"]
    assert "model_engine" not in document
    assert import_yaml(export_yaml(spec).text).spec == spec


def test_the_retired_megatron_config_reads_as_model_engine_megatron() -> None:
    result = import_command("python3 -m verl.trainer.main_ppo --config-name=ppo_megatron_trainer "
                            "actor_rollout_ref.actor.strategy=megatron "
                            "actor_rollout_ref.actor.megatron.override_transformer_config.attention_backend=fused")
    assert result.spec.model_engine == "megatron"
    assert result.spec.verl_passthrough == {
        "actor_rollout_ref.actor.megatron.override_transformer_config.attention_backend": "fused"}
    assert ("--config-name=ppo_megatron_trainer is retired in verl 0.9.1 (the file says \"[Deprecated] ... please use "
            "ppo_trainer.yaml instead\"): read as ppo_trainer with model_engine=megatron") in result.warnings
    assert ("actor_rollout_ref.actor.strategy=megatron is model_engine=megatron's own default: kept through "
            "model_engine") in result.warnings
    assert "model_engine=megatron" in export_command(result.spec).text


def test_retired_keys_given_with_plus_are_passed_through_and_flagged() -> None:
    result = import_command("python3 -m verl.trainer.main_ppo +trainer.use_legacy_worker_impl=disable "
                            "actor_rollout_ref.rollout.mode=async")
    assert result.spec.verl_passthrough == {"+trainer.use_legacy_worker_impl": "disable",
                                            "actor_rollout_ref.rollout.mode": "async"}
    assert any(w.startswith("trainer.use_legacy_worker_impl is retired in verl 0.9.1: use model_engine")
               for w in result.warnings)
    assert any(w.startswith("actor_rollout_ref.rollout.mode is retired in verl 0.9.1") for w in result.warnings)


@pytest.mark.parametrize("engine,rejected", [("dp", False), ("veomni", True)])
def test_whether_verl_rejects_a_plus_depends_on_the_engine(engine, rejected) -> None:
    """``+actor_rollout_ref.actor.veomni.attn_implementation``: Hydra adds it under dp (where nothing reads it) and
    rejects the ``+`` under veomni, whose config has the key; the export writes the + exactly under dp."""
    key = "actor_rollout_ref.actor.veomni.attn_implementation"
    result = import_command(f"python3 -m verl.trainer.main_ppo model_engine={engine} +{key}=sdpa")
    assert any(w.startswith(f"verl rejects +{key}") for w in result.warnings) == rejected
    assert result.spec.verl_passthrough == {key: "sdpa"}
    assert (f"+{key}=sdpa" in export_command(result.spec).text) == (engine == "dp")
