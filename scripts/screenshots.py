"""Screenshots of every dashboard page at 1400 and 390 px wide, into docs/screenshots/ (run by
scripts/screenshots.sh; the tests never write docs/).

The app is served without Ray on a fresh data folder holding the events of real engine runs
(tests/fixtures/engine_events.json: a run that succeeded, one whose critic fell back, one that failed
under strict) and a finished attention trial, so every page has something to show and the pictures
do not change from one run of the script to the next.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import httpx
from sqlmodel import Session

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

OUT = ROOT / "docs" / "screenshots"
CHROMIUM = "/usr/bin/chromium"
WIDTHS = {"wide": 1400, "phone": 390}
VIEWPORT_ONLY = {"new-run"}
"""Pages shown as they look on a 900 px high screen (the form's action bar stays at its bottom), then whole."""


# The innermost elements that reach past the viewport's right edge (the page would scroll sideways),
# outside anything that scrolls on its own.
TOO_WIDE = """() => {
  const out = [];
  for (const el of document.querySelectorAll("body *")) {
    const r = el.getBoundingClientRect();
    if (r.right <= document.documentElement.clientWidth + 1 || r.width === 0) continue;
    let clipped = false;
    for (let p = el.parentElement; p; p = p.parentElement) {
      const o = getComputedStyle(p).overflowX;
      if (o === "auto" || o === "scroll" || o === "hidden") { clipped = true; break; }
    }
    const outside = [...el.children].some(c => c.getBoundingClientRect().right > document.documentElement.clientWidth + 1);
    if (clipped || outside) continue;
    const cls = typeof el.className === "string" && el.className.trim() ? "." + el.className.trim().split(/\\s+/).join(".") : "";
    out.push(el.tagName.toLowerCase() + (el.id ? "#" + el.id : "") + cls + " (" + Math.round(r.right) + " px)");
  }
  return out.slice(0, 8);
}"""


def seed(db_url: str) -> dict[str, object]:
    """Runs and their events (which make the troubleshooting entries), and a trial; -> the token and the ids to show."""
    from app.db import make_engine, run_migrations
    from app.models import Run
    from app.services.tokens import create_token
    from tests.app.factories import tiny_spec
    from tests.app.pages_support import engine_events, stored_run
    from tests.app.test_trials import stored_trial

    run_migrations(db_url)
    engine = make_engine(db_url)
    ids: dict[str, object] = {}
    with Session(engine) as session:
        _, ids["token"] = create_token(session, name="screenshots", scopes=["read", "write"])  # type: ignore[arg-type]
        for key, name, events, spec in (
            ("ok", "tiny sdpa", engine_events("succeeded", steps=12), {"trainer.total_training_steps": 12}),
            ("fallback", "critic asks for flash_attention_2 on CPU", engine_events("critic_fallback", steps=12),
             {"critic.model.override_config.attn_implementation": "flash_attention_2",
              "attnboard.fallback_policy": "fallback", "trainer.total_training_steps": 12}),
            ("strict", "strict flash_attention_2 on CPU", engine_events("critic_strict"),
             {"critic.model.override_config.attn_implementation": "flash_attention_2"}),
        ):
            ids[key] = run_id = stored_run(session, name=name, events=events, **{**tiny_spec(), **spec})
            run = session.get(Run, run_id)  # the times a real run of this size takes on a CPU
            run.started_at = run.created_at + timedelta(seconds=1)
            run.finished_at = run.started_at + timedelta(seconds=2 + 3 * len(events) // 4)
            session.add(run)
            session.commit()
        ids["trial"] = stored_trial(session, name="sdpa or eager on the tiny model",
                                    times={"sdpa": 0.42, "eager": 0.61}).id
    engine.dispose()
    return ids


def main(only: list[str]) -> int:
    """``only``: page names to take (all when empty), e.g. ``new-run run``."""
    from playwright.sync_api import sync_playwright

    from app.services.ray_runtime import free_port

    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        db_url = f"sqlite:///{tmp}/attnboard.db"
        ids = seed(db_url)
        port = free_port()
        env = {**os.environ, "ATTNBOARD_DATA_DIR": tmp, "ATTNBOARD_DATABASE_URL": db_url}
        server = subprocess.Popen([sys.executable, "-m", "uvicorn", "app.main:create_app", "--factory", "--host",
                                   "127.0.0.1", "--port", str(port), "--log-level", "warning"], cwd=ROOT, env=env)
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if httpx.get(base + "/login", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if server.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"the app did not start on {base}")
                time.sleep(0.3)
            pages = {
                "login": "/login",
                "runs": "/",
                "new-run": "/runs/new",
                "run": f"/runs/{ids['ok']}",
                "run-fallback": f"/runs/{ids['fallback']}",
                "run-failed": f"/runs/{ids['strict']}",
                "compare": f"/compare?ids={ids['ok']},{ids['fallback']}",
                "trials": "/trials",
                "trial": f"/trials/{ids['trial']}",
                "troubleshooting": "/troubleshooting",
            }
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=[
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
                for label, width in WIDTHS.items():
                    context = browser.new_context(viewport={"width": width, "height": 900})
                    page = context.new_page()
                    page.goto(base + "/login")
                    page.screenshot(path=str(OUT / f"login-{label}.png"), full_page=True)
                    page.fill("#token", str(ids["token"]))
                    page.press("#token", "Enter")
                    page.wait_for_url(base + "/")
                    for name, path in pages.items():
                        if name == "login" or (only and name not in only):
                            continue
                        page.goto(base + path)
                        page.wait_for_load_state("networkidle")
                        for wide in page.evaluate(TOO_WIDE):
                            print(f"warning: {name} at {width} px: {wide} reaches past the right edge")
                        page.screenshot(path=str(OUT / f"{name}-{label}.png"), full_page=name not in VIEWPORT_ONLY)
                        print(f"docs/screenshots/{name}-{label}.png")
                        if name in VIEWPORT_ONLY:  # and the whole page below what is on screen
                            page.screenshot(path=str(OUT / f"{name}-{label}-full.png"), full_page=True)
                    context.close()
                browser.close()
        finally:
            server.terminate()
            server.wait(timeout=30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
