"""Runs and trials on one queue, in real headless Chromium against the served app on the embedded default
(``create_served_app`` under uvicorn, its own Ray head on loopback with 2 CPUs, 1 warm rank).

A run from the new-run form (2 CPU ranks) holds both CPUs; a trial of sdpa and eager started from the same
form then waits in the queue and its page says for what; once the run ends, the trial runs both
implementations as a job of the engine host, and its page reports tokens/s, peak memory and logit parity
for both and recommends one. The app's process never imported torch. The figures are printed (run with
``-s`` to read them).
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.app.browser.support import Server, expect, run_id_of, served
from tests.app.browser.test_dashboard_browser import _create_token, shot
from tests.app.test_trials import torch_in_process

pytestmark = [pytest.mark.browser, pytest.mark.ray]

RUN_STEPS = 12  # long enough that the trial is started while the run still holds both CPUs
TRIAL_STEPS = 3  # the form's default: the first step is warm-up, the other two give the mean and the spread
TIMEOUT_MS = 300_000


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The served app with 2 CPUs and 1 warm rank; at the end active trials are cancelled, then (``served``)
    active runs, the app stopped and its Ray head too."""
    data = tmp_path_factory.mktemp("trial-server")
    db_url = f"sqlite:///{data / 'attnboard.db'}"
    with served(data, [sys.executable, "-m", "uvicorn", "app.main:create_served_app", "--factory", "--host", "127.0.0.1",
                       "--log-level", "warning"], env={"ATTNBOARD_DATABASE_URL": db_url, "ATTNBOARD_WARM_RANKS": "1"}) as srv:
        srv.token = _create_token(db_url)
        try:
            yield srv
        finally:
            _cancel_trials(srv)


def _cancel_trials(srv: Server) -> None:
    if not srv.token:
        return
    try:
        for trial in srv.api("/api/trials?limit=100")["data"]:
            if trial["status"] in ("queued", "running"):
                httpx.post(f"{srv.base}/api/trials/{trial['id']}/cancel",
                           headers={"Authorization": f"Bearer {srv.token}"}, timeout=60)
    except httpx.HTTPError:
        pass


def trial_from_form(page, server: Server, *, implementations: list[str], name: str) -> int:
    """The new-run form's "Run an attention trial" with only ``implementations`` ticked -> the trial's id."""
    page.goto(server.base + "/runs/new")
    page.fill("#f-name", name)
    page.fill("#f-trial-steps", str(TRIAL_STEPS))
    for box in page.locator("input[name='trial_implementations']").all():
        box.set_checked(box.get_attribute("value") in implementations)
    page.wait_for_load_state("networkidle")
    page.click("#run-trial")
    page.wait_for_url(re.compile(r"/trials/\d+$"))
    match = re.search(r"/trials/(\d+)$", page.url)
    assert match, page.url
    return int(match.group(1))


def test_a_trial_waits_for_the_ranks_a_run_holds_then_measures_and_recommends(page, server):
    page.goto(server.base + "/runs/new")
    page.fill("#f-name", "holds both CPUs")
    page.fill("input[name='trainer.total_training_steps']", str(RUN_STEPS))
    assert page.input_value("input[name='trainer.n_gpus_per_node']") == "2"  # the form's default: 2 ranks
    page.wait_for_load_state("networkidle")
    page.click("#run-form button.primary")
    page.wait_for_url(re.compile(r"/runs/\d+$"))
    run_id = run_id_of(page)
    expect(page.locator("#status")).to_have_attribute("data-status", "running", timeout=TIMEOUT_MS)

    trial_id = trial_from_form(page, server, implementations=["sdpa", "eager"], name="sdpa vs eager")
    asked = time.monotonic()
    reason = page.locator("#result .trial-status-reason")
    expect(reason).to_have_text(re.compile(r"^waiting for 2 CPU \(0 free of 2\)$"), timeout=30_000)
    assert page.locator("#result").get_attribute("data-status") == "queued"
    assert server.api(f"/api/trials/{trial_id}")["status_reason"] == "waiting for 2 CPU (0 free of 2)"
    assert server.api(f"/api/runs/{run_id}")["status"] == "running"
    shot(page, "trial-waiting")

    expect(page.locator("#result")).to_have_attribute("data-status", "running", timeout=TIMEOUT_MS)
    waited = time.monotonic() - asked
    assert server.api(f"/api/runs/{run_id}")["status"] == "succeeded"  # it started once the run let go of its ranks
    expect(page.locator("#result")).to_have_attribute("data-status", "succeeded", timeout=TIMEOUT_MS)
    ran = time.monotonic() - asked - waited

    trial = server.api(f"/api/trials/{trial_id}")
    assert [(c["implementation"], c["status"], c["reason"]) for c in trial["result"]["columns"]] == [
        ("sdpa", "ok", ""), ("eager", "ok", "")], trial["status_reason"]
    table = page.locator("table.trial-columns")
    assert [h.get_attribute("data-impl") for h in table.locator("thead th[data-impl]").all()] == ["sdpa", "eager"]
    for i in range(2):
        assert float(table.locator("td.tokens-per-s").nth(i).inner_text()) > 0
        assert re.fullmatch(r"\d+ MB", table.locator("td.peak-memory").nth(i).inner_text().strip())
        assert "within tolerance" in table.locator("td.parity").nth(i).inner_text()
    recommended = page.locator("p.recommendation").get_attribute("data-recommended")
    assert recommended in ("sdpa", "eager")
    shot(page, "trial-done")

    assert trial["status_reason"] == "sdpa, eager completed"
    columns = {c["implementation"]: c for c in trial["result"]["columns"]}
    print(f"\ntrial {trial_id}: waited {waited:.1f} s for run {run_id}, then ran {ran:.1f} s; recommended {recommended}")
    for impl, c in columns.items():
        print(f"  {impl}: {c['tokens_per_s']:.0f} tokens/s, {c['step_time_s'] * 1000:.0f} ms/step, peak "
              f"{c['peak_memory_mb']:.0f} MB, max |logit - eager| {c['parity_max_abs_diff']:.2e} "
              f"(tolerance {trial['result']['tolerance']:.2e})")
    print(f"  recommendation: {trial['result']['recommendation']['reason']}")
    assert torch_in_process(server.pid) == []  # the web process never imported torch
    assert page.dialogs == [] and page.console_errors == []


def test_a_trial_is_cancelled_from_its_page(page, server):
    trial_id = trial_from_form(page, server, implementations=["eager"], name="cancel me")
    page.get_by_role("button", name="Cancel trial").click()
    page.wait_for_url(re.compile(rf"/trials/{trial_id}$"))
    expect(page.locator("#result")).to_have_attribute("data-status", "cancelled", timeout=60_000)
    trial = server.api(f"/api/trials/{trial_id}")
    assert trial["cancel_requested"] and trial["status"] == "cancelled"
    assert page.locator("#cancel-trial").count() == 0
