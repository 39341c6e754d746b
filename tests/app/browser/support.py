"""What the browser suites share: the served app on a fresh data folder (its embedded Ray head on loopback,
real runs on the tiny CPU preset), Debian's chromium under Playwright, and the helpers that wait on it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlmodel import Session

from app.services.ray_runtime import HEAD_RECORD, HeadRecord, free_port, pid_alive, stop_head
from tests.app.service_support import ray_env

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
ROOT = Path(__file__).resolve().parents[3]
ACTIVE = ("queued", "starting", "running")
RUN_TIMEOUT_MS = 150_000
SCREENSHOTS = ROOT / "tests" / "screenshots"
START_TIMEOUT_S = 120
START_ATTEMPTS = 3


class Server:
    def __init__(self, base: str, db_url: str, data: Path):
        self.base, self.db_url, self.data = base, db_url, data
        self.token = ""
        self.pid = 0  # the serving process
        self.runs: dict[str, int] = {}  # what the tests launched, by purpose

    def api(self, path: str) -> Any:
        resp = httpx.get(self.base + path, headers={"Authorization": f"Bearer {self.token}"}, timeout=30)
        resp.raise_for_status()
        return resp.json()


@contextmanager
def served(data: Path, command: Sequence[str], env: dict[str, str] | None = None) -> Iterator[Server]:
    """``command`` (given ``--port PORT`` at its end) serving the app on ``data`` until the block ends; then
    every run still active is cancelled, the server stopped, and the embedded Ray head stopped if still up."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing: run ./scripts/setup.sh --test (apt-get install chromium)")
    env = {**ray_env(None), "ATTNBOARD_DATA_DIR": str(data), "ATTNBOARD_RAY_NUM_CPUS": "2", **(env or {})}
    db_url = env.get("ATTNBOARD_DATABASE_URL") or f"sqlite:///{data / 'attnboard.db'}"
    exits: list[int] = []
    try:
        while True:
            # The app starts its Ray head before it binds, and the head's processes take ports at random: one may
            # take the port chosen here ("address already in use", exit code 3). Such a start is tried again on
            # another port, twice at most; a server that never starts still fails, naming every exit code.
            port = free_port()
            proc = subprocess.Popen([*command, "--port", str(port)], cwd=ROOT, env=env)
            srv = Server(f"http://127.0.0.1:{port}", db_url, data)
            srv.pid = proc.pid
            if _answers(srv, proc):
                break
            if proc.poll() is None:
                proc.kill()
            exits.append(proc.wait(timeout=10))
            if len(exits) == START_ATTEMPTS:
                raise RuntimeError(f"the app did not start on {srv.base} (exit codes of {START_ATTEMPTS} tries: {exits})")
        yield srv
    finally:
        cancel_active(srv)
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        record = HeadRecord.load(data / HEAD_RECORD)
        if record is not None and pid_alive(record.pid):
            stop_head(record.pid)


ATTNBOARD = str(Path(sys.executable).with_name("attnboard"))


@contextmanager
def served_as_readme_says(data: Path, token_name: str) -> Iterator[Server]:
    """``attnboard serve`` on a fresh data folder and nothing else (SQLite there, the embedded Ray head), with a
    write token from ``attnboard token create``, as the README says."""
    with served(data, [ATTNBOARD, "serve", "--host", "127.0.0.1"]) as srv:
        made = subprocess.run([ATTNBOARD, "token", "create", token_name, "--scope", "write", "--json"], cwd=ROOT,
                              env={**ray_env(None), "ATTNBOARD_DATA_DIR": str(data)}, capture_output=True, text=True,
                              check=True)
        srv.token = json.loads(made.stdout)["token"]
        yield srv


def create_token(db_url: str) -> str:
    """A read and write API token in the database at ``db_url``."""
    from app.db import make_engine
    from app.services.tokens import create_token as create

    engine = make_engine(db_url)
    try:
        with Session(engine) as session:
            _, token = create(session, name="browser", scopes=["read", "write"])  # type: ignore[arg-type]
    finally:
        engine.dispose()
    return token


def _answers(srv: Server, proc: subprocess.Popen) -> bool:
    """Whether the server answers on its port within ``START_TIMEOUT_S`` (False at once when it exits)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            if httpx.get(srv.base + "/login", timeout=2).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    return False


def cancel_active(srv: Server) -> None:
    """Cancel the trials and runs still active and wait for the runs to end, so the app stops its Ray head on
    shutdown."""
    if not srv.token:
        return
    headers = {"Authorization": f"Bearer {srv.token}"}
    try:
        for trial in srv.api("/api/trials?limit=100")["data"]:
            if trial["status"] in ("queued", "running"):
                httpx.post(f"{srv.base}/api/trials/{trial['id']}/cancel", headers=headers, timeout=60)
        active = [r["id"] for r in srv.api("/api/runs?limit=100")["data"] if r["status"] in ACTIVE]
        for run_id in active:
            httpx.post(f"{srv.base}/api/runs/{run_id}/cancel", headers=headers, timeout=30)
        deadline = time.monotonic() + 60
        while active and time.monotonic() < deadline:
            active = [i for i in active if srv.api(f"/api/runs/{i}")["status"] in ACTIVE]
            time.sleep(0.5)
    except httpx.HTTPError:
        pass  # the server is gone already: the head record below is the last resort


@contextmanager
def chromium() -> Iterator[Any]:
    playwright = pytest.importorskip("playwright.sync_api")
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


def shot(page, name: str) -> None:
    """A full-page screenshot of ``page`` as tests/screenshots/NAME.png."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


def expect(locator):
    from playwright.sync_api import expect as playwright_expect

    return playwright_expect(locator)


def run_id_of(page) -> int:
    match = re.search(r"/runs/(\d+)$", page.url)
    assert match, page.url
    return int(match.group(1))


def reveal(page, key: str) -> None:
    """Open the fold of the run form that holds the input named ``key`` (a click on its summary)."""
    fold = page.locator(f"details.fold:has([name='{key}'])")
    if fold.count() and fold.get_attribute("open") is None:
        fold.locator("summary").click()
