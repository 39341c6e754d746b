"""The live page's fold of events: pure, replay-safe, the same however the stream is cut, and reading
exactly the payloads the engine emits (real runs in tests/fixtures/engine_events.json)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.views.run_view import (
    BADGE_SEVERITY,
    CHARTS,
    aligned_series,
    apply_event,
    attention_row,
    eager_settings,
    fold,
    format_eta,
    max_of,
    mean_of,
    metric_point,
    metrics_csv,
    rank_key,
    role_badges,
    series,
    spec_differences,
    step_line,
)
from tests.app.pages_support import ENGINE_EVENTS, engine_events

T0 = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass
class Ev:
    seq: int
    kind: str
    payload: dict[str, Any]
    ts: datetime


def events(run: str = "critic_fallback", steps: int | None = None) -> list[Ev]:
    return [Ev(i + 1, kind, payload, T0 + timedelta(seconds=i)) for i, (kind, payload) in
            enumerate(engine_events(run, steps=steps))]


@given(cuts=st.lists(st.integers(min_value=0, max_value=22), max_size=6))
def test_resuming_at_any_seq_folds_to_the_same_view(cuts):
    evs = events(steps=3)
    once = fold(evs)
    view = fold([])
    pos = 0
    for cut in [*sorted(cuts), len(evs)]:
        for ev in evs[pos:max(pos, cut)]:
            apply_event(view, seq=ev.seq, kind=ev.kind, payload=ev.payload, ts=ev.ts)
        # the connection drops; the reconnect resends from up to three events back
        pos = max(0, max(pos, cut) - 3)
    assert view == once


def test_a_run_that_succeeded():
    view = fold(events("succeeded"))
    assert (view.status, view.step, view.total_steps, view.fraction) == ("succeeded", 2, 2, 1.0)
    rows = view.attention_rows()
    assert [(r.role, r.rank) for r in rows] == [(role, rank) for role in ("actor", "rollout", "reference", "critic")
                                                for rank in (0, 1)]
    assert {(r.requested, r.effective, r.observed, r.badge) for r in rows} == {("sdpa", "sdpa", "sdpa", "override")}
    assert rows[0].calls == {"sdpa": 2} and rows[0].strategy == "fsdp2" and rows[0].sp == 1
    assert not any(r.disagrees for r in rows)
    assert view.trouble == [] and view.eager_retry_roles() == []
    assert view.logs[0].message.startswith("2 rank workers up")
    assert view.probe is not None and view.probe["torch_version"] == "2.13.0"


def test_a_critic_that_fell_back():
    view = fold(events("critic_fallback"))
    critic = [r for r in view.attention_rows() if r.role == "critic"]
    assert [(r.rank, r.requested, r.effective, r.badge) for r in critic] == [
        (0, "flash_attention_2", "sdpa", "fallback"), (1, "flash_attention_2", "sdpa", "fallback")]
    assert "fallback-step: fallback policy: trying sdpa next." in critic[0].reasons
    # the ranks report in any order: compared by rank
    trouble = sorted(view.trouble, key=lambda e: e.rank if e.rank is not None else -1)
    assert [(e.kind, e.role, e.rank) for e in trouble] == [("fallback", "critic", 0), ("fallback", "critic", 1)]
    for entry in trouble:
        assert entry.message.startswith("flash_attention_2 → sdpa: ImportError: FlashAttention2 has been toggled on")
        assert entry.summary == "flash_attention_2 requested but flash-attn is not installed"
        assert entry.remedy and "critic.model.override_config.attn_implementation=eager" in entry.remedy
    # it succeeded on sdpa: nothing failed, so no "retry with eager" (issue 17 item 3)
    assert view.status == "succeeded" and view.eager_retry_roles() == []
    assert view.fell_back("critic") and not view.fell_back("actor")
    assert [(b.role, b.badge) for b in view.role_badges()] == [
        ("actor", "override"), ("rollout", "override"), ("reference", "override"), ("critic", "fallback")]


def test_a_critic_that_did_not_load_under_strict():
    view = fold(events("critic_strict"))
    (failed,) = [e.payload for e in events("critic_strict") if e.kind == "error"]  # whichever rank reported first
    assert view.status == "failed" and view.metrics == []
    assert view.reason and view.reason.startswith(f"[critic] rank {failed['rank']}: ImportError")
    critic = [r for r in view.attention_rows() if r.role == "critic"]
    assert [(r.rank, r.requested, r.effective, r.badge) for r in critic] == [
        (failed["rank"], "flash_attention_2", None, "error")]
    assert critic[0].reasons == ["tried flash_attention_2", "flash_attention_2 requested but flash-attn is not installed"]
    assert [e.kind for e in view.trouble] == ["error"] and view.eager_retry_roles() == ["critic"]


@pytest.mark.parametrize("run", ["critic_fallback", "critic_strict"])
def test_the_captured_remedies_are_the_products_one_remedy(run):
    """The fixture says what the engine's classifier says now: a critic that cannot run flash_attention_2 is
    remedied with eager on the critic (eager_remedy), in the event and in each failed attempt."""
    from worker.troubleshoot.remedies import eager_patch

    troubled = [e.payload for e in events(run) if e.kind in ("fallback", "error")]
    assert troubled and {p["role"] for p in troubled} == {"critic"}
    for payload in troubled:
        diagnoses = [payload["diagnosis"], *(a["diagnosis"] for a in payload.get("attempts", []) if "diagnosis" in a)]
        for diagnosis in diagnoses:
            assert diagnosis["remedy"]["patch"] == eager_patch("critic"), diagnosis


def test_the_status_is_read_from_the_engines_state_field():
    """The worker's own payload names the state ``state``; the pump adds ``status``; either folds."""
    raw = json.loads(ENGINE_EVENTS.read_text())["succeeded"]
    view = fold([Ev(e["seq"], e["kind"], e["payload"], T0) for e in raw])
    assert "status" not in raw[-1]["payload"] and view.status == "succeeded"


