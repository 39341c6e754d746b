"""Submit -> first ``metric`` event on a warm app with the tiny CPU model, with and without warm rank
workers, side by side: for each mode the app is started (``attnboard serve``, embedded Ray, 2 CPUs),
one run warms it up, then N runs are submitted one after another; for each, the time from
``POST /api/runs`` to the first stored ``metric`` event, split at the first stored event (the run is in
the engine host) and the ``rank workers up`` log (its ranks are up). Prints the medians and their
ratio and writes bench/results/submit.md. Target: median <= 3 s (warm app, default settings).

    .venv/bin/python bench/bench_submit.py --runs 5
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common import write_result

from tests.app.service_support import AppProcess, app_env, ray_env, tiny_run_spec, token_headers


def one_run(client: httpx.Client, spec: dict, timeout: float = 900) -> dict[str, float]:
    t0 = time.perf_counter()
    resp = client.post("/api/runs", json={"name": "bench-submit", "spec": spec})
    assert resp.status_code == 201, resp.text
    run_id = resp.json()["id"]
    marks: dict[str, float] = {"accepted": time.perf_counter() - t0}
    after = 0
    while time.perf_counter() - t0 < timeout:
        page = client.get(f"/api/runs/{run_id}/events", params={"after": after, "limit": 1000}).json()
        now = time.perf_counter() - t0
        for event in page["data"]:
            marks.setdefault("first event", now)
            if event["kind"] == "log" and "pids" in event["payload"]:
                marks.setdefault("ranks up", now)
            if event["kind"] == "metric":
                marks["first metric"] = now
                client.post(f"/api/runs/{run_id}/cancel")
                wait = client.get(f"/api/runs/{run_id}/wait", params={"timeout": 120}, timeout=180).json()
                assert wait["run"]["status"] in ("cancelled", "succeeded"), wait["run"]
                return marks
            if event["kind"] == "status" and event["payload"].get("status") == "failed":
                raise SystemExit(f"run {run_id} failed: {event['payload'].get('reason')}")
        after = page["next_after"]
        time.sleep(0.05)
    raise SystemExit(f"run {run_id}: no metric event within {timeout} s")


MODES = {  # name -> ATTNBOARD_WARM_RANKS
    "warm ranks (default, WARM_RANKS=1)": 1,
    "no warm ranks (WARM_RANKS=0)": 0,
}


def measure(warm_ranks: int, runs: int) -> tuple[float, dict[str, float], list[dict[str, float]]]:
    """(app start-up s, warm-up run marks, marks of each measured run) for one setting of WARM_RANKS."""
    tmp = Path(tempfile.mkdtemp(prefix="attnboard-bench-submit-"))
    env = {**app_env(ray_env(None), data_dir=tmp / "data", num_cpus=2), "ATTNBOARD_WARM_RANKS": str(warm_ranks)}
    app = AppProcess(env, tmp / "app.log")
    t0 = time.perf_counter()
    app.start()
    startup = time.perf_counter() - t0
    spec = tiny_run_spec(steps=50)
    results = []
    try:
        headers = token_headers(f"sqlite:///{tmp / 'data' / 'attnboard.db'}")
        with httpx.Client(base_url=app.url, headers=headers, timeout=60) as client:
            warm = one_run(client, spec)
            print(f"WARM_RANKS={warm_ranks} warm-up run: first metric after {warm['first metric']:.2f} s", flush=True)
            for i in range(runs):
                marks = one_run(client, spec)
                results.append(marks)
                print(f"WARM_RANKS={warm_ranks} run {i + 1}: " + ", ".join(f"{k} {v:.2f} s" for k, v in marks.items()),
                      flush=True)
    finally:
        app.stop()
    return startup, warm, results


def median(results: list[dict[str, float]], key: str) -> float:
    return statistics.median(m[key] for m in results if key in m)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "submit.md")
    args = parser.parse_args()

    measured = {name: measure(warm_ranks, args.runs) for name, warm_ranks in MODES.items()}
    (_, (_, _, warm_runs)), (_, (_, _, cold_runs)) = measured.items()
    warm_first, cold_first = median(warm_runs, "first metric"), median(cold_runs, "first metric")
    print(f"median submit -> first metric: {warm_first:.2f} s with warm ranks, {cold_first:.2f} s without "
          f"({cold_first / warm_first:.1f}x); target 3 s, ratio {warm_first / 3:.2f}")

    load = os.getloadavg()
    lines = [
        "# Submit -> first metric event",
        "",
        f"- date: {datetime.now(UTC):%Y-%m-%d %H:%M UTC}",
        f"- machine: {platform.platform()}, {os.cpu_count()} CPUs, load average {load[0]:.1f} / {load[1]:.1f} / "
        f"{load[2]:.1f} at the end (a shared machine)",
        "- app: `attnboard serve`, embedded Ray (2 CPUs), SQLite; one warm-up run first, then the runs one after "
        "another",
        "- run: `worker.spec.presets.tiny_cpu_spec` with 1 rank (`trainer.n_gpus_per_node=1`), cancelled after its first "
        "metric",
        f"- command: `.venv/bin/python bench/bench_submit.py {' '.join(sys.argv[1:])}`",
        "- target: median <= 3 s on a warm app with the default settings",
        "",
        "| mode | app start (s) | warm-up run: first metric (s) | run | accepted (s) | first event (s) | "
        "ranks up (s) | first metric (s) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, (startup, warm, results) in measured.items():
        for i, m in enumerate(results):
            lines.append(f"| {name} | {startup:.1f} | {warm['first metric']:.2f} | {i + 1} | {m['accepted']:.2f} | "
                         f"{m.get('first event', float('nan')):.2f} | {m.get('ranks up', float('nan')):.2f} | "
                         f"{m['first metric']:.2f} |")
        lines.append(f"| {name} | | | **median** | {median(results, 'accepted'):.2f} | "
                     f"{median(results, 'first event'):.2f} | {median(results, 'ranks up'):.2f} | "
                     f"**{median(results, 'first metric'):.2f}** |")
    lines += [
        "",
        f"Median submit -> first metric with warm ranks: **{warm_first:.2f} s** (target 3 s: "
        f"{'met' if warm_first <= 3 else 'NOT met'}, ratio {warm_first / 3:.2f}); without warm ranks "
        f"{cold_first:.2f} s, {cold_first / warm_first:.1f}x slower.",
        "",
        "How: every run's controller is a thread of the engine host (`worker/engine/host.py`), a detached Ray actor "
        "that imported torch, transformers and the engine once, when the app started; with warm ranks, the run's "
        "rank actors come from the host's pool (`worker/engine/ranks.py`) instead of new processes, and go back "
        "to it when the run succeeds or is cancelled cleanly. What is left is loading the roles (tiny models from "
        "the local cache), the first PPO step, and the app's supervisor pass that stores the event (<= 0.25 s). "
        "Without warm ranks each run waits for a new rank process to import torch and the engine (`ranks up`).",
        "",
    ]
    write_result(args.out, "\n".join(lines))


if __name__ == "__main__":
    main()
