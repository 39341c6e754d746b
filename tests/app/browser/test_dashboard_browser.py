"""The dashboard in real headless Chromium (Debian's), driven by Playwright, against the served app:
``create_app(ray=True)`` under uvicorn on 127.0.0.1 with its own data directory, so the app starts its
embedded Ray head on loopback and real runs train on the tiny CPU preset.

Four real runs in all, shared by the tests in file order: a run that succeeds (named with a script
injection, which must render as text), a run whose critic falls back (and succeeds: no retry offered on it,
nothing failed), the same critic under strict (it fails), and that run's retry with its troubleshooting
entry's remedy, eager on the critic.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator

import httpx
import pytest

from tests.app.browser.support import (
    ACTIVE,
    RUN_TIMEOUT_MS,
    Server,
    create_token,
    expect,
    reveal,
    run_id_of,
    served,
    shot,
)
from tests.app.factories import tiny_spec
from tests.app.pages_support import XSS_NAME

pytestmark = [pytest.mark.browser, pytest.mark.ray]

SEED_CRITIC_COMMAND = """python3 ppo_trainer.py \\
    actor_rollout_ref.model.override_config.attn_implementation=eager \\
    critic.model.override_config.attn_implementation=eager \\
    [other parameters...]"""
ACTOR_ATTN = "actor_rollout_ref.model.override_config.attn_implementation"
CRITIC_ATTN = "critic.model.override_config.attn_implementation"
STEPS = 3


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The served app (Ray launcher and supervisor) on a fresh data directory, under uvicorn."""
    data = tmp_path_factory.mktemp("server")
    db_url = f"sqlite:///{data / 'attnboard.db'}"
    with served(data, [sys.executable, "-m", "uvicorn", "app.main:create_served_app", "--factory", "--host", "127.0.0.1",
                       "--log-level", "warning"], env={"ATTNBOARD_DATABASE_URL": db_url}) as srv:
        srv.token = create_token(db_url)
        yield srv


def preview_cell(page, role: str, cell: str) -> str:
    return page.locator(f"#preview tr[data-role='{role}'] td.{cell}").inner_text().strip()


def launch_from_form(page, server: Server, *, name: str, **fields: str) -> int:
    """Fill the new-run form (the tiny CPU preset it starts from, ``STEPS`` steps, plus ``fields``:
    select name -> option) and launch; returns the new run's id from the live page's URL."""
    page.goto(server.base + "/runs/new")
    page.fill("#f-name", name)
    page.fill("input[name='trainer.total_training_steps']", str(STEPS))
    for key, value in fields.items():
        reveal(page, key)
        page.select_option(f"select[name='{key}']", value)
    page.wait_for_load_state("networkidle")
    page.click("#action-bar button.primary")
    page.wait_for_url(re.compile(r"/runs/\d+$"))
    return run_id_of(page)


# --------------------------------------------------------------------------------------------
# The form


def test_preview_follows_strategy_and_ulysses(page, server):
    page.goto(server.base + "/runs/new")
    page.select_option(f"select[name='{ACTOR_ATTN}']", "sdpa")
    for key in ("trainer.n_gpus_per_node", "actor_rollout_ref.actor.strategy"):
        reveal(page, key)
    page.fill("input[name='trainer.n_gpus_per_node']", "2")
    page.select_option("select[name='actor_rollout_ref.actor.strategy']", "fsdp_turbo")
    page.fill("input[name='actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size']", "2")
    expect(page.locator("#preview tr[data-role='actor'] td.effective")).to_have_text("eager")
    assert preview_cell(page, "actor", "status").endswith("forced")
    assert "forced-eager-fsdp-turbo-ulysses" in preview_cell(page, "actor", "reasons")
    shot(page, "form-forced-eager")
    page.select_option("select[name='actor_rollout_ref.actor.strategy']", "fsdp2")
    expect(page.locator("#preview tr[data-role='actor'] td.effective")).to_have_text("sdpa")
    assert preview_cell(page, "actor", "status").endswith("as asked")
    assert page.console_errors == []  # CSP violations are console errors


def test_import_seed_critic_command_fills_the_form(page, server):
    page.goto(server.base + "/runs/new")
    page.click("details.import summary")
    page.fill("#verl-text", SEED_CRITIC_COMMAND)
    page.click("#import-form button[type='submit']")
    page.wait_for_selector("#import-notes")
    assert page.input_value(f"select[name='{ACTOR_ATTN}']") == "eager"
    assert page.input_value(f"select[name='{CRITIC_ATTN}']") == "eager"
    expect(page.locator("#preview tr[data-role='critic'] td.effective")).to_have_text("eager")
    shot(page, "form")