def test_every_chart_series_is_a_metric_the_engine_reports():
    """The charts name the engine's metrics exactly: a renamed metric fails here, not on an empty chart."""
    metric = next(p for k, p in engine_events("succeeded") if k == "metric")
    point = metric_point(1, metric)
    assert point is not None
    for chart in CHARTS:
        assert any(key in metric["values"] for key in chart.keys), f"{chart.id}: none of {chart.keys} reported"
        if chart.per_rank:
            assert set(metric[chart.per_rank]) == {"0", "1"}
            assert {rank_key(chart.per_rank, r) for r in ("0", "1")} <= set(point["values"])


def test_compare_numbers_from_the_engine_metrics():
    view = fold(events("succeeded"))
    values = [p for k, p in engine_events("succeeded") if k == "metric"]
    tokens = [v["values"]["perf/tokens_per_s"] for v in values]
    assert mean_of(view, "perf/tokens_per_s") == pytest.approx(sum(tokens) / 2)
    assert max_of(view, "perf/max_memory_mb") == max(v["values"]["perf/max_memory_mb"] for v in values)
    assert series(view, ("critic/rewards/mean",)) == [(1, values[0]["values"]["critic/rewards/mean"]),
                                                      (2, values[1]["values"]["critic/rewards/mean"])]
    assert mean_of(view, "no/such_metric") is None


def test_eta_is_pace_times_steps_left():
    evs = [Ev(1, "status", {"state": "running", "total_steps": 6}, T0),
           Ev(2, "metric", {"step": 2, "total_steps": 6, "values": {}}, T0 + timedelta(seconds=10))]
    view = fold(evs)
    assert view.eta_seconds == pytest.approx(20.0)
    assert format_eta(view.eta_seconds) == "20 s"


