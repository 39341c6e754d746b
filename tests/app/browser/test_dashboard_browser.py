"""The dashboard in real headless Chromium (Debian's), driven by Playwright, against uvicorn on loopback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlmodel import Session

from tests.app.pages_support import XSS_NAME, engine_events, stored_run

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parents[3]
SCREENSHOTS = ROOT / "tests" / "screenshots"
SEED_CRITIC_COMMAND = """python3 ppo_trainer.py \\
    actor_rollout_ref.model.override_config.attn_implementation=eager \\
    critic.model.override_config.attn_implementation=eager \\
    [other parameters...]"""
ACTOR_ATTN = "actor_rollout_ref.model.override_config.attn_implementation"
CRITIC_ATTN = "critic.model.override_config.attn_implementation"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """uvicorn serving the app on a fresh SQLite database; yields (base URL, database URL)."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing: run ./scripts/setup.sh --test (apt-get install chromium)")
    data = tmp_path_factory.mktemp("server")
    db_url = f"sqlite:///{data / 'attnboard.db'}"
    port = _free_port()
    env = {**os.environ, "ATTNBOARD_DATA_DIR": str(data), "ATTNBOARD_DATABASE_URL": db_url}
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "app.main:app", "--host", "127.0.0.1", "--port", str(port),
                             "--log-level", "warning"], cwd=ROOT, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(base + "/login", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"uvicorn did not start on {base} (exit code {proc.poll()})")
            time.sleep(0.3)
        yield base, db_url
    finally:
        proc.terminate()
        proc.wait(timeout=20)


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    playwright = pytest.importorskip("playwright.sync_api")
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM,
                              args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        yield b
        b.close()


@pytest.fixture
def page(browser, server):
    context = browser.new_context(viewport={"width": 1440, "height": 1000})
    pg = context.new_page()
    pg.dialogs = []  # type: ignore[attr-defined]
    pg.on("dialog", lambda d: (pg.dialogs.append(d.message), d.dismiss()))  # type: ignore[attr-defined]
    pg.console_errors = []  # type: ignore[attr-defined]
    pg.on("console", lambda m: m.type == "error" and pg.console_errors.append(m.text))  # type: ignore[attr-defined]
    yield pg
    context.close()


@pytest.fixture
def db(server) -> Iterator[Session]:
    from app.db import make_engine

    engine = make_engine(server[1])
    with Session(engine, expire_on_commit=False) as s:
        yield s
    engine.dispose()


def expect(locator):
    from playwright.sync_api import expect as playwright_expect

    return playwright_expect(locator)


def shot(page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


def preview_cell(page, role: str, cell: str) -> str:
    return page.locator(f"#preview tr[data-role='{role}'] td.{cell}").inner_text().strip()


def test_preview_follows_strategy_and_ulysses(page, server):
    base, _ = server
    page.goto(base + "/runs/new")
    page.select_option(f"select[name='{ACTOR_ATTN}']", "sdpa")
    page.fill("input[name='trainer.n_gpus_per_node']", "2")
    page.select_option("select[name='actor_rollout_ref.actor.strategy']", "fsdp_turbo")
    page.fill("input[name='actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size']", "2")
    expect(page.locator("#preview tr[data-role='actor'] td.effective")).to_have_text("eager")
    assert preview_cell(page, "actor", "status").endswith("forced")
    assert "forced-eager-fsdp-turbo-ulysses" in preview_cell(page, "actor", "reasons")
    shot(page, "form-forced-eager")
    page.select_option("select[name='actor_rollout_ref.actor.strategy']", "fsdp2")
    expect(page.locator("#preview tr[data-role='actor'] td.effective")).to_have_text("sdpa")
    assert preview_cell(page, "actor", "status").endswith("override")
    assert page.console_errors == []  # CSP violations are console errors


def test_import_seed_critic_command_fills_the_form(page, server):
    base, _ = server
    page.goto(base + "/runs/new")
    page.click("details.import summary")
    page.fill("#verl-text", SEED_CRITIC_COMMAND)
    page.click("#import-form button[type='submit']")
    page.wait_for_selector("#import-notes")
    assert page.input_value(f"select[name='{ACTOR_ATTN}']") == "eager"
    assert page.input_value(f"select[name='{CRITIC_ATTN}']") == "eager"
    expect(page.locator("#preview tr[data-role='critic'] td.effective")).to_have_text("eager")
    shot(page, "form")


def test_list_live_and_compare_pages(page, server, db):
    base, _ = server
    xss = stored_run(db, name=XSS_NAME, events=engine_events(steps=6))
    fell = stored_run(db, name="critic fell back to sdpa", events=engine_events("critic_fallback", steps=8),
                      **{"attnboard.fallback_policy": "fallback", "trainer.total_training_steps": 8})
    page.goto(base + "/")
    assert page.locator(f"tr[data-run='{xss}'] td.name a").inner_text() == XSS_NAME
    shot(page, "list")
    page.goto(f"{base}/runs/{fell}")
    expect(page.locator("#chart-reward")).to_have_attribute("data-points", "8")
    assert page.locator("#status").get_attribute("data-status") == "succeeded"
    assert page.locator("#progress-bar").get_attribute("value") == "100"
    assert page.locator("#attention tr[data-role='critic'] .badge").inner_text().endswith("fallback")
    assert page.locator("button", has_text="Retry with eager on the critic").count() == 1
    shot(page, "live")
    page.goto(f"{base}/compare?ids={xss},{fell}")
    expect(page.locator("#chart-reward-compare")).to_have_attribute("data-points", "8")
    shot(page, "compare")
    page.goto(f"{base}/runs/{xss}")
    assert page.locator("h1").inner_text().startswith(XSS_NAME)
    assert page.dialogs == []
    assert page.console_errors == []
