"""The live pages' feeds (app/services/feeds.py): every stream of a run gets each event once, in order,
from one read of the database per batch, whatever its position; and ends when the run is finished."""

from __future__ import annotations

import asyncio

import pytest
from sqlmodel import Session
from starlette.concurrency import run_in_threadpool

from app.models import EventCreate, EventKind
from app.services import feeds as feeds_module
from app.services.events import append_events
from app.services.feeds import RunFeeds
from app.services.pump import RunChanges
from tests.app.pages_support import stored_run


def _log(seq: int) -> EventCreate:
    return EventCreate(seq=seq, kind=EventKind.log, payload={"message": f"line {seq}"})


def _status(seq: int, status: str) -> EventCreate:
    return EventCreate(seq=seq, kind=EventKind.status, payload={"status": status})


def _store(engine, run_id: int, events: list[EventCreate]) -> None:
    with Session(engine, expire_on_commit=False) as session:
        append_events(session, run_id=run_id, events=events)


async def _follow(feeds: RunFeeds, run_id: int, start: int) -> list[int]:
    seqs: list[int] = []
    async with feeds.follow(run_id, start) as feed:
        async for batch in feed.after(start):
            seqs += [ev.seq for ev in batch.events]
            if batch.finished:
                return seqs
    raise AssertionError("the stream stopped before the run finished")


def _scenario(engine, run_id: int, *, followers: list[int], batches: list[list[EventCreate]], notify: bool = True,
              joins_late: int | None = None) -> tuple[list[list[int]], int, RunFeeds]:
    """``followers`` streams (their start positions) follow the run while ``batches`` are stored one after
    another (the supervisor's pass: store, then notify); a late one joins after the first batch."""
    reads = []
    real = feeds_module.read_new

    def counted(*args, **kwargs):
        reads.append(args)
        return real(*args, **kwargs)

    async def scenario():
        changes = RunChanges()
        changes.bind(asyncio.get_running_loop())
        feeds = RunFeeds(engine, changes)
        tasks = [asyncio.create_task(_follow(feeds, run_id, start)) for start in followers]
        for i, batch in enumerate(batches):
            await asyncio.sleep(0.05)
            await run_in_threadpool(_store, engine, run_id, batch)
            if notify:
                changes.notify()
            if i == 0 and joins_late is not None:
                tasks.append(asyncio.create_task(_follow(feeds, run_id, joins_late)))
        got = await asyncio.wait_for(asyncio.gather(*tasks), 30)
        return got, feeds

    feeds_module.read_new = counted
    try:
        got, feeds = asyncio.run(scenario())
    finally:
        feeds_module.read_new = real
    return got, len(reads), feeds


def test_every_stream_gets_each_event_once_in_order_from_one_read_per_batch(engine, session):
    run_id = stored_run(session, name="live")
    _store(engine, run_id, [_status(1, "starting"), _status(2, "running")])
    batches = [[_log(s) for s in range(3 + 3 * i, 6 + 3 * i)] for i in range(8)]  # seq 3..26
    batches.append([_log(27), _status(28, "succeeded")])
    got, reads, feeds = _scenario(engine, run_id, followers=[2] * 50 + [0], batches=batches, joins_late=1)
    assert got[:50] == [list(range(3, 29))] * 50
    assert got[50] == list(range(1, 29))  # from before the feed's start: read from the database first
    assert got[51] == list(range(2, 29))  # joined after the first batch, from an older page
    # One read per stored batch (plus the feed's first, a catch-up each for the two streams behind it and a
    # few extra passes), not one per stream: 52 streams polling would have read hundreds of times.
    assert reads <= len(batches) + 10, reads
    assert len(feeds) == 0, "the feed stops with its last follower"


def test_events_stored_without_a_notification_arrive_by_the_poll(engine, session, monkeypatch):
    """Another process (another app, an ingestion elsewhere) stores them: the feed reads every POLL_S."""
    monkeypatch.setattr(feeds_module, "POLL_S", 0.05)
    run_id = stored_run(session, name="elsewhere")
    got, _, _ = _scenario(engine, run_id, followers=[0, 0], notify=False,
                          batches=[[_status(1, "starting")], [_status(2, "running"), _log(3)], [_status(4, "failed")]])
    assert got == [[1, 2, 3, 4]] * 2


def test_a_stream_behind_what_the_feed_keeps_reads_the_database(engine, session, monkeypatch):
    monkeypatch.setattr(feeds_module, "KEEP", 4)
    run_id = stored_run(session, name="long")
    _store(engine, run_id, [_status(1, "starting"), _status(2, "running")] + [_log(s) for s in range(3, 40)])
    got, _, _ = _scenario(engine, run_id, followers=[39, 0, 17], batches=[[_log(40)], [_status(41, "succeeded")]])
    assert got == [[40, 41], list(range(1, 42)), list(range(18, 42))]


def test_a_finished_run_ends_every_stream_at_once(engine, session):
    run_id = stored_run(session, name="done")
    _store(engine, run_id, [_status(1, "starting"), _status(2, "running"), _status(3, "cancelled")])
    got, _, feeds = _scenario(engine, run_id, followers=[3, 1], batches=[])
    assert got == [[], [2, 3]]
    assert len(feeds) == 0


@pytest.mark.parametrize("since_changed", [True, False])
def test_a_change_between_two_waits_is_not_missed(since_changed):
    async def scenario():
        changes = RunChanges()
        changes.bind(asyncio.get_running_loop())
        seen = changes.version
        if since_changed:
            changes.notify()
            await asyncio.sleep(0)  # the notification runs on the loop
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await changes.wait(0.3, since=seen)
        return loop.time() - t0

    waited = asyncio.run(scenario())
    assert (waited < 0.1) if since_changed else (waited >= 0.25)
