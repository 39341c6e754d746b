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



def test_docs_and_redoc_are_served_from_vendored_assets_without_a_cdn(client):
    """Issue 17 item 5: /docs and /redoc work offline: every script and stylesheet they name is ours and served."""
    import re

    for path, assets in (("/docs", ["/static/vendor/swagger-ui/swagger-ui-bundle.js", "/static/api-docs.js",
                                    "/static/vendor/swagger-ui/swagger-ui.css"]),
                         ("/redoc", ["/static/vendor/redoc/redoc.standalone.js"])):
        resp = client.get(path)
        assert resp.status_code == 200
        assert "script-src 'self';" in resp.headers["content-security-policy"]
        named = re.findall(r'(?:src|href)="([^"]+)"', resp.text)
        assert all(u.startswith("/") for u in named), named  # nothing from another host
        assert set(assets) <= set(named)
        for url in named:
            assert client.get(url).status_code == 200, url
    assert client.get("/openapi.json").json()["info"]["title"] == "attnboard"


def test_every_troubleshooting_category_has_words():
    from app.web import CATEGORY_WORDS, category_words
    from worker.troubleshoot.classify import Category

    assert set(CATEGORY_WORDS) == {c.value for c in Category}
    assert category_words("flash_attn_not_installed") == "flash-attn not installed"
    assert category_words("some_new_one") == "some new one"
