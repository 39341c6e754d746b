"""The live page's fold of events: pure, replay-safe, and the same however the stream is cut."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.run_view import aligned_series, apply_event, fold, format_eta, spec_differences
from tests.app.pages_support import succeeded_events

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


@dataclass
class Ev:
    seq: int
    kind: str
    payload: dict[str, Any]
    ts: datetime


def events(n_steps: int = 5) -> list[Ev]:
    return [Ev(i + 1, kind, payload, T0 + timedelta(seconds=i)) for i, (kind, payload) in
            enumerate(succeeded_events(steps=n_steps, fallback_critic=True))]


@given(cuts=st.lists(st.integers(min_value=0, max_value=12), max_size=6))
def test_resuming_at_any_seq_folds_to_the_same_view(cuts):
    evs = events()
    once = fold(evs)
    view = fold([])
    pos = 0
    for cut in sorted(cuts) + [len(evs)]:
        for ev in evs[pos:max(pos, cut)]:
            apply_event(view, seq=ev.seq, kind=ev.kind, payload=ev.payload, ts=ev.ts)
        # the connection drops; the reconnect resends from up to three events back
        pos = max(0, max(pos, cut) - 3)
    assert view == once


def test_fold_reads_the_contract():
    view = fold(events(4), total_steps=4)
    assert (view.status, view.step, view.fraction, view.last_seq) == ("succeeded", 4, 1.0, 11)
    assert [m["step"] for m in view.metrics] == [1, 2, 3, 4]
    assert [(r.role, r.status) for r in view.attention_rows()] == [("actor", "ok"), ("critic", "fallback")]
    assert view.fell_back("critic") and not view.fell_back("actor")
    assert [e.kind for e in view.trouble] == ["fallback"]


def test_eta_is_pace_times_steps_left():
    evs = [Ev(1, "status", {"status": "running"}, T0), Ev(2, "metric", {"step": 2, "values": {}}, T0 + timedelta(seconds=10))]
    view = fold(evs, total_steps=6)
    assert view.eta_seconds == pytest.approx(20.0)
    assert format_eta(view.eta_seconds) == "20 s"


@pytest.mark.parametrize("seconds,text", [(None, ""), (59.4, "59 s"), (61, "1 min 01 s"), (3725, "1 h 02 min")])
def test_format_eta(seconds, text):
    assert format_eta(seconds) == text


def test_malformed_payloads_are_shown_as_absent():
    view = fold([Ev(1, "metric", {"step": "x", "values": {"a": "y"}}, T0), Ev(2, "attention", {"role": 3}, T0),
                 Ev(3, "status", "not a dict", T0)])  # type: ignore[arg-type]
    assert view.metrics == [] and view.attention_rows()[0].role == "3" and view.status == "queued"


def test_spec_differences_and_aligned_series():
    assert spec_differences([{"a": 1, "b": 2}, {"a": 1, "b": 3, "c": 4}]) == [("b", [2, 3]), ("c", [None, 4])]
    assert aligned_series([("r1", [(1, 0.1), (3, 0.3)]), ("r2", [(2, 0.2)])]) == {
        "x": [1, 2, 3], "series": [{"label": "r1", "values": [0.1, None, 0.3]}, {"label": "r2", "values": [None, 0.2, None]}]}
