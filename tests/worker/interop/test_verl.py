"""verl interop: import of command lines and YAML, export with Hydra's + rule, round trips."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import math
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from worker.core.implementations import BUILTIN_NAMES
from worker.interop.shell import read_script
from worker.interop.verl import (
    ATTNBOARD_KEYS_WARNING,
    CRITIC_ATTN_WARNING,
    HF_ROLLOUT_WARNING,
    MAX_INPUT_BYTES,
    VERL_NAMES,
    VerlImportError,
    engine_rollout_warning,
    export_command,
    export_yaml,
    hydra_value,
    import_command,
    import_yaml,
    parse_hydra_value,
)
from worker.spec import (
    ALIASES,
    OPEN_DICT_FIELDS,
    PASSTHROUGH_NOTE,
    SPEC_KEYS,
    RunSpec,
    classify_key,
    flatten,
    parse_spec,
    spec_to_flat,
)
from worker.spec.engines import CONFIG_GROUPS
from worker.spec.verl_defaults import MANDATORY, VERL_DEFAULTS, VERL_VERSION

ACTOR_ATTN = "actor_rollout_ref.model.override_config.attn_implementation"
CRITIC_ATTN = "critic.model.override_config.attn_implementation"
NEEDS_PLUS = "verl needs +{}: the key is not in its default config; the export adds the +"
PASSED = "passed through to verl, not run by attnboard: {}"
PLACEHOLDER = "skipped placeholder [other parameters...]"

# --------------------------------------------------------------------------------------------
# The seed's examples (000_504c5f1c4d637762.txt, "=" restored)

SEED_EAGER = """python3 ppo_trainer.py \\
    actor_rollout_ref.model.override_config.attn_implementation=eager \\
    [other parameters...]"""
SEED_SDPA = """python3 ppo_trainer.py \\
    actor_rollout_ref.model.override_config.attn_implementation=sdpa \\
    [other parameters...]"""
SEED_CRITIC = """python3 ppo_trainer.py \\
    actor_rollout_ref.model.override_config.attn_implementation=eager \\
    critic.model.override_config.attn_implementation=eager \\
    [other parameters...]"""
SEED_TROUBLESHOOT = "python3 ppo_trainer.py actor_rollout_ref.model.override_config.attn_implementation=eager"
SEED_YAML = """actor_rollout_ref:
  model:
    override_config:
      attn_implementation: eager
      # other overrides...
critic:  # if using a critic model
  model:
    override_config:
      attn_implementation: eager
      # other overrides...
