"""The edge of the app: Host checked against ATTNBOARD_ALLOWED_HOSTS (DNS rebinding), HSTS over https, NUL in
any query parameter refused with 422 (tables for the pure checks, then the real app)."""

from __future__ import annotations

import pytest

from app.middleware import HSTS, LOGIN_FAILURES, LOGIN_WINDOW_S, FailureWindow, host_allowed, nul_parameter
from tests.app.error_shape import assert_error_shape


@pytest.mark.parametrize("host,allowed,server,ok", [
    ("127.0.0.1:8000", ["localhost", "127.0.0.1"], None, True),
    ("LOCALHOST", ["localhost"], None, True),
    ("[::1]:8000", ["::1"], None, True),
    ("evil.example:8000", ["localhost", "127.0.0.1"], "127.0.0.1", False),  # a rebound domain
    ("10.0.0.5:8000", ["localhost"], "10.0.0.5", True),  # the address the connection reached
    ("a.example.com", ["*.example.com"], None, True),
    ("example.com.evil", ["*.example.com"], None, False),
    ("anything", ["*"], None, True),
    ("", ["localhost"], None, False),
])
def test_host_allowed(host, allowed, server, ok):
    assert host_allowed(host, allowed, server) is ok


@pytest.mark.parametrize("query,name", [
    (b"", None), (b"q=abc", None), (b"q=%00", "q"), (b"status=ok&q=a%00b", "q"), (b"a%00=1", "a\\0"),
    (b"q=%2500", None),  # an escaped percent sign, not a NUL
])
def test_nul_parameter(query, name):
    assert nul_parameter(query) == name


def test_a_foreign_host_gets_400_naming_it(make_client):
    client = make_client(ALLOWED_HOSTS="localhost,127.0.0.1")
    resp = client.get("/api/health", headers={"Host": "attacker.example"})
    assert resp.status_code == 400
    assert_error_shape(400, resp.json())
    assert resp.json()["error"]["field"] == "Host" and resp.json()["error"]["valid"] == ["localhost", "127.0.0.1"]
    assert client.get("/api/health", headers={"Host": "localhost:8000"}).status_code == 200


def test_hsts_only_over_https(client):
    assert client.get("https://testserver/api/health").headers["strict-transport-security"] == HSTS
    assert "strict-transport-security" not in client.get("/api/health").headers


@pytest.mark.parametrize("path", ["/?q=%00", "/?status=%00", "/api/runs?name=%00", "/api/specs?name=a%00",
                                  "/troubleshooting?q=%00"])
def test_nul_in_any_filter_is_422(client, path):
    resp = client.get(path)
    assert resp.status_code == 422 and resp.headers["content-type"].startswith("application/json")
    assert_error_shape(422, resp.json())


def test_failure_window():
    window = FailureWindow(limit=3, window_s=10.0, max_keys=2)
    for t in (0.0, 1.0, 2.0):
        assert window.retry_after("a", t) is None
        window.fail("a", t)
    assert window.retry_after("a", 3.0) == 7.0  # until the first failure leaves the window
    assert window.retry_after("b", 3.0) is None  # per client
    assert window.retry_after("a", 10.5) is None  # one left the window
    window.fail("b", 4.0)
    window.fail("c", 5.0)  # three keys: the least recent ("a") is dropped
    assert window.retry_after("a", 5.0) is None and set(window._failures) == {"b", "c"}


def test_failed_sign_ins_are_rate_limited(make_client):
    client = make_client()  # an app of its own: the window lives in its middleware
    from tests.app.pages_support import csrf_of

    csrf = csrf_of(client.get("/login").text)
    statuses = [client.post("/login", data={"token": f"atb_wrong{i}", "csrf_token": csrf}).status_code
                for i in range(LOGIN_FAILURES + 2)]
    assert statuses[:LOGIN_FAILURES] == [401] * LOGIN_FAILURES and statuses[LOGIN_FAILURES:] == [429, 429]
    refused = client.post("/login", data={"token": "atb_x", "csrf_token": csrf})
    assert 1 <= int(refused.headers["retry-after"]) <= LOGIN_WINDOW_S
    assert_error_shape(429, refused.json())


def test_docs_follow_the_read_rule(make_client, client, read_headers):
    for path in ("/docs", "/redoc", "/openapi.json"):
        assert client.get(path).status_code == 200, path  # reads open by default
    closed = make_client(REQUIRE_TOKEN_FOR_READS=True)
    for path in ("/docs", "/redoc", "/openapi.json"):
        resp = closed.get(path)
        assert resp.status_code == 401 and resp.json()["error"]["code"] == "unauthorized", path
        assert closed.get(path, headers=read_headers).status_code == 200, path