@pytest.mark.parametrize("seconds,text", [(None, ""), (59.4, "59 s"), (61, "1 min 01 s"), (3725, "1 h 02 min")])
def test_format_eta(seconds, text):
    assert format_eta(seconds) == text


def test_malformed_payloads_are_shown_as_absent():
    view = fold([Ev(1, "metric", {"step": "x", "values": {"a": "y"}}, T0), Ev(2, "attention", {"role": 3}, T0),
                 Ev(3, "status", "not a dict", T0), Ev(4, "fallback", {"from": None, "diagnosis": "x"}, T0)])  # type: ignore[arg-type]
    assert view.metrics == [] and view.attention_rows()[0].role == "3" and view.status == "queued"
    assert view.trouble[0].summary is None and view.trouble[0].role is None


def attention(role: str, rank: int, *, source: str = "override", status: str = "ok", forced: bool = False,
              fallback: bool = False, effective: str = "sdpa") -> tuple[str, dict[str, Any]]:
    return ("attention", {"role": role, "rank": rank, "requested": "flash_attention_2", "source": source,
                          "effective": effective, "status": status, "forced": forced, "fallback": fallback})


@pytest.mark.parametrize("payloads,expected", [
    ([attention("critic", 0), attention("critic", 1)], [("critic", "override", "sdpa")]),
    ([attention("actor", 0, source="default")], [("actor", "default", "sdpa")]),
    ([attention("critic", 0), attention("critic", 1, status="fallback", fallback=True)], [("critic", "fallback", "sdpa")]),
    ([attention("actor", 0, status="forced", forced=True, effective="eager")], [("actor", "forced", "eager")]),
    ([attention("critic", 0), ("error", {"role": "critic", "rank": 1, "message": "boom",
                                         "attempts": [{"implementation": "flash_attention_2"}]})],
     [("critic", "error", None)]),
    ([("error", {"message": "ResourceError: no CPUs"})], []),
    ([attention("critic", 0), attention("actor", 0, source="default")],
     [("actor", "default", "sdpa"), ("critic", "override", "sdpa")]),
])
def test_role_badges_show_the_worst_rank(payloads, expected):
    assert [(b.role, b.badge, b.effective) for b in role_badges(payloads)] == expected


@given(st.lists(st.tuples(st.integers(0, 3), st.sampled_from(["ok", "forced", "fallback"]), st.booleans()),
                min_size=1, max_size=8, unique_by=lambda t: t[0]), st.randoms())
def test_a_role_badge_is_the_worst_of_its_ranks_in_any_order(ranks, rnd):
    payloads = [attention("critic", rank, status=status, forced=status == "forced", fallback=status == "fallback",
                          source="default" if default else "override") for rank, status, default in ranks]
    rnd.shuffle(payloads)
    badges = {b for _, status, default in ranks for b in
              [status if status != "ok" else ("default" if default else "override")]}
    (found,) = role_badges(payloads)
    assert found.badge == min(badges, key=BADGE_SEVERITY.index) and found.ranks == len(ranks)


@pytest.mark.parametrize("badges,status,expected", [
    ([("critic", "fallback", "sdpa"), ("actor", "override", "sdpa")], "failed", ["critic"]),
    ([("rollout", "error", None), ("critic", "error", None)], "failed", ["actor", "critic"]),
    ([("critic", "fallback", "eager")], "failed", []),
    ([("actor", "forced", "eager")], "failed", []),
    ([("critic", "fallback", "sdpa")], "succeeded", []),  # nothing failed: the fallback already runs
    ([("critic", "fallback", "sdpa")], "running", []),
    ([("critic", "error", None)], "cancelled", []),
])
def test_eager_retry_is_offered_for_the_setting_that_failed(badges, status, expected):
    found = role_badges([attention(role, 0, status=b, fallback=b == "fallback", effective=e) if b != "error" else
                         ("error", {"role": role, "rank": 0, "message": "x"}) for role, b, e in badges])
    assert eager_settings(found, status) == expected


