"""The one error handler (``app.errors.render_error``): JSON for the API and for clients that do not ask for
HTML, the error page for a browser, only its ``error`` block for htmx; an anonymous page that needs a
principal goes to /login."""

from __future__ import annotations

import pytest

from tests.app.pages_support import soup

HTML = {"Accept": "text/html"}
HTMX = {"HX-Request": "true"}


@pytest.mark.parametrize("url", ["/runs/999999", "/no/such/page", "/runs/not-a-number"])
@pytest.mark.parametrize("headers,kind", [({}, "json"), (HTML, "page"), (HTMX, "fragment"),
                                          ({**HTML, **HTMX}, "fragment")])
def test_browser_gets_a_page_or_fragment_and_everyone_else_json(client, url, headers, kind):
    resp = client.get(url, headers=headers)
    assert resp.status_code in (404, 422), url
    if kind == "json":
        assert resp.headers["content-type"].startswith("application/json")
        error = resp.json()["error"]
        assert error["code"] in ("not_found", "invalid_request") and error["field"]
        return
    assert resp.headers["content-type"].startswith("text/html")
    page = soup(resp.text)
    section = page.select_one("section#error")
    assert section is not None
    assert str(resp.status_code) in section.select_one("h1").get_text()
    assert section.select_one(".error-message").get_text(strip=True)
    assert bool(page.select("header, nav")) == (kind == "page")
    assert resp.headers["content-security-policy"]


@pytest.mark.parametrize("headers", [{}, HTML, HTMX])
def test_the_api_always_answers_json(client, headers):
    resp = client.get("/api/runs/999999", headers=headers)
    assert resp.status_code == 404
    assert resp.headers["content-type"].startswith("application/json")
    assert resp.json()["error"]["code"] == "not_found" and resp.json()["error"]["value"] == 999999


def test_a_page_that_needs_a_principal_sends_the_browser_to_login(make_client):
    resp = make_client(REQUIRE_TOKEN_FOR_READS=True).get("/runs/new", headers=HTML, follow_redirects=False)
    assert resp.status_code == 303
    assert resp.headers["location"] == "/login?next=/runs/new"
