"""What an import or export gives back, its errors and limits, and the sentences it says (asserted in tests)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from worker.spec import (
    RunSpec,
)

MAX_INTERPOLATION_DEPTH = 10

DEFAULT_ENTRYPOINT = "python3 -m verl.trainer.main_ppo"
VERL_MODULE = "verl.trainer.main_ppo"
VERL_SCRIPTS = ("main_ppo.py", "ppo_trainer.py")

# Warnings: short exact sentences, asserted in tests.
CRITIC_ATTN_WARNING = (
    "verl <= 0.9.1 ignores critic.model.override_config.attn_implementation (verl issue #5210): "
    "load_valuehead_model passes flash_attention_2 explicitly; attnboard honours it"
)
ATTNBOARD_KEYS_WARNING = "attnboard-only keys are passed with + and ignored by verl"
HF_ROLLOUT_WARNING = (
    "verl 0.9.1 has no hf rollout engine (only vllm, sglang, trtllm) and stops with "
    "'Rollout hf with mode async not found'; attnboard generates with the actor's HF model"
)


def engine_rollout_warning(name: str) -> str:
    return (
        f"verl's {name} rollout engine picks its own attention kernel; attnboard generates with the "
        "actor's HF model and its attn_implementation"
    )


# --------------------------------------------------------------------------------------------
# Results and errors

_NON_SPACE = re.compile(r"\S*")


def _word_end(text: str, at: int) -> int:
    match = _NON_SPACE.match(text, at)
    return match.end() if match else at + 1



@dataclass(frozen=True)
class ImportResult:
    spec: RunSpec
    warnings: list[str]
    overrides: dict[str, Any]
    """The dotted keys given that attnboard models (aliases rewritten), with their parsed values."""
    asks: dict[str, str] = field(default_factory=dict)
    """Keys whose value only the environment the script runs in knows (``trainer.nnodes=$SLURM_JOB_NUM_NODES``)
    and that must be a number or a flag: the spec keeps its default, the key is asked for (its text as
    written); ``import_command(text, environment={"SLURM_JOB_NUM_NODES": "2"})`` gives the variable."""


@dataclass(frozen=True)
class ExportResult:
    text: str
    warnings: list[str]


class VerlImportError(ValueError):
    """A command line or YAML that cannot be imported: the message, the offending token and its
    character position in the original text; ``issues`` holds the spec issues when the values were
    the problem."""

    def __init__(self, message: str, token: str, position: int, issues: list[Any] | None = None):
        self.message = message
        self.token = token
        self.position = position
        self.issues = issues or []
        shown = token if len(token) <= 80 else token[:77] + "..."
        super().__init__(f"{message} (at character {position}: {shown!r})")


class ImportBudgetError(VerlImportError):
    """Reading the script costs more than its step budget (``budget``, the steps allowed): a loop too long or a
    pattern too costly on a long value. The caller gives the budget (``import_command(max_steps=...)``)."""

    def __init__(self, message: str, token: str, position: int, budget: int):
        self.budget = budget
        super().__init__(message, token, position)



MEGATRON_MESSAGE = (
    "{what} without model_engine={engine}: verl {version} chooses its {engine} engine with the model_engine config "
    "group (the strategy alone keeps dp's FSDP sections); add model_engine={engine}"
)
RETIRED_CONFIG_WARNING = (
    "--config-name={name} is retired in verl {version} (the file says \"[Deprecated] ... please use ppo_trainer.yaml "
    "instead\"): read as ppo_trainer with model_engine={engine}"
)
ENTRY_MESSAGE = (
    "entry point {entry} is not supported: attnboard imports verl.trainer.main_ppo commands (verl's PPO trainer "
    "with its ppo_trainer config); recipes such as DAPO and one-step-off-policy run trainers of their own"
)
NO_COMMAND_MESSAGE = (
    "no verl command found: expected `python3 -m verl.trainer.main_ppo key=value ...` (or torchrun ... -m "
    "verl.trainer.main_ppo, python3 path/main_ppo.py), or a list of key=value overrides"
)
ARGUMENTS_WARNING = "ignored: {word} (the arguments of the script it came from)"
PPO_CONFIG_NAMES = ("ppo_trainer", "ppo_trainer.yaml")

_VERL_SEARCHPATH = {"searchpath": ["pkg://verl.trainer.config"]}