def test_spec_differences_and_aligned_series():
    assert spec_differences([{"a": 1, "b": 2}, {"a": 1, "b": 3, "c": 4}]) == [("b", [2, 3]), ("c", [None, 4])]
    assert aligned_series([("r1", [(1, 0.1), (3, 0.3)]), ("r2", [(2, 0.2)])]) == {
        "x": [1, 2, 3], "series": [{"label": "r1", "values": [0.1, None, 0.3]}, {"label": "r2", "values": [None, 0.2, None]}]}


def test_a_restart_is_logged_and_the_new_ranks_rows_say_where_they_ran_and_what_changed():
    """After a restart the attention is observed again: a rank that landed on another node is shown with
    where it ran before; one that also ran another kernel there is marked changed."""
    first = events("succeeded")[:-3]  # up to the metrics: the first ranks reported their attention
    seq = first[-1].seq
    before = {(p["role"], p["rank"]): p for kind, p in ((e.kind, e.payload) for e in first) if kind == "attention"}
    restart = {"message": "restart 1 of 2: rank 1 died: killed; resuming from step 2 (/c/global_step_2)",
               "cause": "rank 1 died: killed", "rank": 1, "attempt": 1, "max_restarts": 2, "resumed_from_step": 2,
               "checkpoint": "/c/global_step_2", "source": "engine"}
    again = [Ev(seq + 1, "restart", restart, T0)]
    for i, ((role, rank), payload) in enumerate(sorted(before.items())):
        moved = {**payload, "node": "10.0.0.9" if rank == 1 else payload.get("node"), "pid": 4000 + rank,
                 "attempt": 1}
        if (role, rank) == ("critic", 1):
            moved.update(effective="eager", observed="eager")
        again.append(Ev(seq + 2 + i, "attention", moved, T0))
    view = fold(first + again)
    assert [e.message for e in view.restarts] == [restart["message"]]
    assert view.trouble[-1].kind == "restart" and view.trouble[-1].rank == 1
    rows = {(r.role, r.rank): r for r in view.attention_rows()}
    assert rows[("actor", 0)].before is None and rows[("actor", 0)].attempt == 1  # same node and kernel
    moved_row = rows[("actor", 1)]
    assert (moved_row.node, moved_row.pid, moved_row.before.node, moved_row.changed) == \
        ("10.0.0.9", 4001, before[("actor", 1)].get("node"), False)
    critic = rows[("critic", 1)]
    assert critic.changed and (critic.before.effective, critic.effective) == ("sdpa", "eager")


def test_step_line_and_metrics_csv():
    points = [{"step": 1, "seq": 5, "values": {"critic/rewards/mean": 0.05712, "perf/tokens_per_s": 412.4,
                                                "perf/step_time_s": 1.918}},
              {"step": 2, "seq": 9, "values": {"perf/tokens_per_s": 400.0}}]
    assert step_line(points[0], 12) == "step 1 of 12: reward 0.05712, 412 tokens/s, 1.92 s"
    assert step_line({"step": 3, "seq": 1, "values": {}}, None) == "step 3"
    assert metrics_csv(points).splitlines() == ["step,critic/rewards/mean,perf/step_time_s,perf/tokens_per_s",
                                                "1,0.05712,1.918,412.4", "2,,,400.0"]


def test_reasons_keep_their_rule_apart():
    row = attention_row({"role": "critic", "reasons": [
        {"rule": "verl-critic-defect", "text": "verl <= 0.9.1 ignores it: attnboard applies it."},
        "fallback-step: trying sdpa next.", "tried flash_attention_2: no luck"]})
    assert row.reason_items == [("verl-critic-defect", "verl <= 0.9.1 ignores it: attnboard applies it."),
                                ("fallback-step", "trying sdpa next."), (None, "tried flash_attention_2: no luck")]
