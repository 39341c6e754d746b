"""Run events: idempotent on (run_id, seq), gaps refused, status events move the run in the same
transaction, pages of events since a seq."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlmodel import Session, select

from app.errors import AppError
from app.models import Event, EventConflict, EventCreate, Run
from app.services.events import INGEST_HEADER, append_events, conflict_count, events_since
from tests.app.factories import engine_headers, log_event, make_run, status_event, tiny_spec


def _ev(seq: int, kind: str = "log", **payload) -> EventCreate:
    return EventCreate(seq=seq, kind=kind, payload=payload or {"text": f"event {seq}"})


def _new_run(session: Session) -> int:
    run = Run(name="r", spec=tiny_spec())
    session.add(run)
    session.commit()
    session.refresh(run)
    return run.id


def _seqs(session: Session, run_id: int) -> list[int]:
    return list(session.exec(select(Event.seq).where(Event.run_id == run_id).order_by(Event.seq)).all())


def test_duplicates_are_ignored(session):
    run_id = _new_run(session)
    assert append_events(session, run_id=run_id, events=[_ev(1), _ev(2)]).model_dump() == \
        {"inserted": 2, "duplicates": 0, "conflicts": 0, "last_seq": 2}
    # a resend overlapping what is stored, in any order, stores only the new ones
    assert append_events(session, run_id=run_id, events=[_ev(3), _ev(2), _ev(1), _ev(3)]).model_dump() == \
        {"inserted": 1, "duplicates": 3, "conflicts": 0, "last_seq": 3}
    assert _seqs(session, run_id) == [1, 2, 3]


def test_a_gap_is_refused_whole(session):
    run_id = _new_run(session)
    append_events(session, run_id=run_id, events=[_ev(1)])
    with pytest.raises(AppError) as info:
        append_events(session, run_id=run_id, events=[_ev(2), _ev(4)])
    err = info.value
    assert (err.status, err.code, err.field, err.value, err.valid) == (409, "event_gap", "seq", 4, 3)
    assert err.message == f"run {run_id}: expected seq 3, got 4 (last stored 1); seqs must be contiguous from 1"
    assert _seqs(session, run_id) == [1]  # seq 2 of the refused batch was not kept


def test_first_event_must_be_seq_1(session):
    run_id = _new_run(session)
    with pytest.raises(AppError, match="expected seq 1, got 2"):
        append_events(session, run_id=run_id, events=[_ev(2)])


def test_unknown_run(session):
    with pytest.raises(AppError) as info:
        append_events(session, run_id=424242, events=[_ev(1)])
    assert (info.value.status, info.value.field) == (404, "run_id")


def test_status_metric_and_attention_events_update_the_run(session):
    run_id = _new_run(session)
    append_events(session, run_id=run_id, events=[
        _ev(1, "status", status="starting"),
        _ev(2, "status", status="running"),
        _ev(3, "attention", role="actor", rank=0, requested="flash_attention_2", effective="sdpa"),
        _ev(4, "metric", step=2, values={"actor/pg_loss": 0.1}),
        _ev(5, "metric", step=1),
    ])
    run = session.get(Run, run_id, populate_existing=True)
    assert (run.status, run.step, run.last_seq) == ("running", 2, 5)
    assert run.effective_attention == {"actor": "sdpa"} and run.started_at is not None
    append_events(session, run_id=run_id, events=[_ev(6, "status", status="succeeded", reason="done")])
    run = session.get(Run, run_id, populate_existing=True)
    assert (run.status, run.status_reason) == ("succeeded", "done") and run.finished_at is not None


def test_an_invalid_transition_rolls_back_the_batch(session):
    run_id = _new_run(session)
    with pytest.raises(AppError) as info:
        append_events(session, run_id=run_id, events=[_ev(1), _ev(2, "status", status="succeeded")])
    assert info.value.status == 409 and "cannot go from queued to succeeded" in info.value.message
    run = session.get(Run, run_id, populate_existing=True)
    assert (run.status, run.last_seq, _seqs(session, run_id)) == ("queued", 0, [])


def test_restart_events_count_the_runs_restarts_once_each(session):
    run_id = _new_run(session)
    restart = {"message": "restart", "cause": "rank 1 died", "rank": 1, "resumed_from_step": 2}
    append_events(session, run_id=run_id, events=[_ev(1, "restart", **restart, attempt=1)])
    append_events(session, run_id=run_id, events=[_ev(1, "restart", **restart, attempt=1),
                                                   _ev(2, "restart", **restart, attempt=2), _ev(3, "restart", attempt="x")])
    assert session.get(Run, run_id, populate_existing=True).restarts == 2


def test_events_since_pages(session):
    run_id = _new_run(session)
    append_events(session, run_id=run_id, events=[_ev(s) for s in range(1, 8)])
    rows, last = events_since(session, run_id=run_id, after_seq=2, limit=3)
    assert [r.seq for r in rows] == [3, 4, 5] and last == 7
    rows, _ = events_since(session, run_id=run_id, after_seq=7, limit=3)
    assert rows == []


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(windows=st.lists(st.tuples(st.integers(1, 12), st.integers(0, 4), st.randoms()), min_size=1, max_size=6))
def test_any_resend_pattern_stores_each_seq_once_without_gaps(session, windows):
    """Batches are windows [start, start+len] sent shuffled: those starting past last+1 are refused,
    the rest store exactly the new seqs; the table always holds 1..last_seq."""
    run_id = _new_run(session)
    last = 0
    for start, length, rnd in windows:
        batch = [_ev(s) for s in range(start, start + length + 1)]
        rnd.shuffle(batch)
        if start > last + 1:
            with pytest.raises(AppError):
                append_events(session, run_id=run_id, events=batch)
            continue
        result = append_events(session, run_id=run_id, events=batch)
        new_last = max(last, start + length)
        assert (result.inserted, result.last_seq) == (new_last - last, new_last)
        last = new_last
    assert _seqs(session, run_id) == list(range(1, last + 1))


def test_a_seq_collision_with_another_payload_is_kept_counted_and_logged(session, caplog):
    run_id = _new_run(session)
    append_events(session, run_id=run_id, events=[_ev(1), _ev(2, "metric", step=1, values={"loss": 1.0})])
    forged = [_ev(2, "status", status="succeeded"), _ev(1), _ev(3), _ev(3, "log", text="other")]
    result = append_events(session, run_id=run_id, events=forged)
    assert result.model_dump() == {"inserted": 1, "duplicates": 1, "conflicts": 2, "last_seq": 3}
    assert conflict_count(session, run_id=run_id) == 2
    rows = session.exec(select(EventConflict).where(EventConflict.run_id == run_id).order_by(EventConflict.seq)).all()
    assert [(r.seq, r.kind, r.stored_kind) for r in rows] == [(2, "status", "metric"), (3, "log", "log")]
    assert session.get(Run, run_id).status == "queued"  # the stored event stays what the run shows
    assert sum("kept in event_conflict" in r.getMessage() for r in caplog.records) == 2


def test_only_the_engine_posts_events(client, session, write_headers):
    run = make_run(client, write_headers)
    path = f"/api/runs/{run['id']}/events"
    for headers in ({}, write_headers, {INGEST_HEADER: "0" * 64}, engine_headers(client, run["id"] + 1)):
        resp = client.post(path, json=[status_event(1, "succeeded")], headers=headers)
        assert resp.status_code == 403 and resp.json()["error"]["field"] == INGEST_HEADER, resp.text
    assert client.get(f"/api/runs/{run['id']}").json()["status"] == "queued"


def test_api_ingest_and_read_back(client, write_headers):
    run = make_run(client, write_headers)
    path = f"/api/runs/{run['id']}/events"
    headers = engine_headers(client, run["id"])
    batch = [status_event(1, "starting"), status_event(2, "running"), log_event(3)]
    assert client.post(path, json=batch, headers=headers).json() == \
        {"inserted": 3, "duplicates": 0, "conflicts": 0, "last_seq": 3}
    assert client.post(path, json=batch, headers=headers).json() == \
        {"inserted": 0, "duplicates": 3, "conflicts": 0, "last_seq": 3}
    page = client.get(path, params={"after": 1, "limit": 1}).json()
    assert [e["seq"] for e in page["data"]] == [2] and page["next_after"] == 2 and page["last_seq"] == 3
    assert page["data"][0]["payload"] == {"status": "running"} and page["data"][0]["kind"] == "status"
    rest = client.get(path, params={"after": page["next_after"]}).json()
    assert [e["seq"] for e in rest["data"]] == [3]
    empty = client.get(path, params={"after": 3}).json()
    assert empty["data"] == [] and empty["next_after"] == 3
    assert client.get(f"/api/runs/{run['id']}").json()["status"] == "running"


def test_concurrent_appenders_for_one_run_never_collide(engine, session):
    """Four writers resend growing prefixes at the same time: the run lock serialises them, so no
    unique-constraint error or lost update happens and every seq is stored once."""
    from concurrent.futures import ThreadPoolExecutor

    run_id = _new_run(session)

    def writer(_: int) -> None:
        with Session(engine, expire_on_commit=False) as own:
            for end in range(5, 41, 5):
                append_events(own, run_id=run_id, events=[_ev(s) for s in range(1, end + 1)])

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(writer, range(4)))
    assert _seqs(session, run_id) == list(range(1, 41))
    assert session.get(Run, run_id, populate_existing=True).last_seq == 40
