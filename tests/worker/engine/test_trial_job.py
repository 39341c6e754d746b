"""The trial as a job of the engine host (``worker.engine.trial_job``), driven here as the host drives it:
on a warm rank pool, in a local Ray. The measurement runs as trainers on the pool's ranks, the parity
check on a rank; a cancel ends it; columns measured by a host that died are kept, not run again."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.worker.engine.support import TINY
from worker.core.environment import PROFILES
from worker.engine.ranks import PoolSettings, RankPool
from worker.engine.trial import Column, StepFigures
from worker.engine.trial_job import TrialJob

pytestmark = pytest.mark.ray


def follow(job: TrialJob, until, timeout: float = 300) -> tuple[dict[str, Any], list[str]]:
    """Poll ``progress`` until ``until(progress)``: (the last progress, every reason seen in order)."""
    deadline = time.monotonic() + timeout
    reasons: list[str] = []
    while True:
        progress = job.progress()
        if not reasons or reasons[-1] != progress["reason"]:
            reasons.append(progress["reason"])
        if until(progress) or time.monotonic() > deadline:
            return progress, reasons
        time.sleep(0.1)


def test_a_job_keeps_the_columns_measured_before_and_measures_the_rest_on_the_pool(local_ray):
    kept = Column("eager", "ok", steps=[StepFigures(1, 100.0, 0.5, 300.0)], tokens_per_s=100.0, step_time_s=0.5,
                  step_time_spread=0.0, peak_memory_mb=300.0, observed={"actor": "eager"})
    pool = RankPool(PoolSettings(1, "cpu"))
    job = TrialJob("7", {"spec": TINY, "implementations": ["eager", "sdpa"], "steps": 1,
                         "environment": PROFILES["cpu"].to_dict()}, ranks=pool,
                   done=[kept.as_dict(), {**kept.as_dict(), "implementation": "sdpa", "status": "failed"}], attempt=1)
    assert job.progress()["state"] == "queued"
    job.start()
    progress, reasons = follow(job, lambda p: p["terminal"])
    assert progress["state"] == "succeeded", progress
    assert progress["reason"] == "eager, sdpa completed" and progress["error"] is None
    assert "measuring sdpa (2 of 2, 1 step)" in reasons and "measuring eager (1 of 2, 1 step)" not in reasons
    assert any(r.startswith("checking the logit parity of eager, sdpa with eager on a rank") for r in reasons)
    columns = {c["implementation"]: c for c in progress["result"]["columns"]}
    assert columns["eager"]["steps"] == [{"step": 1, "tokens_per_s": 100.0, "step_time_s": 0.5, "peak_memory_mb": 300.0}]
    assert columns["sdpa"]["status"] == "ok" and columns["sdpa"]["observed"]["actor"] == "sdpa"
    eager = columns["eager"]  # eager's own packed (remove-padding) case against its padded logits: rounding
    assert eager["parity_max_abs_diff"] == eager["packed_parity_max_abs_diff"] <= progress["result"]["tolerance"]
    assert eager["parity_ok"] and columns["sdpa"]["parity_ok"]
    assert columns["sdpa"]["packed_forward_tokens_per_s"] > 0
    assert progress["result"]["recommendation"]["implementation"] in ("eager", "sdpa")
    assert pool.status()["idle"] == 1  # the ranks went back to the pool


def test_a_cancelled_job_ends_cancelled_while_it_measures(local_ray):
    pool = RankPool(PoolSettings(1, "cpu"))
    job = TrialJob("8", {"spec": TINY, "implementations": ["sdpa", "eager"], "steps": 20,
                         "environment": PROFILES["cpu"].to_dict()}, ranks=pool)
    job.start()
    progress, _ = follow(job, lambda p: p["reason"].startswith("measuring sdpa") or p["terminal"])
    assert progress["state"] == "running", progress
    started = time.monotonic()
    ended = job.cancel("cancelled by the test")
    assert time.monotonic() - started < 25
    assert (ended["state"], ended["reason"], ended["terminal"]) == ("cancelled", "cancelled by the test", True)
    assert [c["implementation"] for c in (ended["result"] or {}).get("columns", [])] in ([], ["sdpa"])
