"""The new-run form reads its YAML inputs through the one guard: an alias bomb in a mapping is an issue of that
field, not a hung web process."""

from __future__ import annotations

import time

import pytest

from app.views.run_form import FormError, form_to_spec_data
from worker.core.limits import MAX_YAML_NODES

BOMB = "{a: &a [1,2,3,4,5,6,7,8,9,10], b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a], c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b], " \
       "d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c], e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d], f: [*e,*e,*e,*e,*e,*e,*e,*e,*e,*e]}"


@pytest.mark.parametrize("key", ["critic.model.override_config", "verl_passthrough"])
def test_an_alias_bomb_in_a_yaml_field_is_that_fields_issue(key):
    t0 = time.monotonic()
    with pytest.raises(FormError) as info:
        form_to_spec_data({key: [BOMB]})
    assert time.monotonic() - t0 < 2
    issue = next(i for i in info.value.issues if i.field == key)
    assert f"more than {MAX_YAML_NODES} values" in issue.message


def test_an_ordinary_mapping_is_read():
    assert form_to_spec_data({"critic.model.override_config": ["{hidden_size: 64}"]})[
        "critic.model.override_config.hidden_size"] == 64
