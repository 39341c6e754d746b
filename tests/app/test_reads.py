"""The hot reads (``app.services.reads``: the runs list, one run, a run's events since a seq) build their
bodies without the response models; these tests hold them to exactly what ``RunsPublic``, ``RunPublic``
and ``EventsPublic`` serialise, on both databases, with awkward values (Unicode, quotes, JSON nulls,
naive and zoned timestamps, steps past the total). Also: a presented token is checked on every read
(revoking it works at once), and a PostgreSQL read whose pooled connection died is tried again."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from sqlalchemy import text
from sqlmodel import Session

from app.models import (
    EventCreate,
    EventPublic,
    EventsPublic,
    Run,
    RunPublic,
    RunsPublic,
)
from app.services.events import append_events, events_since
from app.services.runs import list_runs
from app.services.tokens import create_token
from tests.app.factories import engine_headers, make_run, tiny_spec

AWKWARD = 'quote " backslash \\ newline \n tab \t NUL-free \u2028 é 😀 </script>'


def _run_public(session: Session, run_id: int) -> dict:
    row = session.get(Run, run_id, populate_existing=True)
    return RunPublic.model_validate(row).model_dump(mode="json")


def _add_run(session: Session, **fields) -> int:
    run = Run(**{"name": "r", "spec": tiny_spec(), **fields})
    session.add(run)
    session.commit()
    session.refresh(run)
    return run.id


@pytest.fixture
def varied_runs(session: Session, client, write_headers) -> list[int]:
    """Runs covering every field's shapes: through the API (saved spec, retry, events) and written directly."""
    spec = client.post("/api/specs", json={"name": "saved", "spec": tiny_spec()}, headers=write_headers).json()
    from_spec = client.post("/api/runs", json={"spec_id": spec["id"], "environment": "cpu"}, headers=write_headers)
    api_run = make_run(client, write_headers, name=AWKWARD)
    retried = client.post(f"/api/runs/{api_run['id']}/retry", json={"patch": {"trainer.total_training_steps": 5}},
                          headers=write_headers).json()
    client.post(f"/api/runs/{api_run['id']}/events", headers=engine_headers(client, api_run["id"]), json=[
        {"seq": 1, "kind": "status", "payload": {"status": "running", "reason": AWKWARD}},
        {"seq": 2, "kind": "attention", "payload": {"role": "actor", "effective": "sdpa", "note": AWKWARD}},
        {"seq": 3, "kind": "metric", "payload": {"step": 7, "values": {"actor/pg_loss": 1e-05, "big": 1e300}}},
        {"seq": 4, "kind": "status", "payload": {"status": "failed", "reason": None}},
    ])
    started = datetime(2026, 1, 2, 3, 4, 5, 600, tzinfo=UTC)
    direct = [
        _add_run(session, name="no total", total_steps=None, step=3, environment={"probe": {"gpus": [], "x": None}},
                 effective_attention={"critic": "eager"}, ray_job="raysubmit_1", cancel_requested=True,
                 status="running", status_reason="", started_at=started),
        _add_run(session, name="zero total", total_steps=0, status="succeeded", started_at=started,
                 finished_at=started.astimezone(timezone(timedelta(hours=-7))) + timedelta(seconds=1)),
        _add_run(session, name="naive times", total_steps=3, step=2, created_at=datetime(2026, 3, 4, 5, 6, 7),
                 spec={"nested": {"list": [1, 2.5, "é", None, True, {"k": []}]}}),
    ]
    return [from_spec.json()["id"], api_run["id"], retried["id"], *direct]


def test_one_run_is_what_run_public_serialises(client, session, varied_runs):
    for run_id in varied_runs:
        resp = client.get(f"/api/runs/{run_id}")
        assert resp.status_code == 200 and resp.headers["content-type"] == "application/json"
        body, expected = resp.json(), _run_public(session, run_id)
        assert body == expected and list(body) == list(expected), run_id


def test_an_unknown_run_is_404(client):
    for path in ("/api/runs/424242", "/api/runs/424242/events"):
        error = client.get(path).json()["error"]
        assert (error["code"], error["field"], error["value"]) == ("not_found", "run_id", 424242)
        assert error["message"] == "run 424242 does not exist"


@pytest.mark.parametrize("params", [
    {}, {"limit": 2}, {"limit": 2, "offset": 2}, {"limit": 1, "offset": 5}, {"limit": 3, "offset": 6},
    {"limit": 5, "offset": 50}, {"status": ["running", "failed"]}, {"status": "running", "limit": 1, "offset": 1},
    {"name": "TOTAL"}, {"name": "%"}, {"name": "quote \""}, {"created_before": "2026-06-01T00:00:00+02:00"},
    {"status": "queued", "offset": 9},
])
def test_a_runs_page_is_what_runs_public_serialises(client, session, varied_runs, params):
    limit, offset = params.get("limit", 50), params.get("offset", 0)
    filters = {k: v if k != "status" or isinstance(v, list) else [v] for k, v in params.items()
               if k not in ("limit", "offset")}
    if "created_before" in filters:
        filters["created_before"] = datetime.fromisoformat(filters["created_before"])
    rows, total = list_runs(session, limit=limit, offset=offset, **filters)
    expected = RunsPublic(data=[RunPublic.model_validate(r) for r in rows], total=total, limit=limit,
                          offset=offset).model_dump(mode="json")
    body = client.get("/api/runs", params=params).json()
    assert body == expected and list(body) == list(expected)


