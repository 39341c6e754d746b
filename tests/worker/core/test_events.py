"""The typed event contract: a payload model per event kind, walked over every kind and checked against the
events of real engine runs (``tests/fixtures/engine_events.json``) and those the app writes itself."""

from __future__ import annotations

import json
import re
from dataclasses import fields
from pathlib import Path

import pytest
from pydantic import ValidationError

from worker.core.attention_payload import FIELDS, SUMMARY_FIELDS, AttentionPayload, cell, status_of
from worker.core.contract import Kind
from worker.core.events import PAYLOADS, read_attention, validate_payload

ROOT = Path(__file__).resolve().parents[3]
ENGINE_EVENTS = json.loads((ROOT / "tests" / "fixtures" / "engine_events.json").read_text())


def test_every_event_kind_has_a_payload_model():
    assert set(PAYLOADS) == set(Kind)


def test_every_kind_the_engine_emits_is_a_kind_with_a_model():
    emitted = set()
    for path in (ROOT / "worker").rglob("*.py"):
        emitted |= set(re.findall(r"\bemit\(Kind\.(\w+)", path.read_text()))
    emitted.add(Kind.status.value)  # EventLog.status
    assert emitted and emitted <= {k.value for k in PAYLOADS}
    assert {k.value for k in Kind} - emitted == set(), "a kind no engine code emits"


@pytest.mark.parametrize("run", sorted(ENGINE_EVENTS))
def test_the_events_of_real_engine_runs_validate_against_their_models(run):
    kinds = set()
    for event in ENGINE_EVENTS[run]:
        validate_payload(event["kind"], event["payload"])
        kinds.add(event["kind"])
    assert {"status", "env_probe", "log"} <= kinds
    assert set(Kind) - {Kind.restart} <= {Kind(k) for run in ENGINE_EVENTS.values() for k in (e["kind"] for e in run)} | \
        {Kind.attention_mismatch}  # the three runs show every kind but a restart and a mismatch


def test_a_payload_with_an_unknown_or_missing_field_is_refused_naming_it():
    attention = next(e["payload"] for e in ENGINE_EVENTS["succeeded"] if e["kind"] == "attention")
    with pytest.raises(ValidationError, match="sdpa_backends"):
        validate_payload("attention", {**attention, "sdpa_backends": "flash_attention"})
    with pytest.raises(ValidationError, match="resumed_from_step"):
        validate_payload("restart", {"message": "m", "cause": "c", "rank": 1, "attempt": 1, "max_restarts": 2,
                                     "checkpoint": None, "source": "engine"})
    assert validate_payload("fallback", {"role": "critic", "rank": 0, "from": "flash_attention_2", "to": "sdpa",
                                         "error": "e", "diagnosis": {}}).from_ == "flash_attention_2"


def test_every_attention_field_is_documented_in_the_schema():
    from pydantic import TypeAdapter

    schema = TypeAdapter(AttentionPayload).json_schema()
    assert list(schema["properties"]) == list(FIELDS)
    assert all(schema["properties"][name].get("description") for name in FIELDS)
    assert {"sdpa_backend", "compute_dtype", "weights_dtype", "calls", "sdpa"} <= set(FIELDS)
    assert set(SUMMARY_FIELDS) <= set(FIELDS)


def test_read_attention_keeps_what_validates_and_defaults_the_rest():
    read = read_attention({"role": 3, "rank": "zero", "calls": {"sdpa": 2}, "forced": True, "unknown": 1})
    assert (read.role, read.rank, read.calls, read.status) == ("3", None, {"sdpa": 2}, "forced")
    assert read_attention({"role": "actor", "status": "ok", "fallback": True}).status == "ok"
    defaults = AttentionPayload("actor")
    assert read_attention({"role": "actor"}) == defaults
    assert [f.name for f in fields(defaults)] == list(FIELDS)


@pytest.mark.parametrize("forced,fallback,status", [(False, False, "ok"), (True, False, "forced"),
                                                     (False, True, "fallback"), (True, True, "forced")])
def test_status_of(forced, fallback, status):
    assert status_of(forced, fallback) == status


def test_of_picks_the_payload_from_a_report_and_refuses_unknown_changes():
    report = {"role": "actor", "rank": 1, "effective": "sdpa", "attempts": [{"implementation": "sdpa", "ok": True}]}
    assert AttentionPayload.of(report, attempt=2).as_dict()["attempt"] == 2
    with pytest.raises(TypeError):
        AttentionPayload.of(report, attempts=[])


@pytest.mark.parametrize("payload,name,text", [
    ({"calls": {"sdpa": 2, "eager": 1}}, "calls", "eager x1, sdpa x2"),
    ({"sdpa_backend": "math", "sdpa_backend_reason": "fp64"}, "sdpa_backend", "math (fp64)"),
    ({"observed": None}, "observed", "-"),
    ({"rank": 0}, "rank", "0"),
])
def test_cell(payload, name, text):
    assert cell(payload, name) == text
