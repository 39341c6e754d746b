"""Real processes for the service tests: a Ray head (``ray start --head --block`` on 127.0.0.1 with Ray's
token authentication), the app as a uvicorn subprocess (``attnboard serve``), and questions to the
cluster asked from a separate Python process (so this test process never becomes a Ray driver)."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from app.services.ray_runtime import HeadRecord, free_port, pid_alive, ray_token_available, start_head, stop_head

ROOT = Path(__file__).resolve().parents[2]
ATTNBOARD = str(Path(sys.executable).with_name("attnboard"))
TERMINAL = {"succeeded", "failed", "cancelled"}


def ray_env(token: str | None) -> dict[str, str]:
    """This process's environment for Ray on loopback; with ``token``, Ray's token authentication."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ATTNBOARD_", "RAY_AUTH"))}
    env.update({"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"})
    if token:
        env.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token})
    elif ray_token_available(env):
        env["RAY_AUTH_MODE"] = "token"  # what the app does (and Ray does for local clusters) with a token at hand
    return env


@dataclass
class RayHead:
    record: HeadRecord
    env: dict[str, str]

    @classmethod
    def start(cls, data_dir: Path, *, num_cpus: int = 4, token: str | None = None) -> RayHead:
        token = token or secrets.token_hex(24)
        data_dir.mkdir(parents=True, exist_ok=True)
        env = ray_env(token)
        return cls(start_head(data_dir, num_cpus=num_cpus, env=env), env)

    @property
    def address(self) -> str:
        return self.record.address

    def stop(self) -> None:
        stop_head(self.record.pid)
        shutil.rmtree(self.record.temp_dir, ignore_errors=True)


QUERY = r"""
import json, sys, ray
ray.init(address=sys.argv[1], namespace="attnboard", logging_level="ERROR", log_to_driver=False)
from ray.util import list_named_actors
actors = sorted(a["name"] for a in list_named_actors(all_namespaces=True) if a["namespace"] == "attnboard")
runs, hosts = {}, {}
for name in [a for a in actors if a.startswith("attnboard-engine")]:  # the app's host: attnboard-engine-<hash>
    host = ray.get_actor(name, namespace="attnboard")
    hosts[name] = ray.get(host.pid.remote())
    for run_id in ray.get(host.run_ids.remote()):
        try:
            runs[run_id] = ray.get(host.held_pids.remote(run_id))
        except Exception:
            pass  # dropped meanwhile
print("RESULT " + json.dumps({
    "nodes": [{"address": n["NodeManagerAddress"], "alive": n["Alive"]} for n in ray.nodes()],
    "actors": actors,
    "runs": runs,
    "hosts": hosts,
}))
"""


def held_by(cluster: dict[str, Any], run_id: int) -> list[str]:
    """What a run still holds in the cluster: its place in the engine host and the rank processes it has
    (``run 7``, ``pid 1234``); empty once the run let go of its ranks and the host dropped it."""
    pids = cluster["runs"].get(str(run_id))
    return [] if pids is None else [f"run {run_id}"] + [f"pid {pid}" for pid in pids]


def ray_query(address: str, env: dict[str, str]) -> dict[str, Any]:
    """Ray's nodes and the live named actors of namespace attnboard, asked by a separate driver process."""
    proc = subprocess.run([sys.executable, "-c", QUERY, address], env=env, capture_output=True, text=True, timeout=180)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line is not None, f"ray query failed ({proc.returncode}): {proc.stderr[-2000:]}"
    return json.loads(line[len("RESULT "):])


@dataclass
class AppProcess:
    """``attnboard serve`` on a free loopback port, its output in ``log``."""

    env: dict[str, str]
    log: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 240) -> AppProcess:
        self.port = free_port()
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen([ATTNBOARD, "serve", "--port", str(self.port)], env=self.env, cwd=ROOT,
                                         stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while True:
            assert self.proc.poll() is None, f"the app exited with {self.proc.returncode}:\n{self.tail()}"
            try:
                if httpx.get(f"{self.url}/api/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"the app did not answer within {timeout} s:\n{self.tail()}"
            time.sleep(0.5)

    def tail(self, n: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-n:] if self.log.exists() else ""

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def stop(self, timeout: float = 120) -> int | None:
        """SIGTERM, a graceful shutdown; SIGKILL if it takes longer than ``timeout``."""
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None


def app_env(base: dict[str, str], *, data_dir: Path, database_url: str | None = None,
            ray_address: str | None = None, num_cpus: int = 4) -> dict[str, str]:
    env = {**base, "ATTNBOARD_DATA_DIR": str(data_dir), "ATTNBOARD_RAY_NUM_CPUS": str(num_cpus)}
    if database_url:
        env["ATTNBOARD_DATABASE_URL"] = database_url
    if ray_address:
        env["ATTNBOARD_RAY_ADDRESS"] = ray_address
    return env


def token_headers(database_url: str) -> dict[str, str]:
    """A write token made straight in the (migrated) database."""
    from sqlmodel import Session

    from app.db import make_engine
    from app.services.tokens import create_token

    engine = make_engine(database_url)
    try:
        with Session(engine) as session:
            _, secret = create_token(session, name=f"service-test-{secrets.token_hex(3)}", scopes=["read", "write"])
    finally:
        engine.dispose()
    return {"Authorization": f"Bearer {secret}"}


def tiny_run_spec(*, steps: int = 2, ranks: int = 1, **overrides: Any) -> dict[str, Any]:
    """The smallest CPU run (worker.spec.presets.tiny_cpu_spec) as the spec tree the API takes."""
    from worker.spec import spec_to_tree
    from worker.spec.presets import tiny_cpu_spec

    return spec_to_tree(tiny_cpu_spec(**{"trainer.total_training_steps": steps, "trainer.n_gpus_per_node": ranks,
                                         **overrides}))


def wait_until(client: httpx.Client, run_id: int, predicate, *, timeout: float, what: str) -> dict[str, Any]:
    """Poll the run until ``predicate(run)``; fails naming ``what`` and the run's last state."""
    deadline = time.monotonic() + timeout
    run: dict[str, Any] = {}
    while time.monotonic() < deadline:
        run = client.get(f"/api/runs/{run_id}").json()
        if predicate(run):
            return run
        time.sleep(0.5)
    raise AssertionError(f"run {run_id}: {what} not reached in {timeout} s; last seen {run.get('status')} "
                         f"({run.get('status_reason')}), last_seq {run.get('last_seq')}")


def all_events(client: httpx.Client, run_id: int) -> list[dict[str, Any]]:
    events, after = [], 0
    while True:
        page = client.get(f"/api/runs/{run_id}/events", params={"after": after, "limit": 1000}).json()
        events += page["data"]
        if not page["data"]:
            return events
        after = page["next_after"]


def process_gone(pid: int) -> bool:
    """Dead or a zombie (killed, not yet reaped by its parent)."""
    if not pid_alive(pid):
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True
