"""The CI side without Ray: ``GET /api/runs/{id}/wait``, ``POST /api/runs/{id}/submit`` and
``attnboard submit`` against a real uvicorn server, with runs driven to their end by posting worker
events. Runs on SQLite and PostgreSQL (the ``api`` fixture)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import uvicorn
from typer.testing import CliRunner

from app.cli import cli
from app.services.ray_runtime import free_port
from tests.app.factories import engine_headers, status_event
from tests.app.service_support import tiny_run_spec


def attention_event(seq: int, role: str, effective: str) -> dict:
    return {"seq": seq, "kind": "attention", "payload": {"role": role, "rank": 0, "requested": "sdpa",
                                                         "effective": effective, "observed": effective,
                                                         "status": "ok" if effective == "sdpa" else "fallback"}}


FINISH = {
    "succeeded": [status_event(1, "starting"), status_event(2, "running"), attention_event(3, "actor", "sdpa"),
                  attention_event(4, "critic", "eager"), status_event(5, "succeeded", "3 steps done")],
    "failed": [status_event(1, "starting"), status_event(2, "failed", "rank 0 died")],
}


@pytest.fixture
def server(api) -> Iterator[str]:
    """The app served by uvicorn on a free loopback port, in a thread."""
    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(api, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not srv.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    srv.should_exit = True
    thread.join(10)


def _create(client, write_headers, name: str = "ci") -> int:
    resp = client.post("/api/runs", json={"name": name, "spec": tiny_run_spec()}, headers=write_headers)
    assert resp.status_code == 201, resp.text
    return resp.json()["id"]


def test_wait_answers_at_once_for_a_finished_run_with_attention_per_role(client, write_headers):
    run_id = _create(client, write_headers)
    posted = client.post(f"/api/runs/{run_id}/events", json=FINISH["succeeded"], headers=engine_headers(client, run_id))
    assert posted.status_code == 200
    t0 = time.monotonic()
    body = client.get(f"/api/runs/{run_id}/wait", params={"timeout": 60}).json()
    assert time.monotonic() - t0 < 5
    assert body["timed_out"] is False and body["run"]["status"] == "succeeded"
    assert body["attention"]["actor"]["effective"] == "sdpa"
    assert body["attention"]["critic"] == {"requested": "sdpa", "effective": "eager", "observed": "eager",
                                           "status": "fallback", "forced": None, "fallback": None, "rank": 0,
                                           "node": None, "attempt": 0, "sdpa_backend": None,
                                           "sdpa_backend_reason": None, "compute_dtype": None}


def test_wait_times_out_on_an_unfinished_run(client, write_headers):
    run_id = _create(client, write_headers)
    t0 = time.monotonic()
    body = client.get(f"/api/runs/{run_id}/wait", params={"timeout": 0.5}).json()
    assert 0.4 <= time.monotonic() - t0 < 5
    assert body["timed_out"] is True and body["run"]["status"] == "queued"


@pytest.mark.parametrize("timeout", [-1, 301, "soon"])
def test_wait_refuses_a_timeout_outside_0_to_300(client, write_headers, timeout):
    run_id = _create(client, write_headers)
    resp = client.get(f"/api/runs/{run_id}/wait", params={"timeout": timeout})
    assert resp.status_code == 422
    assert resp.json()["error"]["field"] == "timeout"


def test_wait_on_a_missing_run_is_404(client):
    assert client.get("/api/runs/999999/wait", params={"timeout": 1}).status_code == 404


def test_wait_returns_soon_after_the_run_finishes(server, api, write_headers):
    with httpx.Client(base_url=server, headers=write_headers, timeout=60) as http:
        run_id = http.post("/api/runs", json={"name": "ci", "spec": tiny_run_spec()}).json()["id"]
        threading.Timer(0.5, lambda: http.post(f"/api/runs/{run_id}/events", json=FINISH["failed"],
                                                                  headers=engine_headers(api, run_id))).start()
        t0 = time.monotonic()
        body = http.get(f"/api/runs/{run_id}/wait", params={"timeout": 60}).json()
    assert body["run"]["status"] == "failed" and body["timed_out"] is False
    assert time.monotonic() - t0 < 5


def test_submit_again_without_a_launcher_is_503_and_only_for_queued_runs(client, write_headers):
    run_id = _create(client, write_headers)
    resp = client.post(f"/api/runs/{run_id}/submit", headers=write_headers)
    assert resp.status_code == 503
    assert resp.json()["error"]["message"] == f"run {run_id} stays queued: this app has no launcher attached"
    client.post(f"/api/runs/{run_id}/cancel", headers=write_headers)
    resp = client.post(f"/api/runs/{run_id}/submit", headers=write_headers)
    assert resp.status_code == 409
    error = resp.json()["error"]
    assert (error["field"], error["value"], error["valid"]) == ("status", "cancelled", ["queued"])
    assert client.post(f"/api/runs/{run_id}/submit").status_code == 401


# --------------------------------------------------------------------------------------------
# attnboard submit


@pytest.fixture
def spec_file(tmp_path):
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(tiny_run_spec()))
    return path


def _token(headers: dict[str, str]) -> str:
    return headers["Authorization"].removeprefix("Bearer ")


def _run_cli(args: list[str], box: dict) -> None:
    box["result"] = CliRunner().invoke(cli, args, catch_exceptions=False)


@pytest.mark.parametrize("outcome,code", [("succeeded", 0), ("failed", 1), ("cancelled", 3)])
def test_submit_wait_exit_code_tells_the_outcome(server, api, write_headers, spec_file, outcome, code):
    name = f"cli-{outcome}"
    box: dict = {}
    cli_thread = threading.Thread(target=_run_cli, args=(["submit", str(spec_file), "--server", server, "--token",
                                                          _token(write_headers), "--name", name, "--wait",
                                                          "--timeout", "120", "--json"], box))
    cli_thread.start()
    with httpx.Client(base_url=server, headers=write_headers, timeout=30) as http:
        deadline = time.monotonic() + 60
        while not (found := http.get("/api/runs", params={"name": name}).json()["data"]):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        run_id = found[0]["id"]
        if outcome == "cancelled":
            assert http.post(f"/api/runs/{run_id}/cancel").status_code == 200
        else:
            posted = http.post(f"/api/runs/{run_id}/events", json=FINISH[outcome], headers=engine_headers(api, run_id))
            assert posted.status_code == 200
    cli_thread.join(120)
    result = box["result"]
    assert result.exit_code == code, result.output
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["run_id"] == run_id and out["status"] == outcome and out["exit_code"] == code
    if outcome == "succeeded":
        assert {r["role"]: r["effective"] for r in out["attention"]} == {"actor": "sdpa", "critic": "eager"}


def test_submit_without_wait_prints_the_run(server, write_headers, spec_file):
    result = CliRunner().invoke(cli, ["submit", str(spec_file), "--server", server, "--token", _token(write_headers)])
    assert result.exit_code == 0, result.output
    assert "submitted (queued)" in result.stdout


def test_submit_timeout_is_exit_5(server, write_headers, spec_file):
    result = CliRunner().invoke(cli, ["submit", str(spec_file), "--server", server, "--token", _token(write_headers),
                                      "--wait", "--timeout", "1", "--json"])
    assert result.exit_code == 5, result.output
    assert json.loads(result.stdout.strip().splitlines()[-1])["timed_out"] is True


def test_submit_invalid_spec_is_exit_2(server, write_headers, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**tiny_run_spec(), "trainer": {"device": "tpu"}}))
    result = CliRunner().invoke(cli, ["submit", str(bad), "--server", server, "--token", _token(write_headers)])
    assert result.exit_code == 2, result.output


def test_submit_with_a_bad_token_is_exit_2(server, spec_file):
    result = CliRunner().invoke(cli, ["submit", str(spec_file), "--server", server, "--token", "atb_wrong", "--json"])
    assert result.exit_code == 2, result.output
    assert "HTTP 401" in json.loads(result.stdout)["error"]["message"]


def test_submit_to_an_unreachable_server_is_exit_4(spec_file):
    nowhere = f"http://127.0.0.1:{free_port()}"
    result = CliRunner().invoke(cli, ["submit", str(spec_file), "--server", nowhere, "--token", "x", "--json"])
    assert result.exit_code == 4, result.output
    error = json.loads(result.stdout)["error"]
    assert nowhere in error["message"] and error["field"] == "--server"
