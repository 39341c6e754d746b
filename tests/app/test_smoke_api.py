"""The app as a whole: health, OpenAPI, the size limit on streamed bodies, and the catch-all handler."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from tests.app.factories import make_run


def test_health(client, db_backend):
    resp = client.get("/api/health")
    assert resp.status_code == 200
    assert resp.json()["database"] == {"sqlite": "sqlite", "postgres": "postgresql"}[db_backend]


def test_create_and_get_run(client, write_headers):
    run = make_run(client, write_headers, name="first")
    assert run["status"] == "queued" and run["total_steps"] == 3
    got = client.get(f"/api/runs/{run['id']}").json()
    assert got["spec"]["trainer"]["device"] == "cpu"


def test_openapi_and_docs(client):
    schema = client.get("/openapi.json").json()
    assert {"/api/runs", "/api/specs", "/api/resolve", "/api/import", "/api/tokens"} <= set(schema["paths"])
    assert client.get("/docs").status_code == 200


def test_streamed_body_over_the_limit_is_413(client, write_headers, settings):
    """A chunked body (no Content-Length) is counted while it streams."""
    chunk = b" " * 65536

    def body():
        for _ in range(settings.MAX_BODY_BYTES // len(chunk) + 2):
            yield chunk

    resp = client.post("/api/runs", content=body(), headers={**write_headers, "content-type": "application/json"})
    assert resp.status_code == 413
    assert resp.json()["error"]["code"] == "payload_too_large"


def test_a_real_bug_is_a_json_500_and_logged(settings, caplog):
    from app.main import create_app

    app = create_app(settings, migrate=False)

    @app.get("/api/boom")
    def boom() -> None:
        raise RuntimeError("a bug")

    with TestClient(app, raise_server_exceptions=False) as c:
        resp = c.get("/api/boom")
    app.state.engine.dispose()
    assert resp.status_code == 500
    assert resp.json()["error"] == {"code": "internal_error", "message": "attnboard hit a bug; the server log has "
                                    "the traceback", "field": None, "value": None, "valid": None, "issues": []}
    assert "unhandled error on GET /api/boom" in caplog.text


def test_openapi_documents_the_error_body(client):
    """Every error is ``ErrorBody``; FastAPI's own 422 schema (``{"detail": [...]}``) is not what the API answers."""
    schema = client.get("/openapi.json").json()
    ref = {"$ref": "#/components/schemas/ErrorBody"}
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            for status in ("400", "401", "403", "404", "409", "413", "422"):
                assert operation["responses"][status]["content"]["application/json"]["schema"] == ref, (method, path)
    assert "HTTPValidationError" not in schema["components"]["schemas"]
    launching = {path for path, ops in schema["paths"].items() if "503" in ops.get("post", {}).get("responses", {})}
    assert launching == {"/api/runs", "/api/runs/{run_id}/submit", "/api/runs/{run_id}/retry",
                         "/api/runs/{run_id}/clone", "/api/troubleshooting/{entry_id}/retry"}


@pytest.mark.parametrize("method,path,allowed", [
    ("OPTIONS", "/api/trials", ["GET", "POST"]),  # Starlette named only the first route that matched: POST
    ("DELETE", "/api/runs", ["GET", "POST"]),
    ("PATCH", "/api/specs/1", ["DELETE", "GET", "PUT"]),
    ("GET", "/api/troubleshooting/recheck", ["POST"]),  # was a 422: "recheck" read as an entry id
])
def test_a_wrong_method_is_a_405_listing_every_allowed_one(client, method, path, allowed):
    resp = client.request(method, path)
    assert resp.status_code == 405, resp.text
    assert resp.headers["allow"] == ", ".join(allowed)
    error = resp.json()["error"]
    assert (error["field"], error["value"], error["valid"]) == ("method", method, allowed)
