"""What every page shares (``app.web``): the CSP, local static assets, user text rendered as text."""

from __future__ import annotations

import pytest

from app.web import CONTENT_SECURITY_POLICY
from tests.app.pages_support import (
    XSS_NAME,
    engine_events,
    soup,
    stored_run,
)

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def test_every_page_has_the_csp_and_no_inline_script(client, session):
    run_id = stored_run(session, name="x", events=engine_events())
    for url in ("/", "/runs/new", "/login", f"/runs/{run_id}", f"/compare?ids={run_id}"):
        resp = client.get(url)
        assert resp.status_code == 200, url
        assert resp.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
        for script in soup(resp.text).select("script"):
            assert script.get("src", "").startswith("/static/") or script.get("type") == "application/json", url
        assert not soup(resp.text).select("[style]"), f"inline style on {url}"


def test_static_assets_are_served_locally(client):
    for path in ("/static/vendor/htmx.min.js", "/static/vendor/htmx-ext-sse.min.js", "/static/vendor/uPlot.iife.min.js",
                 "/static/app.js", "/static/app.css"):
        assert client.get(path).status_code == 200, path


def test_xss_run_name_renders_as_text(client, session):
    run_id = stored_run(session, name=XSS_NAME, events=engine_events())
    for url in ("/", f"/runs/{run_id}", f"/compare?ids={run_id}"):
        page = soup(client.get(url).text)
        assert not page.select("img[onerror]"), url
        assert all(s.get("src") or s.get("type") == "application/json" for s in page.select("script")), url
        assert all("<" not in (s.string or "") for s in page.select("script[type='application/json']")), url
        assert XSS_NAME in page.get_text(), url

