"""verl interop: command lines and launch scripts in (the seed's examples, syntax, warnings, errors)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.worker.interop.verl.sentences import ACTOR_ATTN, CRITIC_ATTN, NEEDS_PLUS, PASSED, PLACEHOLDER
from worker.interop.shell import read_script
from worker.interop.verl import (
    CRITIC_ATTN_WARNING,
    HF_ROLLOUT_WARNING,
    MAX_INPUT_BYTES,
    VerlImportError,
    engine_rollout_warning,
    export_command,
    import_command,
    import_yaml,
)
from worker.spec import (
    RunSpec,
    parse_spec,
)

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
          "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size",
          "actor_rollout_ref.ref.ulysses_sequence_parallel_size reads the deprecated "
          "actor_rollout_ref.actor.ulysses_sequence_parallel_size in verl: kept as 2",
          PASSED.format("actor_rollout_ref.ref.ulysses_sequence_parallel_size")]),
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
        # a $ that is text, not the environment's (a variable's value is asked for: test_a_value_only_slurm_knows...)
        ("python3 -m verl.trainer.main_ppo trainer.nnodes='$NNODES'", "trainer.nnodes='$NNODES'",
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


