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
    assert role_badges_of(row)["actor"] == ("override", "actor sdpa as asked")
    fragment = client.get("/", params={"status": "failed"}, headers={"HX-Request": "true"}).text
    assert not soup(fragment).select(f"tr[data-run='{run_id}']")


@pytest.mark.parametrize("run,critic,roles,eager", [
    # it succeeded on sdpa: nothing failed, so no "retry with eager" (issue 17 item 3)
    ("critic_fallback", ("fallback", "critic flash_attention_2 → sdpa ↓ fell back"),
     ["actor", "rollout", "reference", "critic"], []),
    ("critic_strict", ("error", "critic flash_attention_2 → none ✕ error"), ["critic"], ["critic"]),  # stopped early
])
def test_list_shows_a_critic_that_fell_back_or_failed_as_such(client, session, run, critic, roles, eager):
    """Not "ok": the badge says what happened, in colour (its class) and in words."""
    csrf = login(client, session, ["read", "write"])
    run_id = stored_run(session, name=run, events=engine_events(run))
    row = soup(client.get("/").text).select_one(f"tr[data-run='{run_id}']")
    badges = role_badges_of(row)
    assert badges["critic"] == critic
    assert row.select_one(f".role-badge[data-role='critic'] .badge-{critic[0]}") is not None
    assert list(badges) == roles
    offered = row.select("td.quick form input[name='eager_on']")
    assert [i["value"] for i in offered] == eager
    for retry in (i.parent for i in offered):
        assert retry["action"] == f"/runs/{run_id}/retry" and retry.select_one("input[name='csrf_token']")["value"] == csrf


def test_list_quick_links_need_write(client, session):
    run_id = stored_run(session, name="anyone", events=engine_events("critic_fallback"))
    login(client, session, ["read"])
    row = soup(client.get("/").text).select_one(f"tr[data-run='{run_id}']")
    assert row.select("td.quick form") == []



def test_archived_runs_are_hidden_unless_asked_for(client, session):
    csrf = login(client, session, ["read", "write"])
    kept = stored_run(session, name="kept", events=engine_events("succeeded"))
    put_away = stored_run(session, name="put away", events=engine_events("succeeded"))
    resp = client.post(f"/runs/{put_away}/archive", data={"csrf_token": csrf}, follow_redirects=False)
    assert resp.status_code == 303

    def listed(query: str = "") -> list[str]:
        return [tr["data-run"] for tr in soup(client.get("/" + query).text).select("tr[data-run]")]

    assert listed() == [str(kept)]
    assert listed("?archived=with") == [str(put_away), str(kept)]
    assert listed("?archived=only") == [str(put_away)]
    assert "archived" in soup(client.get("/?archived=only").text).select_one(f"tr[data-run='{put_away}'] .badge-archived").text
    client.post(f"/runs/{put_away}/archive", data={"csrf_token": csrf, "archived": "false"})
    assert listed() == [str(put_away), str(kept)]


def test_archiving_needs_a_write_session(client, session):
    run_id = stored_run(session, name="r", events=engine_events("succeeded"))
    csrf = login(client, session, ["read"])
    assert client.post(f"/runs/{run_id}/archive", data={"csrf_token": csrf}).status_code == 403


@pytest.mark.parametrize("sort,expected", [
    ("newest", ["b-run", "C-run", "a-run"]),
    ("oldest", ["a-run", "C-run", "b-run"]),
    ("name", ["a-run", "b-run", "C-run"]),
    ("nonsense", ["b-run", "C-run", "a-run"]),  # an unknown order falls back to newest first
])
def test_runs_list_sorts(client, session, sort, expected):
    for name in ("a-run", "C-run", "b-run"):
        stored_run(session, name=name)
    page = soup(client.get("/", params={"sort": sort}).text)
    assert [a.get_text(strip=True) for a in page.select("tr[data-run] td.name a")] == expected


def test_runs_list_reloads_itself_faster_while_a_run_is_active(client, session):
    stored_run(session, name="done", events=engine_events("succeeded"))
    quiet = soup(client.get("/").text).select_one("#runs")
    assert quiet["hx-trigger"] == "every 15s" and quiet["hx-get"].startswith("/?")
    stored_run(session, name="waiting")  # queued
    live = soup(client.get("/", params={"q": "wait"}).text).select_one("#runs")
    assert live["hx-trigger"] == "every 3s" and "q=wait" in live["hx-get"]
    fragment = client.get(live["hx-get"], headers={"HX-Request": "true"}).text
    assert soup(fragment).select_one("body") is None and soup(fragment).select_one("#runs") is not None
