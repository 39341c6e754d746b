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


def test_a_logged_out_launch_signs_in_and_comes_back_to_the_same_filled_form(client, session):
    """Issue 17 item 1: the launch asks to sign in, the sign-in keeps the form, and the browser lands on the
    new-run page filled exactly as it was posted; the launch from there goes through."""
    from app.services.tokens import create_token

    page = client.get("/runs/new").text
    filled = form_data(page) | {"name": "kept across the login", "trainer.total_training_steps": "7"}
    asked = client.post("/runs", data=filled, follow_redirects=False)
    assert asked.status_code == 401 and soup(asked.text).select_one("input[name=draft]") is not None
    assert client.get("/api/runs").json()["total"] == 0  # nothing launched, nothing parsed
    _, token = create_token(session, name="browser", scopes=["read", "write"])
    login_form = {el["name"]: el.get("value", "") for el in soup(asked.text).select("form[action='/login'] input")}
    signed = client.post("/login", data=login_form | {"token": token}, follow_redirects=False)
    assert signed.status_code == 303 and signed.headers["location"].startswith("/runs/new?restore=1&")
    back = client.get(signed.headers["location"]).text
    again = form_data(back)
    assert {k: again.get(k) for k in filled if k != "csrf_token"} == {k: v for k, v in filled.items() if k != "csrf_token"}
    launched = client.post("/runs", data=again, follow_redirects=False)
    assert launched.status_code == 303 and launched.headers["location"].startswith("/runs/")


def test_logout_ends_the_session_server_side(client, session):
    login(client, session, ["read", "write"])
    cookie = client.cookies.get("attnboard_session")
    page = client.get("/runs/new").text
    assert client.post("/logout", data={"csrf_token": csrf_of(page)}, follow_redirects=False).status_code == 303
    client.cookies.set("attnboard_session", cookie)  # the old cookie, replayed
    replay = client.post("/runs", data=form_data(page), follow_redirects=False)
    assert replay.status_code == 401  # signed in no more: the login page again
    assert client.get("/api/runs").json()["total"] == 0


def test_preview_and_import_need_a_signed_in_user(client):
    page = client.get("/runs/new").text
    csrf = csrf_of(page)
    preview = client.post("/runs/preview", data=form_data(page), headers={"HX-Request": "true"})
    assert preview.status_code == 200 and "Sign in to see" in preview.text
    script = "X=aaaaaaaaaaaaaaaaaaaaaaaaaaaa!\n[[ $X =~ ^(a+)+$ ]] && python3 -m verl.trainer.main_ppo trainer.device=cpu"
    imported = client.post("/runs/import", data={"verl_text": script, "csrf_token": csrf}, headers={"HX-Request": "true"})
    assert imported.status_code == 401 and "sign in to import" in imported.text
    # the answer replaces the form area only: the import box, and the script typed in it, stay as they were
    fragment = soup(imported.text)
    assert fragment.select_one("#form-area") is not None and fragment.select_one("textarea[name=verl_text]") is None


def test_cookie_without_csrf_header_is_no_principal_for_the_api(client, session):
    login(client, session, ["read", "write"])
    resp = client.post("/api/runs", json={"spec": {}})
    assert resp.status_code == 401


def test_bad_token_login_is_refused(client):
    page = client.get("/login").text
    resp = client.post("/login", data={"token": "atb_nope", "csrf_token": csrf_of(page)})
    assert resp.status_code == 401
    assert soup(resp.text).select_one("#token-err").get_text() == "unknown or revoked token"



def test_the_session_cookie_is_secure_over_https(client, session):
    """Behind an https proxy (``attnboard serve --proxy-headers``) the scheme is https: the cookie gets Secure."""
    from app.services.tokens import create_token

    _, token = create_token(session, name="tls", scopes=["read"])
    page = client.get("https://testserver/login").text
    resp = client.post("https://testserver/login", data={"token": token, "csrf_token": csrf_of(page)},
                       follow_redirects=False)
    assert resp.status_code == 303
    cookie = next(c for c in resp.headers.get_list("set-cookie") if c.startswith("attnboard_session="))
    assert "Secure" in cookie and "HttpOnly" in cookie
    assert resp.headers["strict-transport-security"].startswith("max-age=")
