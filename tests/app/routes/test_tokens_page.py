"""The tokens page: an admin browser lists, mints (the secret shown once) and revokes tokens; others cannot."""

from __future__ import annotations

import pytest

from app.services.tokens import authenticate_token
from tests.app.pages_support import csrf_of, login, soup

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def test_an_admin_mints_and_revokes_tokens_in_the_browser(client, session):
    csrf = login(client, session, ["admin", "read", "write"])
    page = client.get("/tokens")
    assert page.status_code == 200 and soup(page.text).select_one("a[href='/tokens']") is not None
    made = client.post("/tokens", data={"name": "nightly-ci", "scope": "read", "csrf_token": csrf})
    assert made.status_code == 201
    secret = soup(made.text).select_one("#new-token").get_text()
    row = authenticate_token(session, token=secret)
    assert row is not None and row.scopes == ["read"] and row.name == "nightly-ci"
    assert secret not in client.get("/tokens").text  # shown once
    revoked = client.post(f"/tokens/{row.id}/revoke", data={"csrf_token": csrf}, follow_redirects=False)
    assert revoked.status_code == 303
    session.expire_all()
    assert authenticate_token(session, token=secret) is None


@pytest.mark.parametrize("scopes,status", [(None, 303), (["read", "write"], 403)])
def test_others_cannot_see_the_tokens_page(client, session, scopes, status):
    if scopes:
        login(client, session, scopes)
    resp = client.get("/tokens", follow_redirects=False, headers={"Accept": "text/html"})
    assert resp.status_code == status
    if status == 303:
        assert resp.headers["location"].startswith("/login")


def test_a_bad_scope_is_named(client, session):
    csrf = login(client, session, ["admin", "read", "write"])
    resp = client.post("/tokens", data={"name": "x", "scope": "root", "csrf_token": csrf}, headers={"Accept": "text/html"})
    assert resp.status_code == 422 and "scope" in resp.text
    assert csrf_of(client.get("/tokens").text)