# --------------------------------------------------------------------------------------------
# Real runs


def test_a_tiny_run_goes_live_to_succeeded(page, server):
    run_id = launch_from_form(page, server, name=XSS_NAME)
    server.runs["tiny"] = run_id
    assert page.locator("#live").get_attribute("sse-connect") is not None, "a fresh run streams its events"
    status = page.locator("#status")
    expect(status).to_have_attribute("data-status", "succeeded", timeout=RUN_TIMEOUT_MS)
    expect(page.locator("#progress-bar")).to_have_attribute("value", "100")
    assert f"step {STEPS} of {STEPS}" in page.locator("#status label").inner_text()
    for role in ("actor", "rollout", "reference", "critic"):
        row = page.locator(f"#attention tr[data-role='{role}'][data-rank='0']")
        expect(row.locator("td.effective")).to_have_text("sdpa → sdpa")
        assert row.locator(".badge").get_attribute("data-badge") == "override"
        assert row.locator(".badge").inner_text().endswith("as asked")
    for chart in ("reward", "kl", "loss", "throughput", "step-time", "memory"):
        expect(page.locator(f"#chart-{chart}")).to_have_attribute("data-points", str(STEPS))
    logs = page.locator("#logs li").evaluate_all("items => items.map(li => li.id)")
    assert logs and len(logs) == len(set(logs)), f"a log line shown twice: {logs}"
    assert page.locator("h1").inner_text().startswith(XSS_NAME)
    shot(page, "live")
    assert page.dialogs == [] and page.console_errors == []


def test_a_critic_that_falls_back_succeeds_and_offers_no_retry(page, server):
    """Issue 17 item 3: a run that succeeded after a fallback offers no retry (nothing failed), neither the run
    page's "Retry with eager" nor its troubleshooting entry's "Retry with this remedy"; the entry still says
    its remedy, the one the button of a failed run applies (eager on the critic)."""
    run_id = launch_from_form(page, server, name="critic asks for flash_attention_2 on CPU",
                              **{CRITIC_ATTN: "flash_attention_2", "attnboard.fallback_policy": "fallback"})
    server.runs["fallback"] = run_id
    critic = page.locator("#attention tr[data-role='critic'][data-rank='0']")
    expect(critic.locator(".badge")).to_have_text(re.compile("fell back$"), timeout=RUN_TIMEOUT_MS)
    expect(critic.locator("td.effective")).to_have_text("flash_attention_2 → sdpa")
    entry = page.locator("#trouble li.kind-fallback").first
    expect(entry.locator(".summary")).to_have_text("flash_attention_2 requested but flash-attn is not installed")
    expect(page.locator("#status")).to_have_attribute("data-status", "succeeded", timeout=RUN_TIMEOUT_MS)
    shot(page, "live-fallback")
    expect(entry.locator(".remedy")).to_contain_text("critic.model.override_config.attn_implementation=eager")
    expect(page.get_by_role("button", name=re.compile("Retry with eager"))).to_have_count(0)
    expect(page.locator("#actions form.eager-remedy")).to_have_count(0)
    page.goto(f"{server.base}/troubleshooting?run_id={run_id}&role=critic")
    critic_entry = page.locator("#entries li.trouble-entry").first
    expect(critic_entry.locator("code.patch")).to_have_text(f"{CRITIC_ATTN}=eager")
    expect(critic_entry.get_by_role("button", name="Retry with this remedy")).to_have_count(0)
    expect(critic_entry.locator(".no-retry")).to_have_text("No retry: only a failed run is retried (this run: succeeded).")