"""


@pytest.mark.parametrize(
    "text,actor,critic,warnings",
    [
        (SEED_EAGER, {"attn_implementation": "eager"}, {}, [PLACEHOLDER, NEEDS_PLUS.format(ACTOR_ATTN)]),
        (SEED_SDPA, {"attn_implementation": "sdpa"}, {}, [PLACEHOLDER, NEEDS_PLUS.format(ACTOR_ATTN)]),
        (SEED_CRITIC, {"attn_implementation": "eager"}, {"attn_implementation": "eager"},
         [PLACEHOLDER, NEEDS_PLUS.format(ACTOR_ATTN), NEEDS_PLUS.format(CRITIC_ATTN), CRITIC_ATTN_WARNING]),
        (SEED_TROUBLESHOOT, {"attn_implementation": "eager"}, {}, [NEEDS_PLUS.format(ACTOR_ATTN)]),
    ],
    ids=["eager", "sdpa", "critic", "troubleshooting"],
)
def test_seed_commands(text: str, actor: dict, critic: dict, warnings: list[str]) -> None:
    result = import_command(text)
    assert result.spec.actor_rollout_ref.model.override_config == actor
    assert result.spec.critic.model.override_config == critic
    assert result.warnings == warnings
    # Everything else keeps verl's defaults.
    assert result.spec.model_copy(update={"actor_rollout_ref": RunSpec().actor_rollout_ref,
                                          "critic": RunSpec().critic}) == RunSpec()


def test_seed_yaml() -> None:
    result = import_yaml(SEED_YAML)
    assert result.spec.actor_rollout_ref.model.override_config == {"attn_implementation": "eager"}
    assert result.spec.critic.model.override_config == {"attn_implementation": "eager"}
    assert result.warnings == [CRITIC_ATTN_WARNING]
    assert result.overrides == {ACTOR_ATTN: "eager", CRITIC_ATTN: "eager"}


def test_seed_export_adds_the_plus() -> None:
    spec = import_command(SEED_CRITIC).spec
    exported = export_command(spec)
    assert exported.text == (
        "python3 -m verl.trainer.main_ppo \\\n"
        "    +actor_rollout_ref.model.override_config.attn_implementation=eager \\\n"
        "    actor_rollout_ref.rollout.name=vllm \\\n"
        "    +critic.model.override_config.attn_implementation=eager\n"
    )
    assert exported.warnings == [CRITIC_ATTN_WARNING, engine_rollout_warning("vllm")]


# --------------------------------------------------------------------------------------------
# Command-line syntax


@pytest.mark.parametrize(
    "text,expected",
    [
        # + (add), ++ (add or replace), bare
        ("+actor_rollout_ref.model.override_config.attn_implementation=sdpa", {ACTOR_ATTN: "sdpa"}),
        ("++actor_rollout_ref.model.override_config.attn_implementation=sdpa", {ACTOR_ATTN: "sdpa"}),
        ("++data.train_batch_size=64", {"data.train_batch_size": 64}),
        # entry points and environment prefixes
        ("python3 -m verl.trainer.main_ppo data.train_batch_size=64", {"data.train_batch_size": 64}),
        ("python -m verl.trainer.main_ppo data.train_batch_size=64", {"data.train_batch_size": 64}),
        ("PYTHONUNBUFFERED=1 python3 -m verl.trainer.main_ppo trainer.nnodes=2", {"trainer.nnodes": 2}),
        ("HYDRA_FULL_ERROR=1 VLLM_USE_V1=1 /usr/bin/python3.11 -u -m verl.trainer.main_ppo trainer.nnodes=2",
         {"trainer.nnodes": 2}),
        # continuations, comments, CRLF
        ("python3 -m verl.trainer.main_ppo \\\r\n  trainer.nnodes=2 \\\r\n  trainer.n_gpus_per_node=4",
         {"trainer.nnodes": 2, "trainer.n_gpus_per_node": 4}),
        ("# eager on the actor\npython3 -m verl.trainer.main_ppo \\\n  trainer.nnodes=2  # two nodes\n",
         {"trainer.nnodes": 2}),
        # shell quoting
        ("'trainer.experiment_name=my run'", {"trainer.experiment_name": "my run"}),
        ('"trainer.experiment_name=v w"', {"trainer.experiment_name": "v w"}),
        ("trainer.experiment_name=my\\ run", {"trainer.experiment_name": "my run"}),
        ("trainer.experiment_name=\"'it\\'s'\"", {"trainer.experiment_name": "it's"}),
        ("'data.train_files=[/data/train.parquet]'", {"data.train_files": ["/data/train.parquet"]}),
        # Hydra typing: strings that look like other types stay strings only when quoted
        ("trainer.project_name=2024", {"trainer.project_name": "2024"}),
        ("trainer.project_name='true'", {"trainer.project_name": "true"}),
        ("actor_rollout_ref.model.use_remove_padding=False", {"actor_rollout_ref.model.use_remove_padding": False}),
        ("actor_rollout_ref.model.use_remove_padding=TRUE", {"actor_rollout_ref.model.use_remove_padding": True}),
        ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=null",
         {"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": None}),
        ("actor_rollout_ref.actor.optim.lr=3e-6", {"actor_rollout_ref.actor.optim.lr": 3e-6}),
        ("data.train_batch_size=1_024", {"data.train_batch_size": 1024}),
        ("'+actor_rollout_ref.model.override_config.rope_scaling={type:linear,factor:2.0}'",
         {"actor_rollout_ref.model.override_config.rope_scaling": {"type": "linear", "factor": 2.0}}),
        # unquoted, bash's brace expansion makes two words of it (verl would then see the key twice)
        ("+actor_rollout_ref.model.override_config.rope_scaling={type:linear,factor:2.0}",
         {"actor_rollout_ref.model.override_config.rope_scaling": "factor:2.0"}),
        ("+actor_rollout_ref.model.override_config.rope_scaling.type=linear",
         {"actor_rollout_ref.model.override_config.rope_scaling.type": "linear"}),
        ("'+critic.model.override_config.eos_token_id=[2, 32000]'",
         {"critic.model.override_config.eos_token_id": [2, 32000]}),
        ("+critic.model.override_config.name=\"'a,b'\"", {"critic.model.override_config.name": "a,b"}),
        # interpolations are resolved against the imported config
        ("actor_rollout_ref.model.path=/m/qwen 'critic.model.path=${actor_rollout_ref.model.path}'",
         {"actor_rollout_ref.model.path": "/m/qwen", "critic.model.path": "/m/qwen"}),
        ("'trainer.experiment_name=${oc.select:trainer.project_name,x}-ppo'",
         {"trainer.experiment_name": "verl_examples-ppo"}),
        ("'trainer.experiment_name=\\${not_resolved}'", {"trainer.experiment_name": "${not_resolved}"}),
        # later wins; ~ resets
        ("trainer.nnodes=2 trainer.nnodes=3", {"trainer.nnodes": 3}),
        ("trainer.nnodes=2 ~trainer.nnodes", {}),
        ("+actor_rollout_ref.model.override_config.attn_implementation=eager "
         "~actor_rollout_ref.model.override_config", {}),
        # the deprecated alias
        ("actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
         {"actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size": 2}),
        # a whole section as a Hydra dict
        ("'critic.optim={lr:2e-5}'", {"critic.optim.lr": 2e-5}),
        # keys verl has and attnboard does not model are passed through (see test_passthrough_keys)
        ("trainer.logger=[console,wandb] actor_rollout_ref.rollout.gpu_memory_utilization=0.6 "
         "data.val_files=/d/test.parquet", {}),
    ],
)
def test_command_syntax(text: str, expected: dict[str, Any]) -> None:
    result = import_command(text)
    assert result.overrides == expected
    assert result.spec.model_copy(update={"verl_passthrough": {}}) == parse_spec(expected)


@pytest.mark.parametrize(
    "text,warnings",
    [
        ("trainer.logger=[console,wandb]", [PASSED.format("trainer.logger")]),
        ("actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
         [PASSED.format("actor_rollout_ref.rollout.gpu_memory_utilization")]),
        ("data.val_files=/d/test.parquet", [PASSED.format("data.val_files")]),
        ("+actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space=4",
         [PASSED.format("+actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space")]),
        ("actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space=4",
         [NEEDS_PLUS.format("actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space"),
          PASSED.format("+actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space")]),
        ("hydra.run.dir=/tmp/x", [PASSED.format("hydra.run.dir")]),
        ("PYTHONUNBUFFERED=1 python3 -m verl.trainer.main_ppo trainer.nnodes=1",
         ["ignored: environment variable PYTHONUNBUFFERED"]),
        ("python3 -m verl.trainer.main_ppo --config-name=ppo_trainer trainer.nnodes=1",
         ["ignored: Hydra option --config-name; keys are read against verl's ppo_trainer defaults"]),
        ("+data.train_batch_size=8",
         ["verl rejects +data.train_batch_size: the key exists in its default config; "
          "write data.train_batch_size= or ++data.train_batch_size="]),
        ("attnboard.fallback_policy=fallback", [NEEDS_PLUS.format("attnboard.fallback_policy")]),
        ("+attnboard.fallback_policy=fallback", []),
        ("actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
         ["actor_rollout_ref.actor.ulysses_sequence_parallel_size is deprecated in verl; read as "
          "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size"]),
        ("trainer.nnodes=2 trainer.nnodes=3", ["trainer.nnodes is given twice; the last value wins"]),
        ("trainer.nnodes=2 ~trainer.nnodes", ["~trainer.nnodes: reset to attnboard's default"]),
        ("~trainer.logger", ["~trainer.logger: verl deletes the key from its config; attnboard keeps no record of it"]),
        ("trainer.logger=[a] ~trainer.logger", []),
        ("actor_rollout_ref.rollout.name=vllm", [engine_rollout_warning("vllm")]),
        ("actor_rollout_ref.rollout.name=hf", [HF_ROLLOUT_WARNING]),
        ("python3 -m verl.trainer.main_ppo ... trainer.nnodes=1", ["skipped placeholder ..."]),
        ("+critic.model.override_config.attn_implementation=sdpa", [CRITIC_ATTN_WARNING]),
    ],
)
def test_import_warnings(text: str, warnings: list[str]) -> None:
    assert import_command(text).warnings == warnings


VERL_EXAMPLE_SCRIPT = """set -x
export VLLM_ATTENTION_BACKEND=XFORMERS

