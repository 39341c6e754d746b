"""API read latency with a big database: 10,000 runs and 1,000,000 events (bulk-inserted with SQL, not
the API), read by 16 concurrent clients over HTTP from a real uvicorn server: the run list page, a run's
detail, and a run's events since a seq. Prints p50/p99 per read and backend and writes
bench/results/api_reads.md. Target: p99 <= 50 ms.

    .venv/bin/python bench/bench_api_reads.py                       # SQLite and PostgreSQL, full size
    .venv/bin/python bench/bench_api_reads.py --backends sqlite --runs 1000 --events 100000
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.db import make_engine, run_migrations  # noqa: E402
from app.services.ray_runtime import free_port  # noqa: E402

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
    now = datetime.now(timezone.utc)
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
            conn.execute("ANALYZE")
    return time.perf_counter() - t0


def serve(url: str, data_dir: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "ATTNBOARD_DATABASE_URL": url, "ATTNBOARD_DATA_DIR": str(data_dir)}
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "app.main:create_app", "--factory", "--port", str(port),
                             "--log-level", "warning"], env=env, cwd=ROOT)
    base = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(f"{base}/api/health", timeout=2).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("the app did not start")


def measure(base: str, runs: int, per_run: int, clients: int, requests: int) -> dict[str, list[float]]:
    reads = {
        "health (no database)": lambda rnd: "/api/health",
        "run list page": lambda rnd: f"/api/runs?limit=50&offset={rnd.randrange(0, max(runs - 50, 1))}",
        "run detail": lambda rnd: f"/api/runs/{rnd.randint(1, runs)}",
        "events since seq": lambda rnd: f"/api/runs/{rnd.randint(1, runs)}/events?after={rnd.randrange(per_run)}&limit=100",
    }
    times: dict[str, list[float]] = {name: [] for name in reads}
    lock = threading.Lock()

    def client(n: int) -> None:
        rnd = random.Random(n)
        with httpx.Client(base_url=base, timeout=60) as http:
            http.get("/api/health")
            for i in range(requests):
                name = list(reads)[i % len(reads)]
                t0 = time.perf_counter()
                resp = http.get(reads[name](rnd))
                elapsed = time.perf_counter() - t0
                assert resp.status_code == 200, resp.text
                with lock:
                    times[name].append(elapsed)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return times


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", nargs="+", default=["sqlite", "postgres"], choices=["sqlite", "postgres"])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=150, help="per client")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "api_reads.md")
    args = parser.parse_args()

    rows = []
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
            proc, base = serve(url, tmp / "data")
            try:
                per_run = args.events // args.runs
                measure(base, args.runs, per_run, args.clients, 6)  # warm-up
                passes = [(args.clients, measure(base, args.runs, per_run, args.clients, args.requests)),
                          (1, measure(base, args.runs, per_run, 1, args.requests * 2))]
            finally:
                proc.terminate()
                proc.wait(30)
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
    lines = [
        "# API reads under load",
        "",
        f"- date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M UTC}",
        f"- machine: {platform.platform()}, {os.cpu_count()} CPUs, load average {load[0]:.1f} / {load[1]:.1f} / "
        f"{load[2]:.1f} at the end (a shared machine)",
        f"- data: {args.runs:,} runs and {args.events:,} events inserted with SQL; {args.clients} concurrent clients "
        f"(threads, httpx) x {args.requests} requests against one uvicorn process",
        "- command: `.venv/bin/python bench/bench_api_reads.py " + " ".join(sys.argv[1:]) + "`",
        "- target: p99 <= 50 ms",
        "",
        "The `health (no database)` rows are the same server and clients on an endpoint that reads nothing: the",
        "floor this machine sets for any request at that concurrency. The 1-client rows are the service time",
        "without queueing (one request at a time).",
        "",
        "No index was added: \"events since seq\" is served by the UNIQUE(run_id, seq) index, a run's detail by",
        "its primary key, and the list page walks the primary key backwards (`ORDER BY id DESC LIMIT/OFFSET`).",
        "",
        "| backend | clients | read | requests | p50 (ms) | p99 (ms) | p99 / target |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        *[f"| {b} | {k} | {n} | {c} | {p50:.1f} | {p99:.1f} | {p99 / 50:.2f} |" for b, k, n, c, p50, p99 in rows],
        "",
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines), encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