def test_a_critic_that_cannot_load_under_strict_fails_and_its_entrys_remedy_retries_with_eager(page, server):
    """The same critic under strict (launched through the API: the form does not launch what its preflight
    shows failing) fails; its troubleshooting entry's one click retries it with eager on the critic."""
    resp = httpx.post(server.base + "/api/runs", headers={"Authorization": f"Bearer {server.token}"}, timeout=30,
                      json={"name": "strict flash_attention_2 on CPU",
                            "spec": tiny_spec(**{ACTOR_ATTN: "sdpa", CRITIC_ATTN: "flash_attention_2",
                                                 "trainer.total_training_steps": STEPS})})
    assert resp.status_code == 201, resp.text
    run_id = server.runs["strict"] = resp.json()["id"]
    page.goto(f"{server.base}/runs/{run_id}")
    expect(page.locator("#status")).to_have_attribute("data-status", "failed", timeout=RUN_TIMEOUT_MS)
    page.goto(f"{server.base}/troubleshooting?run_id={run_id}&role=critic")
    critic_entry = page.locator("#entries li.trouble-entry").first
    expect(critic_entry.locator("code.patch")).to_have_text(f"{CRITIC_ATTN}=eager")
    expect(critic_entry.locator(".no-retry")).to_have_count(0)
    retry = critic_entry.get_by_role("button", name="Retry with this remedy")
    retry.focus()
    with page.expect_navigation():
        page.keyboard.press("Enter")  # keyboard usable: the focused button submits its form
    new_id = run_id_of(page)
    assert new_id != run_id
    server.runs["retry"] = new_id
    assert f"retry of #{run_id}" in page.locator(".run-head").inner_text()
    assert page.locator("#status").get_attribute("data-status") in (*ACTIVE, "succeeded")
    expect(page.locator("#status")).to_have_attribute("data-status", "succeeded", timeout=RUN_TIMEOUT_MS)
    expect(page.locator("#attention tr[data-role='critic'][data-rank='0'] td.effective")).to_have_text("eager → eager")


def test_runs_list_and_compare_after_the_runs(page, server):
    tiny, fallback, strict, retry = (server.runs.get(k) for k in ("tiny", "fallback", "strict", "retry"))
    if None in (tiny, fallback, strict, retry):
        pytest.skip("the real runs above did not all start")
    page.goto(server.base + "/")
    assert page.locator(f"tr[data-run='{tiny}'] td.name a").inner_text() == XSS_NAME
    critic = page.locator(f"tr[data-run='{fallback}'] .role-badge[data-role='critic']")
    assert critic.get_attribute("data-badge") == "fallback"
    assert critic.inner_text().split() == ["critic", "flash_attention_2", "→", "sdpa", "↓", "fell", "back"]
    assert page.locator(f"tr[data-run='{retry}'] .role-badge[data-role='critic']").get_attribute("data-badge") == "override"
    assert page.locator(f"tr[data-run='{fallback}'] td.quick button", has_text="Retry, eager").count() == 0  # it succeeded
    compare_link = page.locator(f"tr[data-run='{retry}'] td.quick a", has_text=f"Compare with #{strict}")
    shot(page, "list")
    page.check(f"tr[data-run='{tiny}'] input[name='ids']")
    page.check(f"tr[data-run='{fallback}'] input[name='ids']")
    page.get_by_role("button", name="Compare selected").click()
    page.wait_for_url(re.compile(r"/compare\?"))
    assert page.locator("table.compare tbody tr").count() == 2
    page.goto(server.base + "/")
    compare_link.click()
    page.wait_for_url(re.compile(r"/compare\?"))
    assert [page.locator("table.compare tbody tr").nth(i).get_attribute("data-run") for i in range(2)] == [
        str(strict), str(retry)]
    assert CRITIC_ATTN in page.locator("table.diffs").inner_text()
    expect(page.locator("#chart-reward-compare")).to_have_attribute("data-points", str(STEPS))
    shot(page, "compare")
    assert page.dialogs == [] and page.console_errors == []


def test_a_logged_out_launch_keeps_the_form_across_the_sign_in(browser, server):
    """Issue 17 item 1, in Chromium: a newcomer fills the form logged out, presses Launch, signs in on the page
    that asks, and is back on the same form as filled (the preview answered "sign in" meanwhile)."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    pg = context.new_page()
    pg.goto(server.base + "/runs/new")
    pg.fill("#f-name", "kept across the login")
    pg.select_option(f"select[name='{ACTOR_ATTN}']", "eager")
    expect(pg.locator("#preview")).to_contain_text("Sign in to see")
    pg.click("#run-form button.primary")
    pg.wait_for_selector("#token")
    pg.fill("#token", server.token)
    pg.press("#token", "Enter")
    pg.wait_for_url(re.compile(r".*/runs/new\?restore=1&.*"))
    assert pg.input_value("#f-name") == "kept across the login"
    assert pg.input_value(f"select[name='{ACTOR_ATTN}']") == "eager"
    expect(pg.locator("#preview tr[data-role='actor'] td.effective")).to_have_text("eager")
    context.close()
