"""The runs list: status and the effective attention per role, quick links."""

from __future__ import annotations

import pytest

from tests.app.pages_support import (
    engine_events,
    login,
    soup,
    stored_run,
)

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def role_badges_of(row) -> dict[str, tuple[str, str]]:
    """Per role in a runs-list row: (the badge's data, the text it shows)."""
    return {span["data-role"]: (span["data-badge"], span.get_text(" ", strip=True)) for span in row.select(".role-badge")}


def test_list_shows_status_and_effective_attention(client, session):
    run_id = stored_run(session, name="listed", events=engine_events())
    row = soup(client.get("/").text).select_one(f"tr[data-run='{run_id}']")
    assert row.select_one(".badge-succeeded").get_text(strip=True).endswith("succeeded")
    assert role_badges_of(row)["actor"] == ("override", "actor sdpa override")
    fragment = client.get("/", params={"status": "failed"}, headers={"HX-Request": "true"}).text
    assert not soup(fragment).select(f"tr[data-run='{run_id}']")


@pytest.mark.parametrize("run,critic,roles", [
    ("critic_fallback", ("fallback", "critic flash_attention_2 → sdpa ↓ fallback"),
     ["actor", "rollout", "reference", "critic"]),
    ("critic_strict", ("error", "critic flash_attention_2 → none ✕ error"), ["critic"]),  # stopped before any report
])
def test_list_shows_a_critic_that_fell_back_or_failed_as_such(client, session, run, critic, roles):
    """Not "ok": the badge says what happened, in colour (its class) and in words."""
    csrf = login(client, session, ["read", "write"])
    run_id = stored_run(session, name=run, events=engine_events(run))
    row = soup(client.get("/").text).select_one(f"tr[data-run='{run_id}']")
    badges = role_badges_of(row)
    assert badges["critic"] == critic
    assert row.select_one(f".role-badge[data-role='critic'] .badge-{critic[0]}") is not None
    assert list(badges) == roles
    retry = row.select_one("td.quick form input[name='eager_on'][value='critic']").parent
    assert retry["action"] == f"/runs/{run_id}/retry" and retry.select_one("input[name='csrf_token']")["value"] == csrf


def test_list_quick_links_need_write(client, session):
    run_id = stored_run(session, name="anyone", events=engine_events("critic_fallback"))
    login(client, session, ["read"])
    row = soup(client.get("/").text).select_one(f"tr[data-run='{run_id}']")
    assert row.select("td.quick form") == []