PYTHONUNBUFFERED=1 python3 -m verl.trainer.main_ppo \\
    algorithm.adv_estimator=grpo \\
    actor_rollout_ref.rollout.n=5 \\
    trainer.logger='["console","wandb"]' \\
    trainer.total_epochs=15 "$@"
    trainer.nnodes=2
echo done
"""


def test_pasted_script() -> None:
    """verl's example scripts: other commands are ignored; a line that lost its backslash is a command of
    its own for bash, so verl never gets it: said, not imported."""
    result = import_command(VERL_EXAMPLE_SCRIPT)
    assert result.overrides == {"algorithm.adv_estimator": "grpo", "actor_rollout_ref.rollout.n": 5,
                                "trainer.total_epochs": 15}
    assert result.spec.verl_passthrough == {"trainer.logger": ["console", "wandb"]}
    assert result.warnings == [
        "ignored: environment variable PYTHONUNBUFFERED",
        "line 9: trainer.nnodes=2 is a command of its own for bash (a backslash lost at the end of the line "
        "before?): verl does not get it, nor does the import",
        "ignored shell commands (not the verl command): set, echo",
        "ignored: $@ (the arguments of the script it came from)",
        PASSED.format("trainer.logger"),
    ]


@pytest.mark.parametrize(
    "text,expected",
    [
        ("trainer.nnodes=2\ntrainer.n_gpus_per_node=4", {"trainer.nnodes": 2, "trainer.n_gpus_per_node": 4}),
        ("cd /work; python3 -m verl.trainer.main_ppo trainer.nnodes=2", {"trainer.nnodes": 2}),
        ("python3 -m verl.trainer.main_ppo 'trainer.experiment_name=a;b'", {"trainer.experiment_name": "a;b"}),
    ],
)
def test_command_separators(text: str, expected: dict[str, Any]) -> None:
    assert import_command(text).overrides == expected


def test_engine_rollout_warning_text() -> None:
    assert engine_rollout_warning("sglang") == (
        "verl's sglang rollout engine picks its own attention kernel; attnboard generates with the "
        "actor's HF model and its attn_implementation"
    )


# --------------------------------------------------------------------------------------------
# Errors name the token and its position


@pytest.mark.parametrize(
    "text,token,message",
    [
        ("python3 -m verl.trainer.main_ppo trainer.nnodes=1 'trainer.n_gpus_per_node=8",
         "'trainer.n_gpus_per_node=8", "unbalanced single quote: no closing '"),
        ('trainer.nnodes=1 "trainer.project_name=x', '"trainer.project_name=x', 'unbalanced double quote'),
        ("python3 -m verl.trainer.main_ppo trainer.nnodes", "trainer.nnodes",
         "expected key=value, got 'trainer.nnodes': '=' is missing"),
        ("trainer.nnodes=1 data.train_batch_size=abc", "data.train_batch_size=abc",
         "data.train_batch_size: 'abc' is not valid"),
        ("trainer.nnodes=1 actor_rollout_ref.rollout.n=0", "actor_rollout_ref.rollout.n=0",
         "actor_rollout_ref.rollout.n: 0 is out of range"),
        ("algorithm.adv_estimator=ppo", "algorithm.adv_estimator=ppo",
         "algorithm.adv_estimator: 'ppo' is not valid; valid: gae, grpo"),
        ("x.y=1 +actor_rollout_ref.model.override_config.attn_implementation=flash2", "x.y=1",
         "unknown key x.y: neither attnboard nor verl 0.9.1 has it"),
        ("trainer.nnodes=2 +actor_rollout_ref.model.override_config.attn_implementation=flash2",
         "+actor_rollout_ref.model.override_config.attn_implementation=flash2",
         "actor_rollout_ref.model.override_config.attn_implementation: unknown attn_implementation 'flash2'; "
         "valid: eager, sdpa, flash_attention_2"),
        ("critic.optim.lrr=1e-5", "critic.optim.lrr=1e-5",
         "unknown key critic.optim.lrr: neither attnboard nor verl 0.9.1 has it; did you mean critic.optim.lr?"),

        ("trainer.nnodes=1,2", "trainer.nnodes=1,2", "a comma outside brackets makes a Hydra sweep"),
        ("'trainer.nnodes=choice(1,2)'", "'trainer.nnodes=choice(1,2)'", "Hydra functions such as choice"),
        ("'actor_rollout_ref.actor.optim.lr=[1e-6'", "'actor_rollout_ref.actor.optim.lr=[1e-6'",
         "unbalanced [: expected , or ]"),
        ("trainer.project_name='abc", "'abc", "unbalanced single quote"),
        ("trainer.project_name=it\\'s", "trainer.project_name=it\\'s", "a quote inside an unquoted value"),
        ("+trainer@pkg.nnodes=1", "+trainer@pkg.nnodes=1", "Hydra package overrides"),
        ("python3 -m verl.trainer.main_ppo --foo", "--foo", "unknown option --foo"),
        ("trainer.nnodes=1 'critic.model.path=${nope.key}'", "'critic.model.path=${nope.key}'",
         "critic.model.path: ${nope.key} refers to nope.key"),
        ("'critic.model.path=${oc.env:HOME}'", "'critic.model.path=${oc.env:HOME}'", "resolver oc.env is not supported"),
        ("critic.optim=1", "critic.optim=1", "critic.optim is a section, not a value"),
        ("python3 train.py trainer.nnodes=1", "train.py", "entry point train.py is not supported"),
        ("python3 -m verl.trainer.main_ppo --config-name=my_ppo trainer.nnodes=1", "--config-name=my_ppo",
         "--config-name=my_ppo: a config of your own is a file the import does not read"),
        ("python3 -m verl.trainer.main_ppo --config-path=config --config-name='ppo_megatron_trainer.yaml' x.y=1",
         "x.y=1", "unknown key x.y"),
        ("python3 -m verl.trainer.main_ppo actor_rollout_ref.actor.strategy=megatron",
         "actor_rollout_ref.actor.strategy=megatron", "actor_rollout_ref.actor.strategy=megatron without "
                                                      "model_engine=megatron: verl 0.9.1 chooses its megatron engine"),
        ("python3 -m verl.trainer.main_ppo actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
         "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
         "actor_rollout_ref.actor.megatron.tensor_model_parallel_size belongs to the config of model_engine=megatron, "
         "not dp"),
        ("python3 -m verl.trainer.main_ppo model_engine=veomni actor_rollout_ref.actor.fsdp_config.wrap_policy.min_num_params=1",
         "actor_rollout_ref.actor.fsdp_config.wrap_policy.min_num_params=1",
         "belongs to the config of model_engine=dp or automodel, not veomni"),
        ("python3 -m verl.trainer.main_ppo engine=automodel trainer.nnodes=1", "engine=automodel",
         "unknown key engine: engine=<name> is a config group of verl's SFT trainer (verl.trainer.sft_trainer), not of "
         "verl.trainer.main_ppo, whose Hydra refuses it; the PPO trainer chooses its engine with model_engine=<name>"),
        ("python3 -m verl.trainer.main_ppo trainer.use_legacy_worker_impl=auto", "trainer.use_legacy_worker_impl=auto",
         "unknown key trainer.use_legacy_worker_impl: trainer.use_legacy_worker_impl is retired in verl 0.9.1: use "
         "model_engine"),
        ("python3 -m recipe.dapo.main_dapo data.train_batch_size=8", "recipe.dapo.main_dapo",
         "entry point recipe.dapo.main_dapo is not supported"),
        ("python3 -m verl.trainer.main_ppo a.b=1\npython3 -m verl.trainer.main_ppo a.b=2",
         "python3 -m verl.trainer.main_ppo a.b=2", "runs verl.trainer.main_ppo 2 times, on lines 1, 2"),
        ("echo hi\nmkdir -p x", "echo", "no verl command found"),
        ('python3 -m verl.trainer.main_ppo "trainer.$K=1"', '"trainer.$K=1"', "is not known here"),
        ("python3 -m verl.trainer.main_ppo trainer.nnodes=$NNODES", "trainer.nnodes=$NNODES",
         "a value from the environment or the script's arguments is not known here"),
        ("python3 -m verl.trainer.main_ppo trainer.nnodes=1 \\\n  $(", "$(", "shell syntax error near '$('"),
    ],
)
def test_import_errors(text: str, token: str, message: str) -> None:
    with pytest.raises(VerlImportError) as caught:
        import_command(text)
    err = caught.value
    assert err.token == token
    assert err.position == text.index(token)
    assert message in err.message
    assert f"at character {err.position}" in str(err)


def test_spec_errors_carry_the_issues() -> None:
    with pytest.raises(VerlImportError) as caught:
        import_command("data.train_batch_size=-1 trainer.nnodes=zero")
    fields = [issue.field for issue in caught.value.issues]
    assert fields == ["data.train_batch_size", "trainer.nnodes"]
    assert caught.value.token == "data.train_batch_size=-1"


def test_input_size_limit() -> None:
    text = "trainer.project_name=" + "x" * MAX_INPUT_BYTES
    with pytest.raises(VerlImportError, match=f"the limit is {MAX_INPUT_BYTES} bytes"):
        import_command(text)
    with pytest.raises(VerlImportError, match="the limit is"):
        import_yaml("a: " + "x" * MAX_INPUT_BYTES)


def test_shell_words_positions() -> None:
    text = "A=1 python3 \\\n  'k=a b' k2=\"c\"d"
    command = read_script(text).commands[0]
    assert [(w.text, w.position) for w in command.words] == [("python3", 4), ("k=a b", 16), ("k2=cd", 24)]
    assert [(name, w.text, w.position) for name, w in command.assignments] == [("A", "1", 0)]


# --------------------------------------------------------------------------------------------
# YAML


def _billion_laughs(levels: int) -> str:
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for k in range(1, levels):
        lines.append(f"a{k}: &a{k} [" + ",".join([f"*a{k - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    "text,message,token",
    [
        (_billion_laughs(9), "YAML expands to more than 20000 values (an alias bomb?)", None),
        ("a: &x [*x]\n", "YAML aliases form a cycle", None),
        ("x: " + "[" * 200 + "]" * 200, "YAML nests deeper than 64 levels", None),
        ("actor_rollout_ref:\n  model: [unclosed\n", "invalid YAML", None),
        ("- a\n- b\n", "a verl YAML config must be a mapping", None),
        ("data:\n  train_batch_size: lots\n", "data.train_batch_size: 'lots' is not valid", "train_batch_size: lots"),
        ("1: 2\n", "YAML keys must be strings", "1: 2"),
    ],
)
def test_yaml_errors(text: str, message: str, token: str | None) -> None:
    with pytest.raises(VerlImportError) as caught:
        import_yaml(text)
    assert message in caught.value.message
    if token is not None:
        assert caught.value.token == token
        assert caught.value.position == text.index(token)


def test_yaml_small_aliases_are_fine() -> None:
    text = "lr: &lr 2.0e-6\nactor_rollout_ref:\n  actor:\n    optim:\n      lr: *lr\n"
    result = import_yaml(text)  # a config file may add keys verl's config lacks: passed through with +
    assert result.spec.verl_passthrough == {"+lr": 2e-6} and result.spec.actor_rollout_ref.actor.optim.lr == 2e-6
    result = import_yaml("actor_rollout_ref:\n  actor:\n    optim: &o {lr: 2.0e-6}\ncritic:\n  optim: *o\n")
    assert result.spec.actor_rollout_ref.actor.optim.lr == result.spec.critic.optim.lr == 2e-6


@pytest.mark.parametrize(
    "text,expected,warnings",
    [
        ("", {}, []),
        ("trainer:\n  logger: [console]\n  project_name: 2024\n", {"trainer.project_name": "2024"},
         [PASSED.format("trainer.logger")]),
        ("trainer:\n  nnodes: 1\n  nnodez: 2\n", {"trainer.nnodes": 1},
         ["trainer.nnodez is not in verl 0.9.1's config: a config file adds it (passed through as +trainer.nnodez); "
          "did you mean trainer.nnodes?", PASSED.format("+trainer.nnodez")]),
        ("actor_rollout_ref:\n  actor:\n    ulysses_sequence_parallel_size: 2\n",
         {"actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size": 2},
         ["actor_rollout_ref.actor.ulysses_sequence_parallel_size is deprecated in verl; read as "
          "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size"]),
        ("actor_rollout_ref:\n  model:\n    path: /m/q\ncritic:\n  model:\n    path: ${actor_rollout_ref.model.path}\n",
         {"actor_rollout_ref.model.path": "/m/q", "critic.model.path": "/m/q"}, []),
        ("defaults: [ppo_trainer, _self_]\nattnboard:\n  seed: 7\n", {"attnboard.seed": 7}, []),
        ("defaults: [my_base]\n", {}, ["ignored: the defaults list; keys are read against verl's ppo_trainer defaults"]),
    ],
)
def test_yaml_import(text: str, expected: dict[str, Any], warnings: list[str]) -> None:
    result = import_yaml(text)
    assert result.overrides == expected
    assert result.warnings == warnings


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
                         "attnboard.debug.output_attentions"]
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
