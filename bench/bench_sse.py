"""The live run page under load: 200 browsers watching one live run over server-sent events while 16 API
clients read, on `attnboard serve` as deployed (embedded Ray, engine host, supervisor, SQLite). Measures
event -> browser latency (p50/p95/p99/max over every event and every viewer) and the app's CPU and memory,
prints them and writes bench/results/sse.md. Target: p95 <= 1 s.

The run is real: the tiny CPU preset on 1 rank, long enough to outlast the measurement. Its events take
the real path: the worker emits them (each with its ``ts``, the moment it was made), the app's supervisor
pumps them from the engine host into the database, and the stream each live page holds open
(``GET /runs/{id}/stream``, the one the htmx sse extension connects to) sends them.

"event -> browser", per event and per viewer whose stream had to send it: from the moment the event was
stored (its row inserted into the database; a trigger in the benchmark's database notes the time) to the
moment the viewer read the SSE message carrying its ``id``. Also reported: from the event's ``ts`` (made by
the worker; one machine, one clock), which adds the supervisor's pump from the engine host.

    .venv/bin/python bench/bench_sse.py                       # 200 viewers, 16 API clients, 60 s
    .venv/bin/python bench/bench_sse.py --viewers 20 --duration 20
"""

from __future__ import annotations

import argparse
import asyncio
import math
import multiprocessing
import os
import random
import re
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common import http_get, load_text, machine, proc_cpu_rss, read_head, run_async, write_result

from tests.app.service_support import AppProcess, app_env, ray_env, tiny_run_spec, token_headers

TARGET_P95_S = 1.0
GRACE_S = 5.0  # events made in the last GRACE_S seconds of the window are not counted (they may still be on the way)


# --------------------------------------------------------------------------------------------
# Clients (each group in a spawned process of its own: asyncio, raw kept-alive HTTP/1.1 connections)


@dataclass
class Viewer:
    """What one browser saw: (seq, arrival wall time) for every SSE message with an id, in order."""

    arrivals: list[tuple[int, float]] = field(default_factory=list)
    start_seq: int = 0  # the page showed every event up to here; the stream sends the later ones
    connects: int = 0
    ended: bool = False
    error: str | None = None


async def _stream(host: str, port: int, path: str, last_event_id: int | None, viewer: Viewer, deadline: float) -> bool:
    """Hold one SSE stream open until ``deadline``, as EventSource does; True when the server ended it
    (the run finished or the connection dropped)."""
    reader, writer = await asyncio.open_connection(host, port)
    viewer.connects += 1
    try:
        extra = f"Last-Event-ID: {last_event_id}\r\n" if last_event_id is not None else ""
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nAccept: text/event-stream\r\nCache-Control: no-cache\r\n"
                     f"{extra}\r\n".encode())
        status, headers = await read_head(reader)
        if status != 200 or headers.get(b"transfer-encoding") != b"chunked":
            raise RuntimeError(f"GET {path}: {status} {headers}")
        buffer = b""
        while True:
            left = deadline - time.time()
            if left <= 0:
                return False
            try:
                size_line = await asyncio.wait_for(reader.readuntil(b"\r\n"), left)
            except TimeoutError:
                return False
            size = int(size_line.strip(), 16)
            chunk = await reader.readexactly(size + 2)
            now = time.time()
            if size == 0:
                return True
            buffer += chunk[:-2]
            *messages, buffer = buffer.split(b"\n\n")
            for message in messages:
                for line in message.split(b"\n"):
                    if line.startswith(b"id: "):
                        viewer.arrivals.append((int(line[4:]), now))
                    elif line == b"event: end":
                        viewer.ended = True
    finally:
        writer.close()


