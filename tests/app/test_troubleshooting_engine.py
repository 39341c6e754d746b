"""End to end with the real engine: a run asking for flash_attention_2 (verl's default) on CPU under the
fallback policy falls back to sdpa on every role; its log entries are classified; retrying with the
critic entry's remedy (eager, the guide's second step) through the API gives a run that succeeds with no critic fallback.

The runs execute in this process (``worker.engine.run_spec``, one Ray actor per rank) and their events
are stored the way the service's pump stores them (``pump.to_event_create`` -> ``POST /events``).
Runs once, on SQLite: the engine is the expensive part and the database is not what is tested here.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.app.factories import engine_headers, make_run

pytestmark = [pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"), pytest.mark.ray]

ENGINE_SPEC = {"data.max_response_length": 8, "trainer.total_training_steps": 2,
               "attnboard.fallback_policy": "fallback"}


def execute(client, headers, run: dict[str, Any], cache_dir) -> str:
    """Run a stored run's spec through the engine and store its events as the pump does."""
    from app.services.pump import to_event_create
    from worker.engine import run_spec

    events: list[dict[str, Any]] = []
    state = run_spec(run["spec"], run_id=str(run["id"]), on_event=events.append, cache_dir=cache_dir)
    stored = [to_event_create(e) for e in events]
    # the app already holds the run as queued; the engine's own "queued" status is not a transition
    stored = [e for e in stored if not (e.kind == "status" and e.payload.get("status") == "queued")]
    body = [{**e.model_dump(mode="json"), "seq": i + 1} for i, e in enumerate(stored)]
    resp = client.post(f"/api/runs/{run['id']}/events", json=body, headers=engine_headers(client, run["id"]))
    assert resp.status_code == 200, resp.text
    return state


def test_fallback_run_entry_retried_with_its_remedy_succeeds(client, write_headers, db_backend, local_ray, tmp_path):
    if db_backend != "sqlite":
        pytest.skip("engine end-to-end runs once, on SQLite")
    run = make_run(client, write_headers, name="fa2 default on cpu", **ENGINE_SPEC)
    assert execute(client, write_headers, run, tmp_path) == "succeeded"
    assert client.get(f"/api/runs/{run['id']}").json()["status"] == "succeeded"

    log = client.get("/api/troubleshooting", params={"run_id": run["id"]}).json()
    assert sorted(e["role"] for e in log["data"]) == ["actor", "critic", "reference"]
    for entry in log["data"]:
        assert entry["source"] == "fallback" and entry["implementation"] == "flash_attention_2"
        assert entry["category"] == "flash_attn_not_installed"
        assert entry["environment"] == "cpu, no flash-attn"
        assert entry["error"].startswith("ImportError: FlashAttention2 has been toggled on")
    critic = next(e for e in log["data"] if e["role"] == "critic")
    assert critic["diagnosis"]["remedy"]["patch"] == {"critic.model.override_config.attn_implementation": "eager"}

    resp = client.post(f"/api/troubleshooting/{critic['id']}/retry", headers=write_headers)
    assert resp.status_code == 201, resp.text
    retry = resp.json()
    assert retry["retry_of"] == run["id"]
    assert execute(client, write_headers, retry, tmp_path) == "succeeded"
    assert client.get(f"/api/runs/{retry['id']}").json()["status"] == "succeeded"

    retry_log = client.get("/api/troubleshooting", params={"run_id": retry["id"]}).json()["data"]
    assert "critic" not in {e["role"] for e in retry_log}  # the remedy removed the critic's fallback
    events = client.get(f"/api/runs/{retry['id']}/events", params={"limit": 1000}).json()["data"]
    critic_attention = [e["payload"] for e in events if e["kind"] == "attention" and e["payload"]["role"] == "critic"]
    assert [(a["requested"], a["effective"], a["observed"], a["status"]) for a in critic_attention] == [
        ("eager", "eager", "eager", "ok")]
