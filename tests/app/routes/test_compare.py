"""Runs side by side."""

from __future__ import annotations

import json

import pytest

from tests.app.pages_support import (
    engine_events,
    soup,
    stored_run,
)

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def test_compare_shows_differences_and_one_reward_chart(client, session):
    a = stored_run(session, name="a", events=engine_events(steps=3))
    b = stored_run(session, name="b", events=engine_events(steps=2), **{"actor_rollout_ref.actor.clip_ratio": 0.3})
    page = soup(client.get("/compare", params={"ids": f"{a},{b}"}).text)
    diff_keys = [th.get_text(strip=True) for th in page.select("table.diffs tbody th")]
    assert diff_keys == ["actor_rollout_ref.actor.clip_ratio"]
    assert len(page.select("table.compare tbody tr")) == 2
    assert '"x":[1,2,3]' in page.select_one("#reward-data").string
    critic = page.select_one(f"table.compare tr[data-run='{a}'] .role-badge[data-role='critic']")
    assert critic["data-badge"] == "override"
    assert page.select_one(f"table.compare tr[data-run='{a}'] td.num").get_text() != "—"


def test_compare_takes_the_lists_checkboxes(client, session):
    a = stored_run(session, name="a", events=engine_events())
    b = stored_run(session, name="b", events=engine_events("critic_fallback"))
    page = soup(client.get(f"/compare?ids={a}&ids={b}").text)
    assert [tr["data-run"] for tr in page.select("table.compare tbody tr")] == [str(a), str(b)]



def test_compare_draws_every_metric_with_a_line_per_run(client, session):
    a = stored_run(session, name="a", events=engine_events(steps=3))
    b = stored_run(session, name="b", events=engine_events("critic_fallback", steps=2))
    page = soup(client.get("/compare", params={"ids": f"{a},{b}"}).text)
    charts = {f["data-metric"]: f for f in page.select("figure.chart[data-metric]")}
    assert {"critic/rewards/mean", "actor/pg_loss", "perf/tokens_per_s", "peak_memory_mb/rank 1"} <= set(charts)
    data = json.loads(page.select_one(charts["perf/tokens_per_s"]["data-static"]).string)
    assert data["x"] == [1, 2, 3]
    assert [s["label"] for s in data["series"]] == [f"#{a} a", f"#{b} b"]
    assert data["series"][1]["values"][2] is None  # b has no third step: a gap, not a zero
