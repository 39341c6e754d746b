"""Cluster mode for real, with the commands docker-compose.yml runs: a Ray head started separately
(``ray start --head --node-ip-address=127.0.0.1``) with Ray's token authentication, the app
(``attnboard serve``) on a fresh PostgreSQL database pointed at it with ``ATTNBOARD_RAY_ADDRESS``. A
tiny run submitted over HTTP succeeds and all its events are in PostgreSQL."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid

import httpx
import psycopg
import pytest

from tests.app.service_support import (
    QUERY,
    AppProcess,
    RayHead,
    app_env,
    ray_env,
    ray_query,
    tiny_run_spec,
    token_headers,
)

pytestmark = [pytest.mark.ray, pytest.mark.postgres]

PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"


@pytest.fixture
def pg_url():
    name = f"attnboard_cluster_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield f"postgresql://postgres@127.0.0.1:5432/{name}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_app_on_postgresql_with_a_separate_ray_head_runs_a_spec_to_the_end(tmp_path, pg_url):
    head = RayHead.start(tmp_path / "ray", num_cpus=2)
    app = AppProcess(app_env(head.env, data_dir=tmp_path / "data", database_url=pg_url, ray_address=head.address),
                     tmp_path / "app.log")
    try:
        assert head.env["RAY_AUTH_MODE"] == "token" and head.env["RAY_AUTH_TOKEN"]
        app.start()
        headers = token_headers(pg_url)
        with httpx.Client(base_url=app.url, headers=headers, timeout=330) as client:
            resp = client.post("/api/runs", json={"name": "cluster", "spec": tiny_run_spec(steps=2)})
            assert resp.status_code == 201, resp.text
            run_id = resp.json()["id"]
            deadline = time.monotonic() + 600
            while True:
                answer = client.get(f"/api/runs/{run_id}/wait", params={"timeout": 120}).json()
                if not answer["timed_out"] or time.monotonic() > deadline:
                    break
        assert answer["run"]["status"] == "succeeded", (answer["run"]["status_reason"], app.tail())

        with psycopg.connect(pg_url) as conn:
            seqs = [row[0] for row in conn.execute("SELECT seq FROM event WHERE run_id = %s ORDER BY seq", (run_id,))]
            status, last_seq = conn.execute("SELECT status, last_seq FROM run WHERE id = %s", (run_id,)).fetchone()
            kinds = {row[0] for row in conn.execute("SELECT DISTINCT kind FROM event WHERE run_id = %s", (run_id,))}
        assert status == "succeeded"
        assert seqs == list(range(1, last_seq + 1))
        assert {"status", "env_probe", "attention", "metric"} <= kinds

        cluster = ray_query(head.address, head.env)
        assert {n["address"] for n in cluster["nodes"]} == {"127.0.0.1"}
        assert len(cluster["hosts"]) == 1  # the app's engine host, with its warm rank
        app.stop()
        assert ray_query(head.address, head.env)["hosts"] == {}  # a graceful stop with no active run frees it

        # Ray's token is really required: a driver with another token is refused.
        wrong = {**ray_env(None), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "not-the-token-" + "x" * 20}
        try:
            refused = subprocess.run([sys.executable, "-c", QUERY, head.address], env=wrong, capture_output=True,
                                     text=True, timeout=60)
            assert refused.returncode != 0 and "RESULT" not in refused.stdout
        except subprocess.TimeoutExpired:
            pass  # Ray keeps retrying an unauthenticated driver: refused all the same
    finally:
        app.stop()
        head.stop()