async def _viewer(host: str, port: int, run_id: int, viewer: Viewer, start_at: float, deadline: float) -> None:
    """A browser: load the run page, then follow its ``sse-connect`` stream; reconnect with Last-Event-ID
    (after the ``retry: 1000`` the stream announces) when the server drops it."""
    await asyncio.sleep(max(0.0, start_at - time.time()))
    try:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            page = (await http_get(reader, writer, host, f"/runs/{run_id}", accept="text/html")).decode()
        finally:
            writer.close()
        found = re.search(r'sse-connect="([^"]+)"', page)
        if found is None:
            raise RuntimeError(f"run {run_id}'s page opens no stream (finished?)")
        path = found.group(1).replace("&amp;", "&")
        viewer.start_seq = int(re.search(r"after=(\d+)", path).group(1))
        last_id = None
        while time.time() < deadline and not viewer.ended:
            dropped = await _stream(host, port, path, last_id, viewer, deadline)
            if viewer.arrivals:
                last_id = viewer.arrivals[-1][0]
            if dropped and not viewer.ended:
                await asyncio.sleep(1.0)
    except Exception as exc:
        viewer.error = f"{type(exc).__name__}: {exc}"


def viewers_process(host: str, port: int, run_id: int, viewers: int, ramp_s: float, start: float, deadline: float
                    ) -> tuple[list[Viewer], float]:
    """``viewers`` browsers, started evenly over ``ramp_s`` from ``start``; (what each saw, client CPU seconds)."""
    seen = [Viewer() for _ in range(viewers)]

    async def main() -> None:
        await asyncio.gather(*(_viewer(host, port, run_id, v, start + ramp_s * i / viewers, deadline)
                               for i, v in enumerate(seen)))

    cpu0 = time.process_time()
    run_async(main())
    return seen, time.process_time() - cpu0


READS = ("run list page", "run detail", "events since seq")


def api_process(host: str, port: int, run_id: int, clients: int, start: float, deadline: float
                ) -> tuple[dict[str, list[float]], dict[int, float], float]:
    """``clients`` closed-loop API clients (no think time) from ``start`` to ``deadline``: client 0 tails the
    live run's events (``?after=`` its last seq), the others cycle through the list page, the live run's
    detail and its events after a random seq. Returns the request times per read, the first moment the
    tail saw each seq, and the process's CPU seconds."""
    times: dict[str, list[float]] = {name: [] for name in (*READS, "tail (events after last seen)")}
    first_seen: dict[int, float] = {}

    async def tail() -> None:
        import json

        reader, writer = await asyncio.open_connection(host, port)
        after = 0
        try:
            while time.time() < deadline:
                t0 = time.perf_counter()
                page = json.loads(await http_get(reader, writer, host, f"/api/runs/{run_id}/events?after={after}&limit=1000"))
                now = time.time()
                times["tail (events after last seen)"].append(time.perf_counter() - t0)
                for event in page["data"]:
                    first_seen.setdefault(event["seq"], now)
                after = page["next_after"]
        finally:
            writer.close()

    async def reads(n: int) -> None:
        rnd = random.Random(n)
        reader, writer = await asyncio.open_connection(host, port)
        try:
            i = 0
            while time.time() < deadline:
                read = READS[i % len(READS)]
                path = {"run list page": "/api/runs?limit=50",
                        "run detail": f"/api/runs/{run_id}",
                        "events since seq": f"/api/runs/{run_id}/events?after={rnd.randrange(50)}&limit=100"}[read]
                t0 = time.perf_counter()
                await http_get(reader, writer, host, path)
                times[read].append(time.perf_counter() - t0)
                i += 1
        finally:
            writer.close()

    async def main() -> None:
        await asyncio.sleep(max(0.0, start - time.time()))
        await asyncio.gather(tail(), *(reads(n) for n in range(1, clients)))

    cpu0 = time.process_time()
    run_async(main())
    return times, first_seen, time.process_time() - cpu0


# --------------------------------------------------------------------------------------------
# The app's CPU and memory


