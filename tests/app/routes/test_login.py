"""Logging in and out, the session cookie and the CSRF token every browser POST carries."""

from __future__ import annotations

import pytest

from tests.app.pages_support import (
    csrf_of,
    form_data,
    login,
    soup,
)

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def test_post_without_csrf_token_is_refused(client):
    resp = client.post("/runs/preview", data={"env": "cpu"}, headers={"Accept": "text/html"})
    assert resp.status_code == 403
    assert "CSRF token" in soup(resp.text).select_one(".error-message").get_text()


def test_session_cookie_flags_and_write_launches(client, session):
    _, = [None]
    csrf = login(client, session, ["read", "write"])
    cookie = next(c for c in client.cookies.jar if c.name == "attnboard_session")
    assert cookie.has_nonstandard_attr("HttpOnly")
    page = client.get("/runs/new").text
    resp = client.post("/runs", data=form_data(page) | {"name": "from the form"}, follow_redirects=False)
    assert resp.status_code == 303
    run_page = client.get(resp.headers["location"])
    assert soup(run_page.text).select_one("h1").get_text(" ", strip=True).startswith("from the form")
    assert csrf


def test_anonymous_launch_goes_to_login(client):
    page = client.get("/runs/new").text
    resp = client.post("/runs", data=form_data(page), follow_redirects=False)
    assert resp.status_code == 303 and resp.headers["location"].startswith("/login")


def test_cookie_without_csrf_header_is_no_principal_for_the_api(client, session):
    login(client, session, ["read", "write"])
    resp = client.post("/api/runs", json={"spec": {}})
    assert resp.status_code == 401


def test_bad_token_login_is_refused(client):
    page = client.get("/login").text
    resp = client.post("/login", data={"token": "atb_nope", "csrf_token": csrf_of(page)})
    assert resp.status_code == 401
    assert soup(resp.text).select_one("#token-err").get_text() == "unknown or revoked token"