def test_pages_walk_every_run_once_newest_first(client, varied_runs):
    seen = []
    for offset in range(0, 10, 2):
        body = client.get("/api/runs", params={"limit": 2, "offset": offset}).json()
        assert body["total"] == len(varied_runs)
        seen += [r["id"] for r in body["data"]]
    assert seen == sorted(varied_runs, reverse=True)


def test_events_are_what_events_public_serialises(client, session, write_headers):
    run_id = make_run(client, write_headers)["id"]
    payloads = [{"text": AWKWARD}, {}, {"values": {"a": 0.1, "b": -0.0, "c": 12345678901234567890}},
                {"list": [None, {"x": "é"}]}, {"step": 1}]
    append_events(session, run_id=run_id, events=[
        EventCreate(seq=i + 1, kind="metric" if "step" in p else "log", payload=p,
                    ts=datetime(2026, 5, 6, 7, 8, 9, i * 1000, tzinfo=timezone(timedelta(hours=5 - i))))
        for i, p in enumerate(payloads)])
    for after, limit in [(0, 100), (0, 2), (2, 2), (4, 100), (5, 100), (99, 3)]:
        rows, last_seq = events_since(session, run_id=run_id, after_seq=after, limit=limit)
        data = [EventPublic.model_validate(e) for e in rows]
        expected = EventsPublic(data=data, last_seq=last_seq,
                                next_after=data[-1].seq if data else after).model_dump(mode="json")
        body = client.get(f"/api/runs/{run_id}/events", params={"after": after, "limit": limit}).json()
        assert body == expected and [list(e) for e in body["data"]] == [list(e) for e in expected["data"]]


def test_a_run_without_events_answers_its_last_seq(client, write_headers):
    run_id = make_run(client, write_headers)["id"]
    assert client.get(f"/api/runs/{run_id}/events", params={"after": 7}).json() == \
        {"data": [], "last_seq": 0, "next_after": 7}


def test_the_openapi_schema_still_names_the_response_models(client):
    paths = client.app.openapi()["paths"]
    for path, model in [("/api/runs", "RunsPublic"), ("/api/runs/{run_id}", "RunPublic"),
                        ("/api/runs/{run_id}/events", "EventsPublic")]:
        schema = paths[path]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
        assert schema == {"$ref": f"#/components/schemas/{model}"}, path


def test_a_presented_token_is_checked_on_every_read(client, session, write_headers, admin_headers):
    run_id = make_run(client, write_headers)["id"]
    row, plaintext = create_token(session, name="reader", scopes=["read"])
    headers = {"Authorization": f"Bearer {plaintext}"}
    paths = ["/api/runs", f"/api/runs/{run_id}", f"/api/runs/{run_id}/events"]
    assert [client.get(p, headers=headers).status_code for p in paths] == [200, 200, 200]
    assert [client.get(p).status_code for p in paths] == [200, 200, 200]  # anonymous reads are open by default
    assert client.post(f"/api/tokens/{row.id}/revoke", headers=admin_headers).status_code == 200
    for path in paths:
        resp = client.get(path, headers=headers)
        assert resp.status_code == 401 and resp.json()["error"]["message"] == "unknown or revoked token", path
    bad = client.get(paths[0], headers={"Authorization": "Basic abc"})
    assert bad.status_code == 401 and bad.json()["error"]["field"] == "Authorization"


def test_reads_can_require_a_token(make_client, session, write_headers):
    closed = make_client(REQUIRE_TOKEN_FOR_READS=True)
    _, plaintext = create_token(session, name="reader", scopes=["read"])
    assert closed.get("/api/runs").status_code == 401
    assert closed.get("/api/runs", headers={"Authorization": f"Bearer {plaintext}"}).status_code == 200
    assert closed.get("/api/health").status_code == 200


def test_a_postgres_read_survives_its_pooled_connection_dying(client, engine, session, write_headers):
    """The reads' own pool pings nothing on checkout; a read that finds its connection dead (here: the
    server ended every other session) is tried once more on a fresh connection."""
    if engine.dialect.name != "postgresql":
        pytest.skip("SQLite has no connection to lose")
    run_id = make_run(client, write_headers)["id"]
    assert client.get(f"/api/runs/{run_id}").status_code == 200  # the reads' pool now holds a connection
    session.close()  # the test's own session gives its connection back (the test engine pings on checkout)
    with engine.connect() as conn:
        ended = conn.execute(text("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                                  "WHERE datname = current_database() AND pid <> pg_backend_pid()")).scalar_one()
    assert ended >= 1
    for path in (f"/api/runs/{run_id}", "/api/runs", f"/api/runs/{run_id}/events", "/api/health"):
        assert client.get(path).status_code == 200, path
