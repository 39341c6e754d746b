"""Property tests at the edges: no JSON body, however odd, makes the API answer 500; dotted patches
behave like setting keys one by one. What schemathesis (``test_schemathesis.py``) does not send is sent
here: NaN/Infinity literals, NUL characters and lone surrogates in keys and values, deep nesting, and
verl command-line fragments."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.errors import AppError
from app.services.runs import apply_patch
from tests.app.error_shape import assert_error_shape
from worker.spec import SPEC_KEYS

SPEC_KEY_SAMPLE = st.sampled_from(sorted(SPEC_KEYS))
# Text with what PostgreSQL and UTF-8 cannot hold mixed in: NUL and lone surrogates (valid as JSON escapes).
nasty_text = st.lists(st.one_of(st.text(max_size=8), st.sampled_from(["\x00", "\ud800", "\udfff", "\U0001f600"])),
                      max_size=4).map("".join)
scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True), nasty_text)
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(nasty_text, inner, max_size=4)), max_leaves=12)
specs = st.dictionaries(st.one_of(SPEC_KEY_SAMPLE, nasty_text), json_values, max_size=6)


def _post(client, path, body, headers):
    # allow_nan: NaN/Infinity literals are what a careless client sends; the API must refuse them cleanly
    raw = json.dumps(body, allow_nan=True).encode()
    return client.post(path, content=raw, headers={**headers, "content-type": "application/json"})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spec=specs, name=st.one_of(st.none(), nasty_text))
def test_random_run_bodies_never_500(client, write_headers, spec, name):
    body = {"spec": spec} if name is None else {"spec": spec, "name": name}
    resp = _post(client, "/api/runs", body, write_headers)
    assert resp.status_code in (201, 422), resp.text
    if resp.status_code == 422:
        assert_error_shape(422, resp.json())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spec=specs, environment=st.one_of(st.text(max_size=15), json_values))
def test_random_resolve_bodies_never_500(client, read_headers, spec, environment):
    resp = _post(client, "/api/resolve", {"spec": spec, "environment": environment}, read_headers)
    assert resp.status_code in (200, 422), resp.text
    if resp.status_code == 422:
        assert_error_shape(422, resp.json())


@pytest.mark.parametrize("depth", [50, 500, 5000])
def test_deeply_nested_bodies_are_refused_cleanly(client, write_headers, depth):
    raw = ('{"spec": {"critic": ' + '{"a": ' * depth + "1" + "}" * depth + "}}").encode()
    resp = client.post("/api/runs", content=raw, headers={**write_headers, "content-type": "application/json"})
    assert 400 <= resp.status_code < 500 and resp.json()["error"]["message"]


@pytest.mark.parametrize("tree,patch,expected", [
    ({"a": {"b": 1}}, {}, {"a": {"b": 1}}),
    ({"a": {"b": 1}}, {"a.b": 2}, {"a": {"b": 2}}),
    ({"a": {"b": 1}}, {"a.c.d": 3}, {"a": {"b": 1, "c": {"d": 3}}}),
    ({"a": {"b": 1}}, {"a.b": None}, {"a": {}}),
    ({"a": 1}, {"a.b": 2}, {"a": {"b": 2}}),
    ({"a": {"b": 1}}, {"a": {"x": 1}}, {"a": {"x": 1}}),
])
def test_apply_patch_table(tree, patch, expected):
    before = json.dumps(tree)
    assert apply_patch(tree, patch) == expected
    assert json.dumps(tree) == before  # the input (a run's immutable copy) is never changed


@pytest.mark.parametrize("key", ["", "a..b", ".a", "a."])
def test_apply_patch_rejects_empty_components(key):
    with pytest.raises(AppError) as info:
        apply_patch({}, {key: 1})
    assert info.value.field == f"patch.{key}"


@given(st.dictionaries(st.from_regex(r"[a-c](\.[a-c]){0,2}", fullmatch=True), st.integers(), max_size=5))
def test_apply_patch_sets_every_key_of_a_conflict_free_patch(patch):
    keys = sorted(patch)
    # keep only keys that are not a prefix of another (those would overwrite each other)
    leaves = {k: v for k, v in patch.items() if not any(o != k and o.startswith(k + ".") for o in keys)}
    out = apply_patch({}, leaves)
    for dotted, value in leaves.items():
        node = out
        for part in dotted.split("."):
            node = node[part]
        assert node == value


verl_words = st.sampled_from(["python3", "-m", "verl.trainer.main_ppo", "+", "++", "~", "=", "'", '"', "\\\n", " ",
                              "trainer.device=cpu", "critic.model.override_config.attn_implementation=eager",
                              "data.train_batch_size=", "[1,2]", "${oc.env:X}", "{a: 1}", ":", "-", "\n", "  "])
import_texts = st.one_of(st.text(max_size=200), nasty_text, st.lists(verl_words, max_size=25).map("".join))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=import_texts, fmt=st.sampled_from(["auto", "cli", "yaml"]))
def test_random_import_texts_never_500(client, read_headers, text, fmt):
    resp = _post(client, "/api/import", {"text": text, "format": fmt}, read_headers)
    assert resp.status_code in (200, 422), resp.text
    if resp.status_code == 422:
        assert_error_shape(422, resp.json())
