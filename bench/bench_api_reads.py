"""API read latency with a big database: 10,000 runs and 1,000,000 events (bulk-inserted with SQL, not
the API), read by 16 concurrent clients over HTTP from a real uvicorn server: the run list page, a run's
detail, and a run's events since a seq. Prints p50/p99 per read and backend and writes
bench/results/api_reads.md. Target: p99 <= 50 ms.

The clients are 16 kept-alive HTTP/1.1 connections driven by asyncio in one separate process (spawned,
so it shares nothing with this one), each sending its next request as soon as it has read the previous
answer (closed loop, no think time); the same process then runs one connection for the 1-client rows.

    .venv/bin/python bench/bench_api_reads.py                       # SQLite and PostgreSQL, full size
    .venv/bin/python bench/bench_api_reads.py --backends sqlite --runs 1000 --events 100000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common import http_get, proc_cpu_rss, run_async, write_result

from app.db import make_engine, run_migrations
from app.services.ray_runtime import free_port

PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
SPEC = {"trainer": {"device": "cpu", "n_gpus_per_node": 1, "nnodes": 1, "total_training_steps": 100},
        "actor_rollout_ref": {"model": {"path": "builtin:tiny-llama"}}}


def payload(seq: int) -> str:
    return json.dumps({"step": seq, "values": {"actor/pg_loss": 0.1 * (seq % 7), "critic/vf_loss": 0.5,
                                               "perf/tokens_per_s": 1234.5, "actor/kl": 0.001 * seq}})


def fill(url: str, runs: int, events: int) -> float:
    """Bulk insert with SQL: ``runs`` runs, ``events`` events spread evenly, seq contiguous per run."""
    t0 = time.perf_counter()
    per_run = events // runs
    now = datetime.now(UTC)
    spec = json.dumps(SPEC)
    if url.startswith("sqlite"):
        import sqlite3

        conn = sqlite3.connect(url.removeprefix("sqlite:///"))
        conn.execute("PRAGMA journal_mode=WAL")
        conn.executemany(
            "INSERT INTO run (id, name, spec, status, cancel_requested, created_at, step, total_steps, last_seq) "
            "VALUES (?, ?, ?, 'succeeded', 0, ?, 100, 100, ?)",
            ((i, f"run {i}", spec, (now - timedelta(minutes=runs - i)).isoformat(sep=" "), per_run)
             for i in range(1, runs + 1)))
        ts = now.isoformat(sep=" ")
        conn.executemany("INSERT INTO event (run_id, seq, kind, payload, ts) VALUES (?, ?, 'metric', ?, ?)",
                         ((r, s, payload(s), ts) for r in range(1, runs + 1) for s in range(1, per_run + 1)))
        conn.commit()
        conn.execute("ANALYZE")
        conn.close()
    else:
        import psycopg

        with psycopg.connect(url.replace("postgresql+psycopg", "postgresql")) as conn:
            with conn.cursor().copy("COPY run (id, name, spec, status, cancel_requested, created_at, step, total_steps, "
                                    "last_seq) FROM STDIN") as copy:
                for i in range(1, runs + 1):
                    copy.write_row((i, f"run {i}", spec, "succeeded", False, now - timedelta(minutes=runs - i), 100,
                                    100, per_run))
            with conn.cursor().copy("COPY event (run_id, seq, kind, payload, ts) FROM STDIN") as copy:
                for r in range(1, runs + 1):
                    for s in range(1, per_run + 1):
                        copy.write_row((r, s, "metric", payload(s), now))
            conn.execute("SELECT setval(pg_get_serial_sequence('run', 'id'), %s)", (runs,))
            conn.commit()
            # What autovacuum does after a bulk load (this machine's PostgreSQL runs with it off): statistics,
            # and the visibility map that lets the list page walk the primary key index alone.
            conn.autocommit = True
            conn.execute("VACUUM ANALYZE")
    return time.perf_counter() - t0


SERVERS = {
    "app": "one uvicorn process (`app.main:create_app`, no Ray, log level warning)",
    "serve": "`attnboard serve` as deployed: the served app with its embedded Ray head (2 CPUs), engine host, "
             "supervisor thread and uvicorn's access log",
}


def serve(url: str, data_dir: Path, server: str = "app") -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "ATTNBOARD_DATABASE_URL": url, "ATTNBOARD_DATA_DIR": str(data_dir)}
    if server == "app":
        command = [sys.executable, "-m", "uvicorn", "app.main:create_app", "--factory", "--port", str(port),
                   "--log-level", "warning"]
    else:
        env.update({"ATTNBOARD_RAY_NUM_CPUS": "2", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
                    "RAY_USAGE_STATS_ENABLED": "0"})
        command = [str(Path(sys.executable).with_name("attnboard")), "serve", "--port", str(port)]
    proc = subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    for _ in range(1200):
        try:
            if httpx.get(f"{base}/api/health", timeout=2).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("the app did not start")


READS = ("health (SELECT 1)", "run list page", "run detail", "events since seq")


def paths(read: str, rnd: random.Random, runs: int, per_run: int) -> str:
    if read == "health (SELECT 1)":
        return "/api/health"
    if read == "run list page":
        return f"/api/runs?limit=50&offset={rnd.randrange(0, max(runs - 50, 1))}"
    if read == "run detail":
        return f"/api/runs/{rnd.randint(1, runs)}"
    return f"/api/runs/{rnd.randint(1, runs)}/events?after={rnd.randrange(per_run)}&limit=100"


async def _load(host: str, port: int, runs: int, per_run: int, clients: int, requests: int
                ) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in READS}

    async def client(n: int) -> None:
        rnd = random.Random(n)
        reader, writer = await asyncio.open_connection(host, port)
        try:
            await http_get(reader, writer, host, "/api/health")
            for i in range(requests):
                read = READS[i % len(READS)]
                path = paths(read, rnd, runs, per_run)
                t0 = time.perf_counter()
                await http_get(reader, writer, host, path)
                times[read].append(time.perf_counter() - t0)
        finally:
            writer.close()

    await asyncio.gather(*(client(n) for n in range(clients)))
    return times


def _load_process(host: str, port: int, runs: int, per_run: int, clients: int, requests: int
                  ) -> tuple[dict[str, list[float]], float]:
    """The timings, and the CPU seconds the client process spent producing them."""
    cpu0 = time.process_time()
    times = run_async(_load(host, port, runs, per_run, clients, requests))
    return times, time.process_time() - cpu0


def measure(base: str, runs: int, per_run: int, clients: int, requests: int
            ) -> tuple[dict[str, list[float]], float]:
    """``clients`` connections in one separate client process (asyncio), each sending its next request as soon
    as the previous answer is read (closed loop, no think time), cycling through the four reads. Returns the
    seconds each request took, per read, and the client process's CPU seconds."""
    host, port = base.removeprefix("http://").split(":")
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(_load_process, host, int(port), runs, per_run, clients, requests).result()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a live process (Linux /proc), 0.0 where there is no /proc."""
    return proc_cpu_rss(pid)[0]


def stolen_seconds() -> float:
    """CPU time the hypervisor gave to other guests (the steal column of /proc/stat), 0.0 where unknown."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return 0.0
    return int(fields[8]) / os.sysconf("SC_CLK_TCK") if len(fields) > 8 else 0.0


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", nargs="+", default=["sqlite", "postgres"], choices=["sqlite", "postgres"])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=400, help="per client")
    parser.add_argument("--server", choices=list(SERVERS), default="app",
                        help="app: the FastAPI app alone; serve: `attnboard serve` with its embedded Ray")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "api_reads.md")
    args = parser.parse_args()

    rows = []
    cpu_rows = []
    for backend in args.backends:
        tmp = Path(tempfile.mkdtemp(prefix="attnboard-bench-"))
        pg_name = None
        if backend == "sqlite":
            url = f"sqlite:///{tmp / 'attnboard.db'}"
        else:
            import psycopg

            pg_name = f"attnboard_bench_{uuid.uuid4().hex[:8]}"
            with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
                conn.execute(f'CREATE DATABASE "{pg_name}"')
            url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{pg_name}"
        try:
            run_migrations(url)
            make_engine(url).dispose()
            fill_s = fill(url, args.runs, args.events)
            print(f"{backend}: inserted {args.runs} runs and {args.events} events in {fill_s:.1f} s", flush=True)
            proc, base = serve(url, tmp / "data", args.server)
            try:
                per_run = args.events // args.runs
                measure(base, args.runs, per_run, args.clients, 6)  # warm-up
                server0, stolen0, wall0 = cpu_seconds(proc.pid), stolen_seconds(), time.perf_counter()
                loaded, client_cpu = measure(base, args.runs, per_run, args.clients, args.requests)
                count = sum(len(v) for v in loaded.values())
                cpu_rows.append((backend, 1000 * (cpu_seconds(proc.pid) - server0) / count, 1000 * client_cpu / count,
                                 100 * (stolen_seconds() - stolen0) / ((time.perf_counter() - wall0) * os.cpu_count())))
                passes = [(args.clients, loaded), (1, measure(base, args.runs, per_run, 1, args.requests * 2)[0])]
            finally:
                proc.terminate()
                proc.wait(120)
            for clients, times in passes:
                for name, values in times.items():
                    p50, p99 = pct(values, 50), pct(values, 99)
                    rows.append((backend, clients, name, len(values), p50, p99))
                    print(f"{backend:8} {clients:2} clients {name:20} n={len(values):5}  p50 {p50:7.1f} ms  "
                          f"p99 {p99:7.1f} ms  p99/target {p99 / 50:.2f}", flush=True)
        finally:
            if pg_name:
                import psycopg

                with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
                    conn.execute(f'DROP DATABASE IF EXISTS "{pg_name}" WITH (FORCE)')

    load = os.getloadavg()
    reads = [r for r in READS if not r.startswith("health")]
    verdicts = []
    for backend in args.backends:
        worst = {n: p99 for b, k, n, c, p50, p99 in rows if b == backend and k == args.clients and n in reads}
        met = [n for n in reads if worst[n] <= 50]
        verdicts.append(f"- {backend}: " + ("target met for all three reads" if len(met) == len(reads) else
                        "target met for " + (", ".join(met) or "none") + "; not met for "
                        + ", ".join(n for n in reads if n not in met))
                        + f" (worst p99 {max(worst.values()):.1f} ms under {args.clients} clients)")
    lines = [
        "# API reads under load",
        "",
        f"- date: {datetime.now(UTC):%Y-%m-%d %H:%M UTC}",
        f"- machine: {platform.platform()}, {os.cpu_count()} CPUs, load average {load[0]:.1f} / {load[1]:.1f} / "
        f"{load[2]:.1f} at the end (a shared machine; server, clients and PostgreSQL all run on it)",
        f"- data: {args.runs:,} runs and {args.events:,} events inserted with SQL (then `ANALYZE` on SQLite,",
        "  `VACUUM ANALYZE` on PostgreSQL)",
        f"- load: {args.clients} concurrent clients x {args.requests} requests each, closed loop with no think time,",
        f"  against {SERVERS[args.server]}; then 1 client x {args.requests * 2}",
        "- command: `.venv/bin/python bench/bench_api_reads.py " + " ".join(sys.argv[1:]) + "`",
        "- target: p99 <= 50 ms for the three reads, on SQLite and on PostgreSQL",
        "",
        "How the clients work: one separate client process (spawned, sharing nothing with the server) runs",
        f"asyncio (uvloop) with {args.clients} kept-alive HTTP/1.1 connections, one per client. Each connection",
        "writes a raw `GET` request, reads the status line, the headers and the whole `Content-Length` body,",
        "checks the status is 200, and sends its next request at once. Each client cycles through the four",
        "reads: health, the list page at a random offset with limit 50, a random run's detail, a random run's",
        "events after a random seq with limit 100.",
        "A request's time runs from writing it to having read its last byte. The 1-client rows are the same",
        "process with one connection: the service time without queueing.",
        "",
        "The `health (SELECT 1)` rows are the floor this machine sets for any request at that concurrency: the",
        "same server and clients on the cheapest endpoint, which only asks the database for `SELECT 1`.",
        "",
        "Target:",
        *verdicts,
        "",
        "| backend | clients | read | requests | p50 (ms) | p99 (ms) | p99 / target |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        *[f"| {b} | {k} | {n} | {c} | {p50:.1f} | {p99:.1f} | {p99 / 50:.2f} |" for b, k, n, c, p50, p99 in rows],
        "",
        f"CPU time per request during the {args.clients}-client pass (all four reads together): the server process",
        "against the client process, which shows the clients are not what limits the rate; and the share of the",
        "machine's CPU time the hypervisor gave to other guests meanwhile (steal), which slows both alike.",
        "",
        "| backend | server CPU per request (ms) | client CPU per request (ms) | CPU stolen by the host |",
        "| --- | --- | --- | --- |",
        *[f"| {b} | {server:.2f} | {client:.2f} | {steal:.0f}% |" for b, server, client, steal in cpu_rows],
        "",
        "How the reads are served: `app/services/reads.py` (one Core statement per read, the body built once",
        "with orjson, stored JSON spliced in unparsed), on the event loop (SQLite in place, PostgreSQL through",
        "psycopg's async connection pool); anonymous requests skip authentication work; the cyclic GC is frozen",
        "after start-up (`app/deps.py`). No index was added: \"events since seq\" is served by the",
        "UNIQUE(run_id, seq) index, a run's detail by its primary key, and the list page walks the primary key",
        "backwards to its offset reading ids only, then reads its 50 rows; its `total` is a `count(*)` in the",
        "same statement.",
        "",
    ]
    write_result(args.out, "\n".join(lines))


if __name__ == "__main__":
    main()
