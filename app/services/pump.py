"""Events exactly once, and no run left behind.

The supervisor (one thread per app process, started in the app's lifespan) repeats a short pass:

1. **pump**: for every unfinished run with a controller, pull ``events_since(last_seq)`` from the
   engine host, store them with ``append_events`` (idempotent on ``(run_id, seq)``, refuses gaps), then
   ``ack`` the last stored seq; a finished run whose events are all acknowledged is dropped by the host.
   The database is the only record of
   progress: a restarted app continues from each run's ``last_seq``, so nothing is lost or stored twice.
2. **reconcile**: a run whose controller is gone (the engine host died, or was replaced while the app
   was down) is started again (``restart``, below) while its ``attnboard.max_restarts`` allows; otherwise
   it is marked ``failed`` with the cause and an ``error`` event (``cancelled`` if a cancel was pending),
   so no run stays unfinished after its workers are gone.
3. **trials**: ``trials.TrialPump`` stores each started trial's progress from its job in the engine host
   (restarting or ending those whose host is gone, as for runs).
4. **schedule**: ``ray_launcher.schedule`` starts queued runs and trials that fit (one queue).

Restarts after a host death. The engine host owns the controllers and the ranks of its runs, so they all
die with it; only the app outlives it, and only the database knows where each run stands. So the app
restarts them: ``RayLauncher.relaunch`` submits the run to this app's engine host (a new one: the name
is free once the old one is dead) with a continuation: the cause, the attempt number, the next seq
(``last_seq + 1``), the status and the last stored metric step. The new controller finds the newest
complete checkpoint the run saved (its folder is the same: ``<CHECKPOINT_DIR>/<run id>/...``, shared on
a cluster), emits the ``restart`` event with the step it resumes from, keeps the status where it was
(``running`` stays ``running``), and sends no metric for the steps it replays up to the last stored
one, so the seqs stay contiguous and each step has one metric. Events the dead host made but the app
had not stored yet are lost; the replay makes them again. ``Run.restarts`` counts the attempts, raised
here before the submit (a host that dies again before its first event still counts) and by each
``restart`` event (the engine's own restarts after a rank died). A failed submit (Ray still busy
replacing the host) is tried again on the next passes for ``RELAUNCH_PATIENCE_S``, then the run fails.

``RunChanges`` lets ``GET /api/runs/{id}/wait`` sleep until a pass changed something instead of
polling the database in a loop.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Engine, update
from sqlmodel import Session, col, select

from app.errors import AppError
from app.models import Event, EventCreate, EventKind, Run, RunStatus
from app.services.common import max_restarts_of
from app.services.events import append_events
from app.services.launcher import LauncherUnavailable
from app.services.ray_launcher import ACTIVE, RayLauncher, controller_name, schedule
from app.services.trials import TrialPump
from worker.core.contract import TERMINAL

log = logging.getLogger("attnboard.pump")

BATCH = 1000
TICK_S = 0.25
MAX_WAIT_S = 300.0
RECHECK_S = 2.0
RELAUNCH_PATIENCE_S = 60.0


# --------------------------------------------------------------------------------------------
# Pure: worker events -> stored events


def storable(value: Any) -> Any:
    """A copy of ``value`` the databases can store: NaN/Infinity become None, NUL characters ``\\0``."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        return value.replace("\x00", "\\0")
    if isinstance(value, dict):
        return {storable(k) if isinstance(k, str) else str(k): storable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [storable(v) for v in value]
    return value


def to_event_create(event: dict[str, Any]) -> EventCreate:
    """A worker event ``{run_id, seq, ts, kind, payload}`` as the app stores it. The worker names a status
    ``state``; the app's events and pages read ``status``, so a status payload carries both."""
    payload = storable(dict(event.get("payload") or {}))
    if event["kind"] == EventKind.status.value and "status" not in payload and "state" in payload:
        payload["status"] = payload["state"]
    ts = event.get("ts")
    when = datetime.fromtimestamp(ts, UTC) if isinstance(ts, (int, float)) and math.isfinite(ts) else None
    return EventCreate(seq=event["seq"], kind=event["kind"], payload=payload, ts=when)


def gone_events(last_seq: int, *, name: str, why: str, cancel_requested: bool) -> list[EventCreate]:
    """The events the app writes for a run whose controller is gone: an ``error`` with the cause, then the
    final status (``cancelled`` when a cancel was pending, else ``failed``)."""
    final = RunStatus.cancelled if cancel_requested else RunStatus.failed
    message = f"workers gone: controller {name} {why}"
    return [
        EventCreate(seq=last_seq + 1, kind=EventKind.error, payload={"message": message, "source": "app"}),
        EventCreate(seq=last_seq + 2, kind=EventKind.status,
                    payload={"status": final.value, "state": final.value, "reason": message}),
    ]


ATTENTION_SUMMARY_KEYS = ("requested", "effective", "observed", "status", "forced", "fallback", "rank", "node",
                          "sdpa_backend", "sdpa_backend_reason", "compute_dtype")


def attention_summary(payloads: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per role, from its ``attention`` events (the first rank seen of the latest attempt wins: after a
    restart, what the new ranks ran): requested, effective, observed, status, forced, fallback, rank, the
    attempt and node, the SDPA backend that ran (and why, where it was math) and the compute dtype."""
    out: dict[str, dict[str, Any]] = {}
    for payload in payloads:
        role = payload.get("role")
        attempt = payload.get("attempt") if isinstance(payload.get("attempt"), int) else 0
        if isinstance(role, str) and (role not in out or attempt > out[role]["attempt"]):
            out[role] = {key: payload.get(key) for key in ATTENTION_SUMMARY_KEYS}
            out[role]["attempt"] = attempt
    return out


# --------------------------------------------------------------------------------------------
# Change notification for long-polls


class RunChanges:
    """Wakes ``/wait`` long-polls and the live pages' feeds (asyncio) when the supervisor (a thread) or an
    ingestion request changed runs. ``version`` counts the changes, so a waiter that passes the version it
    last saw (``since``) cannot miss one that came meanwhile."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiters: set[asyncio.Future[None]] = set()
        self.version = 0

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def notify(self) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        self.version += 1
        for fut in self._waiters:
            if not fut.done():
                fut.set_result(None)

    async def wait(self, timeout: float, since: int | None = None) -> None:
        """Return at the next change (at once if there was one after version ``since``), or after
        ``timeout`` seconds."""
        if since is not None and since != self.version:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.add(fut)
        try:
            await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            pass
        finally:
            self._waiters.discard(fut)


def run_snapshot(engine: Engine, run_id: int) -> tuple[Run, dict[str, dict[str, Any]]]:
    """The run (404 if missing) and its attention summary per role."""
    from app.services.runs import get_run

    with Session(engine, expire_on_commit=False) as session:
        run = get_run(session, run_id=run_id)
        payloads = session.exec(select(Event.payload).where(Event.run_id == run_id, Event.kind == EventKind.attention.value)
                                .order_by(col(Event.seq))).all()
    return run, attention_summary(list(payloads))


async def wait_for_run(engine: Engine, changes: RunChanges, *, run_id: int, timeout: float,
                       clock: Callable[[], float] = time.monotonic) -> tuple[Run, dict[str, dict[str, Any]], bool]:
    """Until the run is finished or ``timeout`` (<= 300 s) passed: (run, attention per role, timed_out).
    Sleeps on ``changes`` and looks again at least every 2 s (another process may have changed the run)."""
    from starlette.concurrency import run_in_threadpool

    deadline = clock() + min(max(timeout, 0.0), MAX_WAIT_S)
    while True:
        run, attention = await run_in_threadpool(run_snapshot, engine, run_id)
        if run.status in TERMINAL:
            return run, attention, False
        left = deadline - clock()
        if left <= 0:
            return run, attention, True
        await changes.wait(min(left, RECHECK_S))


# --------------------------------------------------------------------------------------------
# The supervisor


class Supervisor:
    """One thread that pumps events, reconciles runs with their controllers and schedules the queue."""

    def __init__(self, engine: Engine, launcher: RayLauncher, changes: RunChanges | None = None,
                 tick: float = TICK_S):
        self.engine, self.launcher, self.changes, self.tick_s = engine, launcher, changes, tick
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._after_restart = True
        self._handles: dict[int, Any] = {}
        self._pending: dict[int, tuple[Any, int]] = {}
        self._relaunch_failing_since: dict[int, float] = {}
        self.trials = TrialPump(launcher)

    # ---- thread

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="attnboard-supervisor", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        self.launcher.wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                if self.tick():
                    continue  # more events are waiting: go again at once
            except Exception:
                log.exception("supervisor pass failed")
            self.launcher.wake.wait(self.tick_s)
            self.launcher.wake.clear()

    # ---- one pass

    def tick(self) -> bool:
        """One pass; True when a run has more events waiting than one batch."""
        try:
            self.launcher.connect()
        except LauncherUnavailable:
            self._pending.clear()
            self._handles.clear()
            with Session(self.engine, expire_on_commit=False) as session:
                schedule(session, self.launcher)  # records "waiting for Ray" on queued runs
            return False
        more = changed = False
        with Session(self.engine, expire_on_commit=False) as session:
            runs = session.exec(select(Run).where(col(Run.status).in_(ACTIVE), col(Run.ray_job).is_not(None))
                                .order_by(col(Run.id))).all()
            asked = {}
            for run in runs:
                ref = self._ask(session, run)
                if ref is None:
                    changed = True  # the run was found gone and finished
                else:
                    asked[ref] = run
            if self._after_restart:
                self._release_finished(session)
            ready = self._ready(list(asked))
            for ref in ready:
                inserted, full = self.pump_run(session, asked[ref], ref)
                more |= full
                changed |= inserted > 0
            self._after_restart = False
            if changed:
                self._notify()  # stored events reach the live pages now, not after scheduling
            self.trials.tick(session)
            if schedule(session, self.launcher):
                self._notify()
        return more

    def _notify(self) -> None:
        if self.changes is not None:
            self.changes.notify()

    def _release_finished(self, session: Session) -> None:
        """After a restart: a run the engine host still has but that is finished here (the app stopped between
        storing the last event and acknowledging it) is acknowledged now, so the host drops it."""
        import ray

        from worker.engine.host import RunHandle

        host = self.launcher.find_host()
        if host is None:
            return
        ids = [int(run_id) for run_id in ray.get(host.run_ids.remote(), timeout=30) if run_id.isdigit()]
        if not ids:
            return
        finished = session.exec(select(Run).where(col(Run.id).in_(ids),
                                                  col(Run.status).in_(sorted(TERMINAL)))).all()
        for run in finished:
            log.info("run %s is %s: acknowledging it in the engine host", run.id, run.status)
            RunHandle(host, str(run.id)).ack(run.last_seq)

    def _ready(self, refs: list[Any]) -> list[Any]:
        import ray

        if not refs:
            return []
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=self.tick_s)
        return ready

    def _ask(self, session: Session, run: Run) -> Any | None:
        """The pending ``events_since(last_seq)`` call of a run (made now if there is none), or None when
        its controller is gone (the run is then finished here)."""
        assert run.id is not None
        pending = self._pending.get(run.id)
        if pending is not None and pending[1] == run.last_seq:
            return pending[0]
        handle = self._handles.get(run.id) or self.launcher.controller(run.id)
        if handle is None:
            self._lost(session, run, "not found after restart" if self._after_restart else "not found")
            return None
        self._handles[run.id] = handle
        ref = handle.events_since(run.last_seq, BATCH)
        self._pending[run.id] = (ref, run.last_seq)
        return ref

    def pump_run(self, session: Session, run: Run, ref: Any) -> tuple[int, bool]:
        """Store the answered batch of a run's events, then acknowledge them.
        Returns (events stored, whether the batch was full)."""
        import ray
        from ray.exceptions import RayActorError

        from worker.engine.host import RunUnknown

        assert run.id is not None
        self._pending.pop(run.id, None)
        handle = self._handles.get(run.id)
        try:
            events = ray.get(ref)
        except RayActorError as exc:
            self._handles.pop(run.id, None)
            text = str(exc).strip()
            cause = text.splitlines()[0] if text else type(exc).__name__
            return self._lost(session, run, f"died with the engine host ({cause})"), False
        except RunUnknown:  # the host was replaced, or dropped the run
            self._handles.pop(run.id, None)
            return self._lost(session, run, "not found in the engine host"), False
        if not events:
            return 0, False
        try:
            result = append_events(session, run_id=run.id, events=[to_event_create(e) for e in events])
        except AppError as exc:
            log.error("run %s: events refused: %s", run.id, exc.message)
            session.rollback()
            self.launcher.kill_run(run.id)
            self._handles.pop(run.id, None)
            return self._gone(session, run, f"was stopped: its events could not be stored ({exc.message})"), False
        session.refresh(run)
        if handle is not None:
            handle.ack(result.last_seq)  # idempotent; a finished, fully acknowledged run is dropped
        if run.status in TERMINAL:
            self._handles.pop(run.id, None)
        return result.inserted, len(events) >= BATCH

    def _lost(self, session: Session, run: Run, why: str) -> int:
        """A run whose controller is gone: restarted in a (new) engine host while ``attnboard.max_restarts``
        allows and no cancel is pending, else finished (``_gone``). Returns the events stored (a restart
        counts as one change)."""
        assert run.id is not None
        limit = max_restarts_of(run.spec)
        if run.cancel_requested or run.restarts >= limit:
            after = f" (after {run.restarts} restart{'s' if run.restarts != 1 else ''})" if run.restarts else ""
            return self._gone(session, run, why + after)
        attempt = run.restarts + 1
        cause = f"the engine host is gone: controller {controller_name(run.id)} {why}"
        try:
            self.launcher.relaunch(run, cause=cause, attempt=attempt)
        except Exception as exc:
            since = self._relaunch_failing_since.setdefault(run.id, time.monotonic())
            log.warning("run %s: could not restart it yet: %s", run.id, exc)
            if time.monotonic() - since < RELAUNCH_PATIENCE_S:
                return 0
            self._relaunch_failing_since.pop(run.id, None)
            return self._gone(session, run, f"{why}; it could not be restarted: {type(exc).__name__}: {exc}")
        self._relaunch_failing_since.pop(run.id, None)
        self._handles.pop(run.id, None)
        self._pending.pop(run.id, None)
        session.exec(update(Run).where(col(Run.id) == run.id, col(Run.restarts) < attempt)  # type: ignore[call-overload]
                     .values(restarts=attempt, status_reason=f"restart {attempt} of {limit}: {cause}"))
        session.commit()
        session.refresh(run)
        log.warning("run %s: restarted in the engine host (%d of %d): %s", run.id, attempt, limit, cause)
        return 1

    def _gone(self, session: Session, run: Run, why: str) -> int:
        assert run.id is not None
        events = gone_events(run.last_seq, name=controller_name(run.id), why=why,
                             cancel_requested=run.cancel_requested)
        log.warning("run %s: %s", run.id, events[0].payload["message"])
        result = append_events(session, run_id=run.id, events=events)
        return result.inserted
