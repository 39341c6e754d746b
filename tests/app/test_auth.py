"""Tokens and permissions. The meta-test enumerates the OpenAPI schema: every non-GET route answers
401 with a JSON error without a token, whatever it is, so a new route cannot forget auth."""

from __future__ import annotations

import hashlib
import re

import pytest
from sqlmodel import select

from app.models import ApiToken
from app.services.tokens import create_token
from tests.app.factories import make_run, tiny_spec

OPEN_READS = {"/api/health"}  # answered even when reads need a token (load balancers, compose)
ADMIN_READS = {"/api/tokens"}  # listing tokens always needs the admin scope
ENGINE_ONLY = {"/api/runs/{run_id}/events"}  # only the engine posts a run's events (its ingest credential)


def _routes(client, methods: set[str]) -> list[tuple[str, str]]:
    """(METHOD, path) of every API operation; long-poll routes get ``?timeout=0`` so they answer at once."""
    schema = client.app.openapi()
    out = []
    for path, ops in schema["paths"].items():
        for method, op in ops.items():
            if method.upper() not in methods or not path.startswith("/api/"):
                continue
            query = {p["name"] for p in op.get("parameters", []) if p.get("in") == "query"}
            out.append((method.upper(), path + ("?timeout=0" if "timeout" in query else "")))
    return out


def _fill(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "1", path)


def test_every_mutating_route_requires_a_token(client, write_headers):
    make_run(client, write_headers)  # so /{run_id} paths name an existing run
    routes = _routes(client, {"POST", "PUT", "PATCH", "DELETE"})
    assert len(routes) >= 10
    for method, path in routes:
        resp = client.request(method, _fill(path), json={})
        if path in ENGINE_ONLY:
            assert resp.status_code == 403 and resp.json()["error"]["code"] == "engine_only", (method, path, resp.text)
            assert client.request(method, _fill(path), json=[], headers=write_headers).status_code == 403
            continue
        assert resp.status_code == 401, (method, path, resp.text)
        assert resp.headers["www-authenticate"] == "Bearer"
        assert resp.json()["error"]["code"] == "unauthorized", (method, path)


def test_a_read_token_cannot_write(client, read_headers):
    for method, path in _routes(client, {"POST", "PUT", "PATCH", "DELETE"}):
        if path in ("/api/resolve", "/api/import", "/api/preflight"):
            continue  # compute-only: the read scope suffices
        resp = client.request(method, _fill(path), json={}, headers=read_headers)
        assert resp.status_code == 403, (method, path, resp.text)
        if path in ENGINE_ONLY:
            continue
        scope = "admin" if path.startswith("/api/tokens") else "write"
        assert resp.json()["error"]["message"] == f"token 'test-read' lacks the {scope} scope"


def test_reads_are_open_by_default_and_closed_by_the_setting(client, make_client, write_headers, read_headers):
    spec = client.post("/api/specs", json={"name": "s", "spec": tiny_spec()}, headers=write_headers).json()
    client.post("/api/runs", json={"spec_id": spec["id"]}, headers=write_headers)
    reads = [(m, p) for m, p in _routes(client, {"GET"}) if p not in OPEN_READS | ADMIN_READS]
    assert len(reads) >= 6
    for _, path in reads:
        assert client.get(_fill(path)).status_code != 401, path
    closed = make_client(REQUIRE_TOKEN_FOR_READS=True)
    for _, path in reads:
        resp = closed.get(_fill(path))
        assert resp.status_code == 401 and resp.json()["error"]["code"] == "unauthorized", path
        # with a read token auth passes (the resource itself may not exist: 404 is fine)
        assert closed.get(_fill(path), headers=read_headers).status_code in (200, 404), path
    assert closed.get("/api/health").status_code == 200
    assert client.get("/api/tokens").status_code == 401
    assert client.get("/api/tokens", headers=read_headers).status_code == 403


@pytest.mark.parametrize("header,message", [
    ("Bearer atb_not-a-real-token", "unknown or revoked token"),
    ("Bearer nonsense", "unknown or revoked token"),
    ("Basic dXNlcjpwYXNz", "the Authorization header must be 'Bearer <token>'"),
    ("Bearer ", "the Authorization header must be 'Bearer <token>'"),
])
def test_bad_tokens_are_401_even_on_open_reads(client, header, message):
    resp = client.get("/api/runs", headers={"Authorization": header})
    assert resp.status_code == 401
    assert resp.json()["error"]["message"].startswith(message)


def test_only_an_admin_token_mints_or_revokes_tokens(client, session, write_headers, admin_headers):
    row, _ = create_token(session, name="other", scopes=["read", "write"])
    for method, path in [("POST", "/api/tokens"), ("GET", "/api/tokens"), ("POST", f"/api/tokens/{row.id}/revoke")]:
        resp = client.request(method, path, json={"name": "mine", "scopes": ["read", "write", "admin"]},
                              headers=write_headers)
        assert resp.status_code == 403 and resp.json()["error"]["valid"] == ["admin"], (method, path, resp.text)
    session.refresh(row)
    assert not row.revoked
    assert client.post("/api/tokens", json={"name": "ci", "scopes": ["read"]}, headers=admin_headers).status_code == 201


def test_tokens_are_hashed_at_rest_and_shown_once(client, session, admin_headers):
    resp = client.post("/api/tokens", json={"name": "ci", "scopes": ["read"]}, headers=admin_headers)
    assert resp.status_code == 201
    body = resp.json()
    plaintext = body["token"]
    assert plaintext.startswith("atb_") and len(plaintext) >= 40 and body["prefix"] == plaintext[:10]
    row = session.exec(select(ApiToken).where(ApiToken.name == "ci")).one()
    assert row.token_hash == hashlib.sha256(plaintext.encode()).hexdigest()
    assert plaintext not in str(row.model_dump())
    listed = client.get("/api/tokens", headers=admin_headers).json()
    assert all("token" not in t for t in listed) and {t["name"] for t in listed} >= {"ci"}
    # the new token reads, and last_used_at is recorded
    assert client.get("/api/runs", headers={"Authorization": f"Bearer {plaintext}"}).status_code == 200
    session.refresh(row)
    assert row.last_used_at is not None


def test_revoked_tokens_stop_working(client, session, admin_headers):
    row, plaintext = create_token(session, name="temp", scopes=["read", "write"])
    headers = {"Authorization": f"Bearer {plaintext}"}
    assert client.post("/api/specs", json={"name": "s", "spec": tiny_spec()}, headers=headers).status_code == 201
    assert client.post(f"/api/tokens/{row.id}/revoke", headers=admin_headers).json()["revoked"] is True
    resp = client.post("/api/specs", json={"name": "s", "spec": tiny_spec()}, headers=headers)
    assert resp.status_code == 401 and resp.json()["error"]["message"] == "unknown or revoked token"


def test_the_dashboard_can_add_an_authenticator(client, api):
    """app.state.authenticators is the extension point for browser sessions (issue 5)."""
    from app.services.auth import Principal

    def cookie(request, session):
        if request.cookies.get("session") == "letmein":
            return Principal(kind="session", name="alice", scopes=frozenset({"read", "write"}), user_id=1)
        return None

    api.state.authenticators.append(cookie)
    try:
        resp = client.post("/api/specs", json={"name": "s", "spec": tiny_spec()}, cookies={"session": "letmein"})
        assert resp.status_code == 201
        assert client.post("/api/specs", json={"name": "s", "spec": tiny_spec()}).status_code == 401
    finally:
        api.state.authenticators.remove(cookie)
        client.cookies.clear()
