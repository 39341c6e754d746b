"""The user's journeys of issue 17, walked in Debian's chromium as a newcomer would, against a real
``attnboard serve`` on the embedded default (SQLite in its data folder, the local Ray head it starts), with
a token made by ``attnboard token create`` as the README says. Each test asserts what the user sees.

(a) first visit -> sign in -> launch -> live page -> finished; then edit and relaunch it with eager on the
    critic; (d) an attention trial from the form -> its recommendation; (e) compare the two runs.
Real runs, in file order: two tiny CPU runs and one trial.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from tests.app.browser.support import RUN_TIMEOUT_MS, Server, expect, reveal, run_id_of, served_as_readme_says

pytestmark = [pytest.mark.browser, pytest.mark.ray]

CRITIC_ATTN = "critic.model.override_config.attn_implementation"
STEPS = 2
TRIAL_TIMEOUT_MS = 240_000


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """``attnboard serve`` on a fresh data folder and nothing else: its defaults put SQLite there and start Ray."""
    data = tmp_path_factory.mktemp("journeys")
    with served_as_readme_says(data, "newcomer") as srv:
        yield srv


@pytest.fixture(scope="module")
def page(browser, server: Server):
    """One newcomer's browser for the whole file (the session cookie carries over between journeys)."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    pg = context.new_page()
    pg.console_errors = []  # type: ignore[attr-defined]
    pg.on("console", lambda m: m.type == "error" and pg.console_errors.append(m.text))  # type: ignore[attr-defined]
    yield pg
    context.close()


def sign_in(page, server: Server) -> None:
    """As the README says: the token from ``attnboard token create`` on the login page."""
    page.get_by_role("link", name="Log in").click()
    page.fill("#token", server.token)
    page.get_by_role("button", name=re.compile("Log in|Sign in", re.I)).click()
    page.wait_for_url(server.base + "/")
    expect(page.locator(".who")).to_contain_text("newcomer")


def signed_in(page, server: Server) -> None:
    """A journey run on its own starts signed out: sign in first."""
    page.goto(server.base + "/")
    if page.get_by_role("link", name="Log in").count():
        sign_in(page, server)


def test_a_first_visit_sign_in_launch_watch_it_finish(page, server):
    page.goto(server.base + "/")
    expect(page.locator("#runs")).to_contain_text("No runs yet")
    sign_in(page, server)

    page.get_by_role("navigation", name="Main").get_by_role("link", name="New run").click()
    expect(page.locator("#preview tr[data-role='critic'] td.effective")).to_have_text("sdpa")
    page.fill("#f-name", "my first run")
    page.fill("input[name='trainer.total_training_steps']", str(STEPS))
    launch = page.locator("#action-bar").get_by_role("button", name="Launch")
    expect(launch).to_be_in_viewport()  # no scrolling needed to find it
    page.wait_for_load_state("networkidle")
    launch.click()
    page.wait_for_url(re.compile(r"/runs/\d+$"))
    server.runs["first"] = run_id_of(page)

    expect(page.locator("h1")).to_contain_text("my first run")
    expect(page.locator("#status")).to_have_attribute("data-status", "succeeded", timeout=RUN_TIMEOUT_MS)
    expect(page.locator("#status")).to_contain_text("succeeded")
    expect(page.locator("#status label")).to_contain_text(f"step {STEPS} of {STEPS}")
    critic = page.locator("#attention tr[data-role='critic'][data-rank='0']")
    expect(critic.locator("td.effective")).to_have_text("sdpa → sdpa")
    expect(critic.locator(".badge")).to_have_text(re.compile("as asked$"))
    expect(page.locator("#logs li.kind-step")).to_have_count(STEPS)
    expect(page.locator("#logs li.kind-step").last).to_contain_text(f"step {STEPS} of {STEPS}: reward")
    page.reload()  # what a later visit shows: the times, and the spec with what differs from verl's first
    expect(page.locator("#duration")).not_to_have_text("—")
    expect(page.locator("#spec tr[data-key='trainer.total_training_steps']")).to_contain_text(str(STEPS))
    assert page.console_errors == []


def test_a_edit_and_relaunch_with_eager_on_the_critic(page, server):
    first = server.runs.get("first")
    if first is None:
        pytest.skip("the first run did not start")
    page.goto(f"{server.base}/runs/{first}")
    page.get_by_role("link", name="Edit and relaunch").click()
    expect(page.locator("#f-name")).to_have_value("my first run")
    expect(page.locator("input[name='trainer.total_training_steps']")).to_have_value(str(STEPS))
    page.fill("#f-name", "eager critic")
    page.select_option(f"select[name='{CRITIC_ATTN}']", "eager")
    expect(page.locator("#preview tr[data-role='critic'] td.effective")).to_have_text("eager")
    page.wait_for_load_state("networkidle")
    page.locator("#action-bar").get_by_role("button", name="Launch").click()
    page.wait_for_url(re.compile(r"/runs/\d+$"))
    server.runs["eager"] = run_id_of(page)
    expect(page.locator("#status")).to_have_attribute("data-status", "succeeded", timeout=RUN_TIMEOUT_MS)
    expect(page.locator("#attention tr[data-role='critic'][data-rank='0'] td.effective")).to_have_text("eager → eager")