def _machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of all CPUs, from /proc/stat."""
    values = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]
    return sum(values) - idle, sum(values)


class Sampler(threading.Thread):
    """Every ``period`` seconds: the app process's CPU (% of one core over the period) and RSS, and the
    machine's CPU busy (% of all cores)."""

    def __init__(self, pid: int, period: float = 1.0):
        super().__init__(daemon=True)
        self.pid, self.period = pid, period
        self.samples: list[tuple[float, float, float]] = []  # (app cpu %, app rss MiB, machine busy %)
        self._halt = threading.Event()

    def run(self) -> None:
        cpu0, _ = proc_cpu_rss(self.pid)
        busy0, total0 = _machine_busy()
        t0 = time.perf_counter()
        while not self._halt.wait(self.period):
            cpu, rss = proc_cpu_rss(self.pid)
            busy, total = _machine_busy()
            t = time.perf_counter()
            self.samples.append((100 * (cpu - cpu0) / (t - t0), rss, 100 * (busy - busy0) / max(total - total0, 1)))
            cpu0, busy0, total0, t0 = cpu, busy, total, t

    def stop(self) -> None:
        self._halt.set()
        self.join()


# --------------------------------------------------------------------------------------------
# Figures


def pct(values: list[float], q: float) -> float:
    """The q-th percentile (inclusive method); inf when q falls on events that never arrived."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    k = (len(ordered) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    if math.isinf(ordered[hi]):
        return math.inf
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def latencies(viewers: list[Viewer], start_of: dict[int, float], counted: list[int]) -> tuple[list[float], int, int]:
    """Per viewer and per counted event its stream had to send (those after the page it loaded): arrival -
    ``start_of[seq]``, inf for an event the viewer never got. Also how many viewers lost or repeated an
    event (ids not contiguous from the page's last seq), and how many deliveries are missing."""
    out: list[float] = []
    broken = missing = 0
    for viewer in viewers:
        seqs = [seq for seq, _ in viewer.arrivals]
        if seqs != list(range(viewer.start_seq + 1, viewer.start_seq + 1 + len(seqs))):
            broken += 1
        arrived = dict(viewer.arrivals)
        for seq in (s for s in counted if s > viewer.start_seq):
            if seq in arrived:
                out.append(arrived[seq] - start_of[seq])
            else:
                out.append(math.inf)
                missing += 1
    return out, broken, missing


def record_ingestion(db: Path) -> None:
    """A trigger in the benchmark's database (not the app's schema) that notes the wall time each event row
    is inserted (SQLite's clock, milliseconds; the commit follows in the same transaction)."""
    import sqlite3

    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE bench_ingested (run_id INTEGER, seq INTEGER, at REAL)")
        conn.execute("CREATE TRIGGER bench_ingested AFTER INSERT ON event BEGIN INSERT INTO bench_ingested "
                     "VALUES (NEW.run_id, NEW.seq, (julianday('now') - 2440587.5) * 86400.0); END")


def ingested(db: Path, run_id: int) -> dict[int, float]:
    import sqlite3

    with sqlite3.connect(db) as conn:
        return dict(conn.execute("SELECT seq, at FROM bench_ingested WHERE run_id = ?", (run_id,)).fetchall())


def all_events(client: httpx.Client, run_id: int) -> list[dict[str, Any]]:
    events, after = [], 0
    while True:
        page = client.get(f"/api/runs/{run_id}/events", params={"after": after, "limit": 1000}).json()
        events += page["data"]
        if len(page["data"]) < 1000:
            return events
        after = page["next_after"]


def ts_of(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(event["ts"].replace("Z", "+00:00")).timestamp()


def ms(x: float) -> str:
    return "never" if math.isinf(x) else f"{1000 * x:.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--viewers", type=int, default=200)
    parser.add_argument("--api-clients", type=int, default=16)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of measurement after the ramp")
    parser.add_argument("--ramp", type=float, default=10.0, help="seconds over which the viewers open the page")
    parser.add_argument("--steps", type=int, default=2000, help="the live run's steps (cancelled when done)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "sse.md")
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="attnboard-bench-sse-"))
    env = app_env(ray_env(None), data_dir=tmp / "data", num_cpus=2)
    app = AppProcess(env, tmp / "app.log")
    app.start()
    host, port = "127.0.0.1", app.port
    try:
        record_ingestion(tmp / "data" / "attnboard.db")
        headers = token_headers(f"sqlite:///{tmp / 'data' / 'attnboard.db'}")
        with httpx.Client(base_url=app.url, headers=headers, timeout=60) as client:
            resp = client.post("/api/runs", json={"name": "bench-sse live run", "spec": tiny_run_spec(steps=args.steps)})
            assert resp.status_code == 201, resp.text
            run_id = resp.json()["id"]
            deadline = time.monotonic() + 600
            while client.get(f"/api/runs/{run_id}").json()["step"] < 1:
                assert time.monotonic() < deadline, "the live run made no step in 10 minutes:\n" + app.tail()
                time.sleep(0.5)
            print(f"run {run_id} is live; {args.viewers} viewers open its page over {args.ramp:.0f} s, "
                  f"{args.api_clients} API clients read, for {args.duration:.0f} s", flush=True)

            start = time.time() + 2.0
            window = (start + args.ramp, start + args.ramp + args.duration - GRACE_S)
            end = start + args.ramp + args.duration
            load0 = os.getloadavg()
            sampler = Sampler(app.proc.pid)
            ctx = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(1, mp_context=ctx) as vpool, ProcessPoolExecutor(1, mp_context=ctx) as apool:
                seen_f = vpool.submit(viewers_process, host, port, run_id, args.viewers, args.ramp, start, end)
                api_f = apool.submit(api_process, host, port, run_id, args.api_clients, start, end)
                while time.time() < window[0]:
                    time.sleep(0.2)
                sampler.start()
                seen, viewer_cpu = seen_f.result()
                api_times, first_seen, api_cpu = api_f.result()
                sampler.stop()
            events = all_events(client, run_id)
            stored_at = ingested(tmp / "data" / "attnboard.db", run_id)
            client.post(f"/api/runs/{run_id}/cancel")
            client.get(f"/api/runs/{run_id}/wait", params={"timeout": 120}, timeout=180)
    finally:
        app.stop()

    made = {e["seq"]: ts_of(e) for e in events}
    # Counted: the events stored during the window (their seqs), for every viewer whose stream had to send them.
    counted = sorted(seq for seq, at in stored_at.items() if window[0] <= at <= window[1])
    rows = {name: latencies(seen, start_of, counted) for name, start_of in
            (("event -> browser", stored_at), ("created -> browser", made))}
    lat, broken, missing = rows["event -> browser"]
    pump = [stored_at[seq] - made[seq] for seq in counted]
    tail = [first_seen[seq] - stored_at[seq] for seq in counted if seq in first_seen]
    errors = [v.error for v in seen if v.error]
    reconnects = sum(max(0, v.connects - 1) for v in seen)
    cpu = [x[0] for x in sampler.samples]
    rss = [x[1] for x in sampler.samples]
    busy = [x[2] for x in sampler.samples]
    p = {q: pct(lat, q) for q in (50, 95, 99, 100)}
    met = p[95] <= TARGET_P95_S
    rate = len(counted) / (window[1] - window[0])
    figures = [
        ("**event -> browser**: stored in the database -> SSE message read, every viewer", lat),
        ("created -> browser: the event's `ts` (the worker) -> SSE message read", rows["created -> browser"][0]),
        ("created -> stored: the supervisor's pump from the engine host", pump),
        ("for comparison, an API client tailing `/events?after=` in a closed loop: stored -> seen", tail),
    ]
    print(f"events stored in the window: {len(counted)} ({rate:.1f}/s), {len(lat)} deliveries to "
          f"{len(seen)} viewers; missing {missing}, viewers with a lost or repeated event {broken}, reconnects "
          f"{reconnects}, viewer errors {len(errors)}")
    for name, values in figures:
        print(f"{name.replace('**', '')}: p50 {ms(pct(values, 50))} ms, p95 {ms(pct(values, 95))} ms, "
              f"p99 {ms(pct(values, 99))} ms, max {ms(pct(values, 100))} ms")
    print(f"target p95 {TARGET_P95_S * 1000:.0f} ms: {'met' if met else 'NOT met'}")
    print(f"app process: CPU {statistics.mean(cpu):.0f}% of a core on average (max {max(cpu):.0f}%), "
          f"RSS {statistics.mean(rss):.0f} MiB (max {max(rss):.0f} MiB); machine busy {statistics.mean(busy):.0f}%")
    for error in errors[:5]:
        print("viewer error:", error)

    m = machine()
    load = os.getloadavg()
    api_rows = [(name, len(v), pct(v, 50), pct(v, 99)) for name, v in api_times.items() if v]
    lines = [
        "# The live run page under load: server-sent events",
        "",
        f"- date: {datetime.now(UTC):%Y-%m-%d %H:%M UTC}",
        f"- machine: {m['host']}, {m['cpu']}, {m['cores']} cores (shared with other jobs), GPU {m['gpu']}, "
        f"Python {m['python']}, torch {m['torch']}; load average {load_text(load0)} at the start, "
        f"{load_text(load)} at the end (the app, Ray, the run and the clients all run on it)",
        "- app: `attnboard serve` (uvicorn, embedded Ray with 2 CPUs, engine host, supervisor), SQLite",
        f"- run: `worker.spec.presets.tiny_cpu_spec` on 1 rank, {args.steps} steps (cancelled after the measurement); "
        f"{len(counted)} events stored in the {window[1] - window[0]:.0f} s counted ({rate:.1f} per second: a "
        "metric per PPO step)",
        f"- load: {args.viewers} viewers (each loads `/runs/{{id}}` and follows its `sse-connect` stream; opened "
        f"evenly over {args.ramp:.0f} s) and {args.api_clients} API clients in a closed loop with no think time, "
        f"for {args.duration:.0f} s after the ramp",
        f"- command: `.venv/bin/python bench/bench_sse.py {' '.join(sys.argv[1:])}`",
        f"- target: event -> browser p95 <= {TARGET_P95_S:.0f} s",
        "",
        "\"event -> browser\": for each event and each viewer whose stream had to send it (the events after the",
        "page it loaded), from the moment the event's row was inserted into the database (a trigger in the",
        "benchmark's database notes SQLite's clock; the commit follows in the same transaction) to the moment the",
        "viewer read the SSE message carrying the event's `id`. Events stored in the last "
        f"{GRACE_S:.0f} s are not counted; one",
        "that never arrived counts as infinitely late. Clocks: one machine.",
        "",
        "| figure | p50 (ms) | p95 (ms) | p99 (ms) | max (ms) | count |",
        "| --- | --- | --- | --- | --- | --- |",
        *[f"| {name} | {ms(pct(v, 50))} | {ms(pct(v, 95))} | {ms(pct(v, 99))} | {ms(pct(v, 100))} | {len(v)} |"
          for name, v in figures],
        "",
        f"Target: p95 {ms(p[95])} ms, {'met' if met else 'NOT met'} (ratio {p[95] / TARGET_P95_S:.2f}). Deliveries "
        f"missing at the end: {missing}; viewers that lost or repeated an event: {broken}; reconnects: "
        f"{reconnects}; viewer errors: {len(errors)}.",
        "",
        "| process | CPU, mean (% of one core) | CPU, max | RSS, mean (MiB) | RSS, max (MiB) |",
        "| --- | --- | --- | --- | --- |",
        f"| app (uvicorn: pages, API, streams, supervisor) | {statistics.mean(cpu):.0f}% | {max(cpu):.0f}% | "
        f"{statistics.mean(rss):.0f} | {max(rss):.0f} |",
        f"| the viewers' client process | {100 * viewer_cpu / (end - start):.0f}% | | | |",
        f"| the API clients' process | {100 * api_cpu / (end - start):.0f}% | | | |",
        "",
        f"The machine's CPUs were {statistics.mean(busy):.0f}% busy on average during the measurement.",
        "",
        "The API clients meanwhile (request time: written -> last byte read):",
        "",
        "| read | requests | p50 (ms) | p99 (ms) |",
        "| --- | --- | --- | --- |",
        *[f"| {name} | {n} | {1000 * p50:.1f} | {1000 * p99:.1f} |" for name, n, p50, p99 in api_rows],
        "",
    ]
    write_result(args.out, "\n".join(lines))


if __name__ == "__main__":
    main()
