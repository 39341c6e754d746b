"""Fixtures of the browser tests: Debian's Chromium through Playwright, and a logged-in page on the module's
``server`` fixture (each module serves its own app: its own data directory, Ray head and settings)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    playwright = pytest.importorskip("playwright.sync_api")
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM,
                              args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        yield b
        b.close()


@pytest.fixture
def page(browser, server: Any) -> Iterator[Any]:
    """A fresh browser context, logged in with the module's write token."""
    context = browser.new_context(viewport={"width": 1440, "height": 1000})
    pg = context.new_page()
    pg.dialogs = []  # type: ignore[attr-defined]
    pg.on("dialog", lambda d: (pg.dialogs.append(d.message), d.dismiss()))  # type: ignore[attr-defined]
    pg.console_errors = []  # type: ignore[attr-defined]
    pg.on("console", lambda m: m.type == "error" and pg.console_errors.append(m.text))  # type: ignore[attr-defined]
    pg.goto(server.base + "/login")
    pg.fill("#token", server.token)
    pg.press("#token", "Enter")  # the keyboard submits the form
    pg.wait_for_url(server.base + "/")
    yield pg
    context.close()