def test_d_an_attention_trial_ends_with_a_recommendation(page, server):
    signed_in(page, server)
    page.goto(server.base + "/runs/new")
    reveal(page, "data.max_response_length")
    page.fill("input[name='data.max_response_length']", "8")
    # The preset's 2 ranks on the embedded default's 2 CPUs, one of them held by the warm rank: the trial
    # takes the warm rank from the pool (it once failed: "Total available CPUs 1 is less than total desired
    # CPUs 2").
    assert page.input_value("input[name='trainer.n_gpus_per_node']") == "2"
    page.fill("#f-trial-steps", "1")
    page.wait_for_load_state("networkidle")
    page.get_by_role("button", name="Run an attention trial").click()
    page.wait_for_url(re.compile(r"/trials/\d+$"))
    recommendation = page.locator(".recommendation")
    expect(recommendation).to_contain_text("Recommendation:", timeout=TRIAL_TIMEOUT_MS)
    assert recommendation.get_attribute("data-recommended") in ("sdpa", "eager"), \
        recommendation.inner_text() + page.locator("table.trial-columns").inner_text()  # flash-attn cannot load on CPU
    expect(page.locator("table.trial-columns")).to_contain_text("flash_attention_2")
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Trials").click()
    expect(page.locator("tr[data-trial]")).to_have_count(1)


def test_e_compare_the_two_runs(page, server):
    first, eager = server.runs.get("first"), server.runs.get("eager")
    if first is None or eager is None:
        pytest.skip("the two runs did not both start")
    signed_in(page, server)
    for run_id in (first, eager):
        page.check(f"tr[data-run='{run_id}'] input[name='ids']")
    page.get_by_role("button", name="Compare selected").click()
    page.wait_for_url(re.compile(r"/compare\?"))
    rows = page.locator("table.compare tbody tr")
    expect(rows).to_have_count(2)
    assert {rows.nth(i).get_attribute("data-run") for i in range(2)} == {str(first), str(eager)}
    expect(page.locator("table.diffs")).to_contain_text(CRITIC_ATTN)
    expect(page.locator("#chart-reward-compare")).to_have_attribute("data-points", str(STEPS))
    tokens = page.locator("figure.chart[data-metric='perf/tokens_per_s']")
    expect(tokens).to_have_attribute("data-points", str(STEPS))
    legend = tokens.locator(".u-legend")
    expect(legend).to_contain_text("my first run")
    expect(legend).to_contain_text("eager critic")
    assert page.console_errors == []


def test_every_page_fits_a_phone(page, server):
    """At 390 px no page scrolls sideways (wide tables scroll inside themselves) and Launch stays on screen."""
    signed_in(page, server)
    page.set_viewport_size({"width": 390, "height": 844})
    ids = ",".join(str(i) for i in server.runs.values())
    paths = ["/", "/runs/new", "/compare" + (f"?ids={ids}" if ids else ""), "/trials", "/troubleshooting",
             *(f"/runs/{i}" for i in server.runs.values())]
    for path in paths:
        page.goto(server.base + path)
        page.wait_for_load_state("networkidle")
        widths = page.evaluate("[document.documentElement.scrollWidth, document.documentElement.clientWidth]")
        assert widths[0] <= widths[1], f"{path} is {widths[0]} px wide on a {widths[1]} px screen"
    if server.runs:  # the runs list is a card per run: nothing in it scrolls sideways, each cell names its column
        # (its header row stays for screen readers, visually hidden)
        page.goto(server.base + "/")
        table = page.locator("table.runs")
        assert table.evaluate("t => t.scrollWidth <= t.clientWidth"), "the runs list scrolls sideways on a phone"
        cells = page.locator("table.runs tbody tr").first.locator("td")
        labels = cells.evaluate_all("tds => tds.map(td => getComputedStyle(td, '::before').content)")
        assert labels == ['"compare"', '"#"', '"name"', '"status"', '"progress"', '"attention"', '"created"',
                          '"links"'], labels
        past = page.evaluate("""() => Array.from(document.querySelectorAll('table.runs caption, table.runs tbody *'))
            .filter(e => e.getBoundingClientRect().right > document.documentElement.clientWidth + 0.5)
            .map(e => e.tagName + '.' + e.className)""")
        assert past == [], f"reaches past the right edge of the runs list at 390 px: {past}"
    page.goto(server.base + "/runs/new")
    expect(page.locator("#action-bar").get_by_role("button", name="Launch")).to_be_in_viewport()
    page.set_viewport_size({"width": 1400, "height": 900})
