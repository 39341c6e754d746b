"""Live runs' new events, read once for every page that follows them.

A live run page holds a server-sent events stream open (``GET /runs/{id}/stream``). Each stream used to
poll the database on its own (two statements every 0.25 to 2 s, backing off while nothing happened): with
200 viewers of one run that was hundreds of statements a second on the app's thread pool, and an event
waited up to 2 s for the next poll. Now one ``RunFeed`` per followed run reads the run's new events
(``events_since``) when the supervisor stored some (``RunChanges``, woken by the pump and by
``POST /api/runs/{id}/events``), or every ``POLL_S`` seconds for writers in other processes, and every
stream of that run takes them from there.

The database stays the only record: a feed keeps the last ``KEEP`` events it read, in memory, only so
streams can take them; a stream that starts behind them (a reconnect with an old ``Last-Event-ID``) or
falls behind reads its events from the database itself until it reaches them. A feed exists while
streams follow its run and stops when the last one leaves. Every stream gets each seq once, in order,
and ends when the run is finished and every event has been read.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

from sqlalchemy import Engine
from sqlmodel import Session
from starlette.concurrency import run_in_threadpool

from app.models import Event, Run
from app.services.events import MAX_EVENTS_PAGE, events_since
from app.services.pump import RunChanges
from worker.core.contract import TERMINAL

log = logging.getLogger("attnboard.feeds")

POLL_S = 1.0  # at least this often, so events another process stored are seen without a notification
KEEP = 1000


@dataclass(frozen=True)
class Batch:
    """Events after a stream's position, oldest first, and the run's status when they were read;
    ``finished``: the run is terminal and nothing follows these events."""

    events: list[Event]
    status: str
    finished: bool


def read_new(engine: Engine, run_id: int, after_seq: int, limit: int = MAX_EVENTS_PAGE) -> Batch:
    """The run's events after ``after_seq`` (at most ``limit``) and its status; 404 if the run is gone."""
    with Session(engine, expire_on_commit=False) as session:
        rows, last_seq = events_since(session, run_id=run_id, after_seq=after_seq, limit=limit)
        run = session.get(Run, run_id)  # loaded by events_since: no second statement
        assert run is not None
        end = rows[-1].seq if rows else after_seq
        return Batch(rows, run.status, run.status in TERMINAL and end >= last_seq)


class RunFeed:
    """One run's events as they are stored, for every stream that follows it (see the module docstring)."""

    def __init__(self, engine: Engine, changes: RunChanges, run_id: int, after_seq: int):
        self.engine, self.changes, self.run_id = engine, changes, run_id
        self.kept: deque[Event] = deque(maxlen=KEEP)
        self.last_seq = after_seq  # every event up to here has been read
        self.status = ""
        self.finished = False
        self.error: BaseException | None = None
        self.followers = 0
        self._rendered: dict[tuple[int, str], str] = {}
        self._read = asyncio.Event()  # set (and replaced) after each read that found something new
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name=f"run-feed-{self.run_id}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _loop(self) -> None:
        try:
            while not self.finished:
                seen = self.changes.version
                batch = await run_in_threadpool(read_new, self.engine, self.run_id, self.last_seq)
                self.status = batch.status
                self.finished = batch.finished
                if batch.events:
                    self.kept.extend(batch.events)
                    self.last_seq = batch.events[-1].seq
                    first = self.kept[0].seq
                    self._rendered = {key: text for key, text in self._rendered.items() if key[0] >= first}
                if batch.events or batch.finished:
                    self._publish()
                if len(batch.events) < MAX_EVENTS_PAGE and not batch.finished:
                    await self.changes.wait(POLL_S, since=seen)
        except Exception as exc:
            log.warning("run %s: feed stopped: %s", self.run_id, exc)
            self.error = exc
            self._publish()

    def rendered(self, seq: int, name: str, render: Callable[[], str]) -> str:
        """``render()`` for what event ``seq`` shows as ``name``, made once for all the streams of the run: a
        stream's view after events 1..seq is the same in every stream (``app.views.run_view.fold`` is pure), so
        what it renders from the view alone is too (not what depends on the viewer, e.g. a CSRF token)."""
        if not self.kept or seq < self.kept[0].seq:
            return render()
        key = (seq, name)
        text = self._rendered.get(key)
        if text is None:
            text = self._rendered[key] = render()
        return text

    def _publish(self) -> None:
        read, self._read = self._read, asyncio.Event()
        read.set()

    async def after(self, position: int, heartbeat_s: float | None = None) -> AsyncIterator[Batch]:
        """The events after ``position``, batch by batch as they are stored, until the run is finished; an
        empty batch after ``heartbeat_s`` seconds without one."""
        while True:
            first_kept = self.kept[0].seq if self.kept else self.last_seq + 1
            if position < first_kept - 1 or self.error is not None:
                # Behind what the feed keeps (or the feed stopped): from the database, up to what it keeps.
                limit = MAX_EVENTS_PAGE if self.error is not None else min(MAX_EVENTS_PAGE, first_kept - 1 - position)
                batch = await run_in_threadpool(read_new, self.engine, self.run_id, position, limit)
                if batch.events:
                    position = batch.events[-1].seq
                    yield batch
                if batch.finished:
                    return
                if self.error is not None and not batch.events:
                    await asyncio.sleep(POLL_S)
                continue
            if self.last_seq > position:
                events = [ev for ev in self.kept if ev.seq > position]
                position = events[-1].seq
                yield Batch(events, self.status, self.finished and position >= self.last_seq)
                continue
            if self.finished:
                yield Batch([], self.status, True)
                return
            try:
                await asyncio.wait_for(self._read.wait(), heartbeat_s)
            except TimeoutError:
                yield Batch([], self.status, False)


class RunFeeds:
    """The feeds of the runs some stream follows, one per run, in this app process."""

    def __init__(self, engine: Engine, changes: RunChanges):
        self.engine, self.changes = engine, changes
        self._feeds: dict[int, RunFeed] = {}

    @asynccontextmanager
    async def follow(self, run_id: int, after_seq: int) -> AsyncIterator[RunFeed]:
        """The run's feed (started at ``after_seq`` when it is the first follower) while the caller streams."""
        feed = self._feeds.get(run_id)
        if feed is None:
            feed = self._feeds[run_id] = RunFeed(self.engine, self.changes, run_id, after_seq)
            feed.start()
        feed.followers += 1
        try:
            yield feed
        finally:
            feed.followers -= 1
            if feed.followers == 0 and self._feeds.get(run_id) is feed:
                del self._feeds[run_id]
                await feed.stop()

    def __len__(self) -> int:
        return len(self._feeds)
