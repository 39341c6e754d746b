"""The edge of the app: Host checked against ATTNBOARD_ALLOWED_HOSTS (DNS rebinding), HSTS over https, NUL in
any query parameter refused with 422 (tables for the pure checks, then the real app)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from app.middleware import HSTS, host_allowed, nul_parameter
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


def test_hsts_only_over_https(api):
    with TestClient(api, base_url="https://testserver") as secure:
        assert secure.get("/api/health").headers["strict-transport-security"] == HSTS
    with TestClient(api) as plain:
        assert "strict-transport-security" not in plain.get("/api/health").headers


@pytest.mark.parametrize("path", ["/?q=%00", "/?status=%00", "/api/runs?name=%00", "/api/specs?name=a%00",
                                  "/troubleshooting?q=%00"])
def test_nul_in_any_filter_is_422(client, path):
    resp = client.get(path)
    assert resp.status_code == 422 and resp.headers["content-type"].startswith("application/json")
    assert_error_shape(422, resp.json())
