"""The API's hot reads as finished JSON bodies: a page of runs, one run, a run's events after a seq.

Each read is one SQLAlchemy Core statement (two when its page is empty) on one connection, and its
body is built once with orjson. JSON columns (a run's ``spec``, ``environment`` and
``effective_attention``, an event's ``payload``) are read as their stored text and spliced in
unparsed (``orjson.Fragment``): the databases only hold JSON the app wrote from validated, finite
values. Field names, order and formats are those of ``RunPublic``, ``RunsPublic`` and
``EventsPublic``, which still document the responses (``tests/app/test_reads.py`` checks the bodies
against them). The statements without filters (but the runs list's ``archived`` choice) are built once,
with bound parameters.

The read functions take a ``Fetch`` (a statement and its parameters in, the rows out) and run on the
event loop; ``Reader`` supplies it. See ``Reader`` for why neither database is read from the thread
pool.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from functools import partial
from typing import Any, TypeVar

import orjson
import psycopg
from psycopg_pool import AsyncConnectionPool
from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    Select,
    Text,
    bindparam,
    cast,
    func,
    select,
)
from sqlalchemy.engine import Compiled

from app.errors import not_found
from app.models import Event, Run, _as_utc
from app.services.runs import ARCHIVED, archived_where
from worker.core.contract import TERMINAL

_RUN = Run.__table__  # type: ignore[attr-defined]
_EVENT = Event.__table__  # type: ignore[attr-defined]
_DUMP_OPTIONS = orjson.OPT_UTC_Z
T = TypeVar("T")

Fetch = Callable[[Select, dict[str, Any]], Awaitable[Sequence[Sequence[Any]]]]
"""Runs a statement with its parameters and returns all its rows (tuples in the statement's column order)."""

# RunPublic's fields in its order (``name`` comes first from RunBase); JSON columns as their text.
_RUN_COLUMNS = (
    _RUN.c.name, _RUN.c.id, _RUN.c.spec_id, cast(_RUN.c.spec, Text), _RUN.c.status, _RUN.c.status_reason,
    _RUN.c.cancel_requested, cast(_RUN.c.environment, Text), _RUN.c.retry_of, _RUN.c.created_at, _RUN.c.started_at,
    _RUN.c.finished_at, _RUN.c.step, _RUN.c.total_steps, _RUN.c.last_seq, cast(_RUN.c.effective_attention, Text),
    _RUN.c.ray_job, _RUN.c.restarts, _RUN.c.archived,
)
_RUN_ID, _AFTER, _LIMIT, _OFFSET = (bindparam(name, type_=_RUN.c.id.type) for name in ("run_id", "after", "limit",
                                                                                        "offset"))


def _page_statements(where: list[ColumnElement[bool]], limit: Any, offset: Any) -> tuple[Select, Select]:
    """(the page with the total as its first column, the total alone) for the runs matching ``where``.

    The total rides along as an uncorrelated scalar subquery (evaluated once), so a non-empty page is
    one statement and one snapshot. The page starts at the id ``offset`` rows down, found by walking
    the ids alone, so skipped rows are never read whole."""
    count = select(func.count()).select_from(_RUN).where(*where)
    start = select(_RUN.c.id).where(*where).order_by(_RUN.c.id.desc()).limit(1).offset(offset).scalar_subquery()
    page = (select(count.scalar_subquery(), *_RUN_COLUMNS).where(*where, _RUN.c.id <= start)
            .order_by(_RUN.c.id.desc()).limit(limit))
    return page, count


# The pages without filters but the ``archived`` choice (the runs list's default hides archived runs), by
# ``Run.archived`` (None: any).
_UNFILTERED_PAGES = {archived: _page_statements(archived_where(archived), _LIMIT, _OFFSET)
                     for archived in ARCHIVED.values()}
_ONE_RUN = select(*_RUN_COLUMNS).where(_RUN.c.id == _RUN_ID)
_LAST_SEQ = select(_RUN.c.last_seq).where(_RUN.c.id == _RUN_ID)
# The run's last_seq rides along as a scalar subquery: a non-empty page is one statement and one snapshot.
_EVENTS_PAGE = (select(_LAST_SEQ.scalar_subquery(), _EVENT.c.seq, _EVENT.c.kind, cast(_EVENT.c.payload, Text),
                       _EVENT.c.ts)
                .where(_EVENT.c.run_id == _RUN_ID, _EVENT.c.seq > _AFTER).order_by(_EVENT.c.seq).limit(_LIMIT))
_PING = select(1)
_PREBUILT = (*(s for pair in _UNFILTERED_PAGES.values() for s in pair), _ONE_RUN, _LAST_SEQ, _EVENTS_PAGE, _PING)


def _json(text: str | None) -> orjson.Fragment | None:
    return None if text is None else orjson.Fragment(text)


def _utc(value: datetime | None) -> datetime | None:
    return None if value is None else _as_utc(value)


def _run(row: Sequence[Any]) -> dict[str, Any]:
    """A row of ``_RUN_COLUMNS`` as ``RunPublic`` serialises it, ``progress`` and ``terminal`` included."""
    (name, run_id, spec_id, spec, status, status_reason, cancel_requested, environment, retry_of, created_at,
     started_at, finished_at, step, total_steps, last_seq, effective_attention, ray_job, restarts, archived) = row
    return {
        "name": name,
        "id": run_id,
        "spec_id": spec_id,
        "spec": orjson.Fragment(spec),
        "status": status,
        "status_reason": status_reason,
        "cancel_requested": cancel_requested,
        "environment": _json(environment),
        "retry_of": retry_of,
        "created_at": _as_utc(created_at),
        "started_at": _utc(started_at),
        "finished_at": _utc(finished_at),
        "step": step,
        "total_steps": total_steps,
        "last_seq": last_seq,
        "effective_attention": _json(effective_attention),
        "ray_job": ray_job,
        "restarts": restarts,
        "archived": archived,
        "progress": {"step": step, "total_steps": total_steps,
                     "fraction": min(1.0, step / total_steps) if total_steps else None},
        "terminal": status in TERMINAL,
    }


async def run_json(fetch: Fetch, *, run_id: int) -> bytes:
    """``RunPublic`` of run ``run_id``; 404 when there is none."""
    rows = await fetch(_ONE_RUN, {"run_id": run_id})
    if not rows:
        raise not_found("run", run_id, field="run_id")
    return orjson.dumps(_run(rows[0]), option=_DUMP_OPTIONS)


async def run_page_json(fetch: Fetch, *, where: list[ColumnElement[bool]], archived: bool | None, limit: int,
                        offset: int) -> bytes:
    """``RunsPublic``: the runs matching ``where`` (``app.services.runs.run_filters``) and ``archived`` (a value
    of ``app.services.runs.ARCHIVED``), newest (highest id) first, ``limit`` of them from ``offset``, and how
    many match in all."""
    if where:
        page, count = _page_statements([*where, *archived_where(archived)], limit, offset)
        params: dict[str, Any] = {}
    else:
        (page, count), params = _UNFILTERED_PAGES[archived], {"limit": limit, "offset": offset}
    rows = await fetch(page, params)
    total = rows[0][0] if rows else (await fetch(count, params))[0][0]
    return orjson.dumps({"data": [_run(r[1:]) for r in rows], "total": total, "limit": limit, "offset": offset},
                        option=_DUMP_OPTIONS)


async def events_json(fetch: Fetch, *, run_id: int, after_seq: int, limit: int) -> bytes:
    """``EventsPublic``: the events of ``run_id`` with ``seq > after_seq``, oldest first, at most ``limit``
    (served by the UNIQUE(run_id, seq) index), the run's ``last_seq`` and ``next_after``; 404 when the run
    does not exist. An empty page reads the run's ``last_seq`` on its own."""
    params = {"run_id": run_id, "after": after_seq, "limit": limit}
    rows = await fetch(_EVENTS_PAGE, params)
    if rows:
        last_seq = rows[0][0]
    else:
        run = await fetch(_LAST_SEQ, params)
        if not run:
            raise not_found("run", run_id, field="run_id")
        last_seq = run[0][0]
    data = [{"seq": seq, "kind": kind, "payload": orjson.Fragment(payload), "run_id": run_id, "ts": _as_utc(ts)}
            for _, seq, kind, payload, ts in rows]
    return orjson.dumps({"data": data, "last_seq": last_seq, "next_after": data[-1]["seq"] if data else after_seq},
                        option=_DUMP_OPTIONS)


async def ping(fetch: Fetch) -> None:
    """``SELECT 1``: whether the database answers (the health check)."""
    await fetch(_PING, {})


async def _fetch_sqlalchemy(conn: Connection, statement: Select, params: dict[str, Any]) -> Sequence[Sequence[Any]]:
    return conn.execute(statement, params).all()


class Reader:
    """Runs the read functions above on the event loop, one connection per read.

    Neither database is read from the thread pool: under 16 concurrent clients the two thread switches
    of each hop (and the GIL passed back and forth between the loop and the workers) doubled the p99
    of these reads, more than the reads themselves cost.

    SQLite is read in place through the app's engine: a read is a single indexed statement in the same
    process, and in WAL mode a reader does not wait for writers.

    PostgreSQL is read with psycopg's async connections from a pool of their own (``psycopg_pool``),
    so the loop serves other requests while the database works. The statements are the same Core
    statements, compiled once by SQLAlchemy's psycopg dialect; the rows need no conversion (psycopg
    returns the same Python values SQLAlchemy would). SQLAlchemy's async engine would add its greenlet
    and adaptation layers: a run's detail cost 0.5 ms of CPU through it, 0.2 ms this way. The pool's
    connections are in autocommit (a single statement needs no BEGIN/ROLLBACK round trips) and are
    not pinged on checkout; a read that finds its connection dead has the pool check its connections
    and is tried once more (reads are idempotent), which is what a ping would have bought."""

    POOL_SIZE = 8
    """Most connections the PostgreSQL pool opens; more concurrent reads wait for one (on the loop, without
    blocking it). Connections are kept, not opened per read: starting a PostgreSQL backend costs far more
    than these reads."""

    POOL_TIMEOUT_S = 5.0
    """How long a read waits for a connection before it fails (e.g. while PostgreSQL is down)."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self._postgres = engine.dialect.name == "postgresql"
        self._pool: AsyncConnectionPool | None = None
        self._opening = asyncio.Lock()
        self._compiled: dict[int, tuple[Select, str, Compiled]] = {}
        if self._postgres:
            self._compiled = {id(s): (s, *self._compile(s)) for s in _PREBUILT}

    async def __call__(self, read: Callable[..., Awaitable[T]], /, **kwargs: Any) -> T:
        if not self._postgres:
            with self.engine.connect() as conn:
                return await read(partial(_fetch_sqlalchemy, conn), **kwargs)
        pool = self._pool or await self._open()
        try:
            return await self._read_postgres(pool, read, kwargs)
        except psycopg.OperationalError:
            await pool.check()  # drop the broken connections (e.g. after a server restart), then once more
            return await self._read_postgres(pool, read, kwargs)

    async def _read_postgres(self, pool: AsyncConnectionPool, read: Callable[..., Awaitable[T]],
                             kwargs: dict[str, Any]) -> T:
        async with pool.connection() as conn:
            async def fetch(statement: Select, params: dict[str, Any]) -> Sequence[Sequence[Any]]:
                cached = self._compiled.get(id(statement))
                sql, compiled = cached[1:] if cached is not None and cached[0] is statement else \
                    self._compile(statement)
                cursor = await conn.execute(sql, compiled.construct_params(params))
                return await cursor.fetchall()

            return await read(fetch, **kwargs)

    def _compile(self, statement: Select) -> tuple[str, Compiled]:
        compiled = statement.compile(dialect=self.engine.dialect, compile_kwargs={"render_postcompile": True})
        return str(compiled), compiled

    async def _open(self) -> AsyncConnectionPool:
        async with self._opening:
            if self._pool is None:
                url = self.engine.url.set(drivername="postgresql")
                pool = AsyncConnectionPool(url.render_as_string(hide_password=False), min_size=1,
                                           max_size=self.POOL_SIZE, timeout=self.POOL_TIMEOUT_S,
                                           kwargs={"autocommit": True}, open=False, name="attnboard-reads")
                await pool.open()
                self._pool = pool
            return self._pool

    async def close(self) -> None:
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await pool.close()
