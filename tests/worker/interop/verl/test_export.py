"""verl interop: export with Hydra's + rule, checked against verl 0.9.1's generated config."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.worker.interop.verl.sentences import CRITIC_ATTN
from worker.interop.verl import (
    ATTNBOARD_KEYS_WARNING,
    CRITIC_ATTN_WARNING,
    VERL_NAMES,
    engine_rollout_warning,
    export_command,
    export_yaml,
    hydra_value,
    import_command,
    parse_hydra_value,
)
from worker.spec import (
    OPEN_DICT_FIELDS,
    SPEC_KEYS,
    RunSpec,
    flatten,
    parse_spec,
    spec_to_flat,
)
from worker.spec.engines import CONFIG_GROUPS
from worker.spec.verl_defaults import MANDATORY, VERL_DEFAULTS, VERL_VERSION

# --------------------------------------------------------------------------------------------
# Export


def test_default_spec_exports_only_the_mandatory_key() -> None:
    assert export_command(RunSpec()).text == "python3 -m verl.trainer.main_ppo \\\n    actor_rollout_ref.rollout.name=vllm\n"


@pytest.mark.parametrize(
    "value,text",
    [
        ("eager", "eager"),
        ("/models/qwen2-0.5b", "/models/qwen2-0.5b"),
        ("~/models/x", '"~/models/x"'),
        ("1", '"1"'),
        ("1e-5", '"1e-5"'),
        ("true", '"true"'),
        ("NULL", '"NULL"'),
        ("inf", '"inf"'),
        ("", '""'),
        ("a b", '"a b"'),
        ("a,b", '"a,b"'),
        ("[x]", '"[x]"'),
        ("k=v", '"k=v"'),
        ('say "hi"', "'say \"hi\"'"),
        ("it's", '"it\'s"'),
        ("both ' and \"", '"both \' and \\""'),
        ("trailing\\", '"trailing\\\\"'),
        ("${x}", '"\\${x}"'),
        ("注意力", '"注意力"'),
        (None, "null"),
        (True, "true"),
        (3, "3"),
        (1e-06, "1e-06"),
        (0.1, "0.1"),
        (float("inf"), "inf"),
        ([1, "a b", None], '[1,"a b",null]'),
        ({"type": "linear", "factor": 2.0}, "{type:linear,factor:2.0}"),
    ],
)
def test_hydra_value(value: Any, text: str) -> None:
    assert hydra_value(value) == text
    assert parse_hydra_value(text) == value


def test_export_warnings() -> None:
    spec = parse_spec({
        CRITIC_ATTN: "sdpa",
        "attnboard.debug.output_attentions": True,
        "actor_rollout_ref.rollout.name": "vllm",
    })
    exported = export_command(spec)
    assert exported.warnings == [CRITIC_ATTN_WARNING, ATTNBOARD_KEYS_WARNING, engine_rollout_warning("vllm")]
    assert "    +attnboard.debug.output_attentions=true" in exported.text.splitlines()
    assert export_yaml(spec).warnings == exported.warnings


def test_export_override_config_one_leaf_per_line() -> None:
    spec = parse_spec({"actor_rollout_ref.model.override_config": {
        "attn_implementation": "eager", "rope_scaling": {"type": "linear", "factor": 2.0}}})
    lines = export_command(spec, entrypoint="python3 ppo_trainer.py").text.splitlines()
    assert lines == [
        "python3 ppo_trainer.py \\",
        "    +actor_rollout_ref.model.override_config.attn_implementation=eager \\",
        "    +actor_rollout_ref.model.override_config.rope_scaling.type=linear \\",
        "    +actor_rollout_ref.model.override_config.rope_scaling.factor=2.0 \\",
        "    actor_rollout_ref.rollout.name=vllm",
    ]


def test_export_yaml_is_a_config_verl_composes() -> None:
    document = yaml.safe_load(export_yaml(RunSpec(), full=False).text)
    assert document == {
        "hydra": {"searchpath": ["pkg://verl.trainer.config"]},
        "defaults": ["ppo_trainer", "_self_"],
        "actor_rollout_ref": {"rollout": {"name": "vllm"}},
    }
    full = yaml.safe_load(export_yaml(RunSpec()).text)
    written = set(flatten({k: v for k, v in full.items() if k not in ("hydra", "defaults")}))
    assert written == {VERL_NAMES.get(k, k) for k in SPEC_KEYS if k not in OPEN_DICT_FIELDS and k not in CONFIG_GROUPS}
    assert full["defaults"] == ["ppo_trainer", "_self_"]  # model_engine=dp is ppo_trainer's own choice


@pytest.mark.parametrize(
    "text,expected",
    [
        ("actor_rollout_ref.actor.strategy=fsdp_turbo "
         "actor_rollout_ref.actor.fsdp_config.turbo_config.distributed.ulysses_parallel_size=2",
         "    actor_rollout_ref.actor.fsdp_config.turbo_config.distributed.ulysses_parallel_size=2"),
        ("critic.strategy=fsdp_turbo critic.fsdp.turbo_config.distributed.ulysses_parallel_size=4",
         "    critic.fsdp.turbo_config.distributed.ulysses_parallel_size=4"),
    ],
)
def test_turbo_cp_size_uses_verls_name(text: str, expected: str) -> None:
    spec = import_command(text).spec
    assert max(spec.actor_rollout_ref.actor.fsdp_config.turbo_cp_size, spec.critic.turbo_cp_size) > 1
    assert expected in export_command(spec).text.splitlines() or expected + " \\" in export_command(spec).text.splitlines()


# --------------------------------------------------------------------------------------------
# Against verl 0.9.1's own generated default config


def _verl_generated_yaml() -> dict[str, Any] | None:
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        path = Path(location) / "trainer" / "config" / "_generated_ppo_trainer.yaml"
        if path.is_file():
            return yaml.safe_load(path.read_text())
    return None


VERL_YAML = _verl_generated_yaml()
needs_verl = pytest.mark.skipif(VERL_YAML is None, reason="verl is not installed (./scripts/setup.sh --test installs it)")


def _everything_spec() -> RunSpec:
    """A spec with every key away from its default, override_config nested, attnboard keys set."""
    return parse_spec({
        "actor_rollout_ref.model.override_config": {"attn_implementation": "sdpa", "num_hidden_layers": 2,
                                                    "rope_scaling": {"type": "linear", "factor": 2.0}},
        "critic.model.override_config": {"attn_implementation": "eager", "pad_token_id": 0},
        "attnboard.fallback_policy": "fallback",
        "attnboard.seed": 7,
        "attnboard.debug.output_attentions": True,
    })


@needs_verl
def test_plus_rule_against_verls_generated_config() -> None:
    verl_flat = flatten(VERL_YAML)
    exported = export_command(_everything_spec(), full=True)
    tokens = shlex.split(exported.text.replace("\\\n", " "))
    assert tokens[:3] == ["python3", "-m", "verl.trainer.main_ppo"]
    overrides = tokens[3:]
    assert len(overrides) == len(SPEC_KEYS) - len(OPEN_DICT_FIELDS) + 6
    for token in overrides:
        key = token.lstrip("+").split("=", 1)[0]
        assert token.startswith("+") == (key not in verl_flat and key not in CONFIG_GROUPS), token
        if key.startswith(OPEN_DICT_FIELDS):
            parent = next(f for f in OPEN_DICT_FIELDS if key.startswith(f + "."))
            assert verl_flat[parent] == {}  # declared, with no sub-keys: Hydra needs the +
    plussed = sorted(t.split("=", 1)[0] for t in overrides if t.startswith("+"))
    assert plussed == [
        "+actor_rollout_ref.model.override_config.attn_implementation",
        "+actor_rollout_ref.model.override_config.num_hidden_layers",
        "+actor_rollout_ref.model.override_config.rope_scaling.factor",
        "+actor_rollout_ref.model.override_config.rope_scaling.type",
        "+attnboard.debug.output_attentions",
        "+attnboard.fallback_policy",
        "+attnboard.max_restarts",
        "+attnboard.rank_cpus",
        "+attnboard.seed",
        "+critic.model.override_config.attn_implementation",
        "+critic.model.override_config.pad_token_id",
    ]
    # FSDP-Turbo's CP size goes out under verl's own name, without +.
    for verl_key in VERL_NAMES.values():
        assert f"{verl_key}=1" in overrides


@needs_verl
def test_generated_keys_module_matches_the_wheel() -> None:
    verl_flat = flatten(VERL_YAML)
    assert set(VERL_DEFAULTS) == set(verl_flat)
    for key, value in verl_flat.items():
        if not (isinstance(value, str) and "${" in value):
            assert VERL_DEFAULTS[key] == value, key
    assert importlib.metadata.version("verl") == VERL_VERSION


def test_runspec_defaults_are_verls() -> None:
    ours = spec_to_flat(RunSpec())
    verl_only = [k for k in SPEC_KEYS if VERL_NAMES.get(k, k) not in VERL_DEFAULTS and k not in CONFIG_GROUPS]
    assert ours["model_engine"] == "dp"  # ppo_trainer.yaml's defaults list: - model_engine: dp
    assert verl_only == ["attnboard.fallback_policy", "attnboard.seed", "attnboard.max_restarts",
                         "attnboard.rank_cpus", "attnboard.debug.output_attentions"]
    shared = {k: VERL_NAMES.get(k, k) for k in SPEC_KEYS if k not in verl_only and k not in CONFIG_GROUPS}
    differing = {k: (ours[k], VERL_DEFAULTS[v]) for k, v in shared.items() if ours[k] != VERL_DEFAULTS[v]}
    # rollout.name is mandatory in verl (???); attnboard defaults to vllm, verl's usual engine.
    assert differing == {"actor_rollout_ref.rollout.name": ("vllm", MANDATORY)}


def test_verls_interpolated_checkpoint_folder_is_kept_as_its_default_and_exported_for_verl_to_resolve() -> None:
    """trainer.default_local_dir defaults to checkpoints/${trainer.project_name}/${trainer.experiment_name}: the
    import keeps that exact text (resolved when the engine uses it, against the final spec), the export writes it
    unescaped; an interpolation reading it, or any other folder, resolves at import as before."""
    default = "checkpoints/${trainer.project_name}/${trainer.experiment_name}"
    given = import_command(f"trainer.default_local_dir='{default}' trainer.project_name=p")
    assert given.spec.trainer.default_local_dir == default and given.spec.trainer.project_name == "p"
    assert f"'trainer.default_local_dir={default}'" in export_command(RunSpec(), full=True).text
    assert f"  default_local_dir: {default}\n" in export_yaml(RunSpec()).text
    other = import_command("trainer.default_local_dir='ckpt/${trainer.experiment_name}' "
                           "trainer.resume_from_path='${trainer.default_local_dir}/global_step_2' "
                           "trainer.resume_mode=resume_path")
    assert other.spec.trainer.default_local_dir == "ckpt/gsm8k"
    assert other.spec.trainer.resume_from_path == "ckpt/gsm8k/global_step_2"
    at_default = import_command("trainer.resume_from_path='${trainer.default_local_dir}/global_step_2' "
                                "trainer.experiment_name=e")
    assert at_default.spec.trainer.resume_from_path == "checkpoints/verl_examples/e/global_step_2"


@pytest.mark.parametrize("key", [k for k in SPEC_KEYS if k not in OPEN_DICT_FIELDS])
def test_one_key_at_its_default_changes_nothing(key: str) -> None:
    """Giving one key of a section must not reset its siblings to another default (critic.optim.lr)."""
    value = spec_to_flat(RunSpec())[key]
    override = f"{VERL_NAMES.get(key, key)}={hydra_value(value)}"
    # A lone undotted word (model_engine=dp) is a shell variable assignment: give it to verl's command.
    text = override if "." in key else f"python3 -m verl.trainer.main_ppo {override}"
    assert import_command(text).spec == RunSpec()


