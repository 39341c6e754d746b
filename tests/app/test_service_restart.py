"""The embedded default, end to end: the app starts its own Ray head, is killed (SIGKILL) during a run,
starts again, reattaches to the same head through ``<DATA_DIR>/ray_head.json``, and the run finishes
with every event stored once; a graceful shutdown then stops the head it started."""

from __future__ import annotations

import shutil
import time

import httpx
import pytest

from app.services.ray_runtime import HEAD_RECORD, HeadRecord, pid_alive
from tests.app.service_support import (
    TERMINAL,
    AppProcess,
    all_events,
    app_env,
    held_by,
    ray_env,
    ray_query,
    tiny_run_spec,
    token_headers,
    wait_until,
)

pytestmark = pytest.mark.ray


def test_app_killed_during_a_run_restarts_and_the_run_finishes_once(tmp_path):
    data = tmp_path / "data"
    env = app_env(ray_env(None), data_dir=data, num_cpus=2)
    first = AppProcess(env, tmp_path / "app1.log")
    second = AppProcess(env, tmp_path / "app2.log")
    record = None
    try:
        first.start()
        record = HeadRecord.load(data / HEAD_RECORD)
        assert record is not None and record.address.startswith("127.0.0.1:") and pid_alive(record.pid)
        headers = token_headers(f"sqlite:///{data / 'attnboard.db'}")
        with httpx.Client(base_url=first.url, headers=headers, timeout=60) as client:
            resp = client.post("/api/runs", json={"name": "restart", "spec": tiny_run_spec(steps=3)})
            assert resp.status_code == 201, resp.text
            run_id = resp.json()["id"]
            wait_until(client, run_id, lambda r: r["status"] != "queued", timeout=300, what="the controller's first events")
        first.kill()

        second.start()
        assert HeadRecord.load(data / HEAD_RECORD) == record, "the restarted app must reattach to the same head"
        with httpx.Client(base_url=second.url, headers=headers, timeout=330) as client:
            deadline = time.monotonic() + 420
            while True:
                answer = client.get(f"/api/runs/{run_id}/wait", params={"timeout": 60}).json()
                if not answer["timed_out"] or time.monotonic() > deadline:
                    break
            run = answer["run"]
            assert run["status"] == "succeeded", (run["status"], run["status_reason"], second.tail())
            events = all_events(client, run_id)

        seqs = [e["seq"] for e in events]
        assert seqs == list(range(1, run["last_seq"] + 1)), "seqs contiguous from 1, none repeated"
        statuses = [e["payload"]["status"] for e in events if e["kind"] == "status"]
        assert statuses == ["queued", "starting", "running", "succeeded"]
        assert [e["payload"]["step"] for e in events if e["kind"] == "metric"] == [1, 2, 3]
        assert {row["role"]: row for row in answer["attention"]}["actor"]["effective"] == "sdpa"
        assert run["effective_attention"]["critic"] == "sdpa"

        time.sleep(2)  # the engine host drops the acknowledged run
        cluster = ray_query(record.address, ray_env(None))
        assert {n["address"] for n in cluster["nodes"]} == {"127.0.0.1"}
        assert held_by(cluster, run_id) == []

        assert second.stop() is not None
        deadline = time.monotonic() + 60
        while pid_alive(record.pid) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not pid_alive(record.pid), "a graceful shutdown with no active run stops the embedded head"
        assert not (data / HEAD_RECORD).exists()
    finally:
        first.kill()
        second.kill()
        if record is not None and pid_alive(record.pid):
            from app.services.ray_runtime import stop_head

            stop_head(record.pid)
        if record is not None:
            shutil.rmtree(record.temp_dir, ignore_errors=True)
    assert run["status"] in TERMINAL
