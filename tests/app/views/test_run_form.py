"""The run form's pure parts: one spelling per dtype, plain labels, the essentials and the folds' counts."""

from __future__ import annotations

import pytest

from app.views.run_form import (
    DTYPE_CHOICES,
    ESSENTIAL_KEYS,
    FIELDS,
    FIELDS_BY_KEY,
    changed_counts,
    default_values,
    dtype_options,
    form_to_spec_data,
    grouped_fields,
    same_value,
    spec_to_form_values,
)
from worker.spec import parse_spec
from worker.spec.schema import DTYPE_NAMES

ACTOR_DTYPE = "actor_rollout_ref.actor.fsdp_config.dtype"


@pytest.mark.parametrize("value,expected", [
    ("bf16", [("bf16", "bf16", True), ("fp16", "fp16", False), ("fp32", "fp32", False)]),
    ("bfloat16", [("bfloat16", "bf16", True), ("fp16", "fp16", False), ("fp32", "fp32", False)]),
    ("float32", [("bf16", "bf16", False), ("fp16", "fp16", False), ("float32", "fp32", True)]),
    ("float16", [("bf16", "bf16", False), ("float16", "fp16", True), ("fp32", "fp32", False)]),
    ("", [("bf16", "bf16", False), ("fp16", "fp16", False), ("fp32", "fp32", False)]),
])
def test_one_option_per_dtype_keeping_the_spelling_of_the_value(value, expected):
    assert dtype_options(value) == expected


def test_every_dtype_input_offers_each_dtype_once_and_every_spelling_still_parses():
    dtype_fields = [f for f in FIELDS if f.widget == "dtype"]
    assert len(dtype_fields) == 7
    for f in dtype_fields:
        assert f.options == DTYPE_CHOICES
    for spelling, meant in DTYPE_NAMES.items():  # verl's accepted spellings, as an import writes them
        spec = parse_spec(form_to_spec_data({ACTOR_DTYPE: [spelling]}))
        assert DTYPE_NAMES[spec_to_form_values(spec)[ACTOR_DTYPE]] == meant


@pytest.mark.parametrize("key,label", [
    ("actor_rollout_ref.actor.fsdp_config.dtype", "actor compute dtype"),
    ("actor_rollout_ref.ref.fsdp_config.dtype", "reference compute dtype"),
    ("actor_rollout_ref.ref.fsdp_config.model_dtype", "reference weights dtype"),
    ("actor_rollout_ref.rollout.dtype", "rollout compute dtype"),
    ("critic.fsdp.model_dtype", "critic weights dtype"),
    ("actor_rollout_ref.model.path", "actor / rollout / reference model path"),
    ("algorithm.adv_estimator", "advantage estimator"),
])
def test_labels_name_the_role_a_key_configures(key, label):
    assert FIELDS_BY_KEY[key].label == label


def test_the_essentials_are_not_folded_and_every_other_field_is_in_one_fold():
    folded = [f.key for _, fields in grouped_fields() for f in fields]
    assert ESSENTIAL_KEYS.isdisjoint(folded)
    assert sorted(folded + sorted(ESSENTIAL_KEYS)) == sorted(f.key for f in FIELDS)
    assert all(fields for _, fields in grouped_fields())


@pytest.mark.parametrize("widget_key,a,b,same", [
    (ACTOR_DTYPE, "bf16", "bfloat16", True),
    (ACTOR_DTYPE, "bf16", "fp32", False),
    ("actor_rollout_ref.actor.optim.lr", "1e-6", "0.000001", True),
    ("actor_rollout_ref.actor.optim.lr", "1e-6", "2e-6", False),
    ("actor_rollout_ref.actor.optim.lr", "", "1e-6", False),
    ("trainer.total_training_steps", "", "", True),
    ("actor_rollout_ref.model.use_remove_padding", True, False, False),
    ("actor_rollout_ref.model.use_remove_padding", False, False, True),
    ("critic.model.override_config", "", None, True),
])
def test_same_value(widget_key, a, b, same):
    assert same_value(FIELDS_BY_KEY[widget_key], a, b) is same


def test_changed_counts_per_fold():
    defaults = default_values()
    assert set(changed_counts(defaults, defaults).values()) == {0}
    values = {**defaults, ACTOR_DTYPE: "fp32", "actor_rollout_ref.ref.fsdp_config.dtype": "bf16",
              "actor_rollout_ref.rollout.temperature": "0.5", "trainer.total_training_steps": "7"}
    counts = changed_counts(values, defaults)
    assert counts["precision"] == 1  # bf16 is verl's bfloat16: not a change
    assert counts["rollout"] == 1
    assert sum(counts.values()) == 2  # total_training_steps is an essential, in no fold
