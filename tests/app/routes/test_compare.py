"""Runs side by side."""

from __future__ import annotations

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

