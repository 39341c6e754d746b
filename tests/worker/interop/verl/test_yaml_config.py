"""verl interop: YAML configs in, bounded (depth, aliases), keys read as overrides of verl's defaults."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.worker.interop.verl.sentences import PASSED
from worker.interop.verl import (
    VerlImportError,
    import_yaml,
)

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


@pytest.mark.parametrize("text,key,near", [
    ("trainer:\n  nnodes: 1\n  nnodez: 2\n", "trainer.nnodez", "trainer.nnodes"),
    ("trainer:\n  total_trainig_steps: 4\n", "trainer.total_trainig_steps", "trainer.total_training_steps"),
])
def test_yaml_typo_of_a_key_in_its_section_is_refused_with_did_you_mean(text: str, key: str, near: str) -> None:
    """Issue 17 item 5: a key verl's section lacks, one edit from a key it has, is a typo: refused (verl's Hydra
    refuses it without +), not passed through to train 960 steps."""
    with pytest.raises(VerlImportError, match=re.escape(f"unknown key {key}: ") + ".*" + re.escape(f"did you mean {near}?")):
        import_yaml(text)


@pytest.mark.parametrize(
    "text,expected,warnings",
    [
        ("", {}, []),
        ("trainer:\n  logger: [console]\n  project_name: 2024\n", {"trainer.project_name": "2024"},
         [PASSED.format("trainer.logger")]),
        ("trainer:\n  nnodes: 1\n  my_own_flag: 2\n", {"trainer.nnodes": 1},
         ["trainer.my_own_flag is not in verl 0.9.1's config: a config file adds it (passed through as "
          "+trainer.my_own_flag)", PASSED.format("+trainer.my_own_flag")]),
        ("actor_rollout_ref:\n  actor:\n    ulysses_sequence_parallel_size: 2\n",
         {"actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size": 2},
         ["actor_rollout_ref.actor.ulysses_sequence_parallel_size is deprecated in verl; read as "
          "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size",
          "actor_rollout_ref.ref.ulysses_sequence_parallel_size reads the deprecated "
          "actor_rollout_ref.actor.ulysses_sequence_parallel_size in verl: kept as 2",
          PASSED.format("actor_rollout_ref.ref.ulysses_sequence_parallel_size")]),
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


