"""The service on a real Ray head (one per module, ``ray start --head`` on 127.0.0.1 with Ray's token
authentication) and the app as a uvicorn subprocess on SQLite: nodes on loopback, a rank killed, the
engine host killed (its restartable run resumes through a new host), the queue's reasons, Ray
unreachable at submit, and 20 concurrent clients."""

from __future__ import annotations

import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from app.services.ray_runtime import free_port
from tests.app.service_support import (
    TERMINAL,
    AppProcess,
    RayHead,
    all_events,
    app_env,
    held_by,
    process_gone,
    ray_query,
    tiny_run_spec,
    token_headers,
    wait_until,
)
from tests.utils.checkpoints import assert_same_weights, full_weights
from worker.engine import checkpoint

pytestmark = pytest.mark.ray

CLUSTER_CPUS = 4
TOO_BIG = 16  # ranks: more than the cluster has in all, so such runs are refused (409)


def too_big_spec() -> dict:
    return tiny_run_spec(ranks=TOO_BIG, **{"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 1,
                                           "critic.ppo_micro_batch_size_per_gpu": 1})


@pytest.fixture(scope="module")
def head(tmp_path_factory: pytest.TempPathFactory):
    ray_head = RayHead.start(tmp_path_factory.mktemp("ray-head"), num_cpus=CLUSTER_CPUS)
    yield ray_head
    ray_head.stop()


@pytest.fixture(scope="module")
def served(head: RayHead, tmp_path_factory: pytest.TempPathFactory):
    data = tmp_path_factory.mktemp("app")
    app = AppProcess(app_env(head.env, data_dir=data / "data", ray_address=head.address), data / "app.log").start()
    headers = token_headers(f"sqlite:///{data / 'data' / 'attnboard.db'}")
    with httpx.Client(base_url=app.url, headers=headers, timeout=60) as client:
        yield app, client
    app.stop()


def rank_pids(app: AppProcess, client: httpx.Client, run_id: int, timeout: float = 300) -> list[int]:
    """The pids of the run's rank processes, from its ``rank workers up`` log event (waits for it)."""
    deadline = time.monotonic() + timeout
    while True:
        pids = next((e["payload"]["pids"] for e in all_events(client, run_id)
                     if e["kind"] == "log" and "pids" in e["payload"]), [])
        if pids:
            return pids
        assert time.monotonic() < deadline, f"no 'rank workers up' event; {app.tail()}"
        time.sleep(0.5)


def test_every_ray_node_is_on_loopback(head: RayHead):
    nodes = ray_query(head.address, head.env)["nodes"]
    assert nodes and all(n["address"] == "127.0.0.1" for n in nodes), nodes


def test_a_killed_rank_fails_the_run_within_15_s_and_leaves_no_actor(served, head: RayHead):
    """With attnboard.max_restarts=0 a dead rank ends the run (tests/worker/engine/test_engine_resume.py restarts one)."""
    app, client = served
    resp = client.post("/api/runs", json={"name": "rank-kill", "spec": tiny_run_spec(
        steps=200, **{"attnboard.max_restarts": 0})})
    assert resp.status_code == 201, resp.text
    run_id = resp.json()["id"]

    pids = rank_pids(app, client, run_id)
    killed_at = time.monotonic()
    os.kill(pids[0], signal.SIGKILL)

    run = wait_until(client, run_id, lambda r: r["status"] == "failed", timeout=15, what="failed after the kill")
    assert time.monotonic() - killed_at <= 15
    errors = [e["payload"] for e in all_events(client, run_id) if e["kind"] == "error"]
    assert errors and "rank 0" in errors[0]["message"], errors
    assert "rank 0" in run["status_reason"]
    entries = client.get("/api/troubleshooting", params={"run_id": run_id}).json()["data"]
    assert any("rank 0" in entry["error"] for entry in entries), entries  # the cause in the troubleshooting log

    deadline = time.monotonic() + 60
    while True:
        left = held_by(ray_query(head.address, head.env), run_id)
        if not left and all(process_gone(pid) for pid in pids):
            break
        assert time.monotonic() < deadline, f"still alive: {left}"
        time.sleep(1)


def _done(client: httpx.Client, run_id: int, timeout: float = 300) -> dict:
    return wait_until(client, run_id, lambda r: r["status"] in TERMINAL, timeout=timeout, what="its end")


def test_a_dead_engine_host_restarts_its_run_through_a_new_host_from_its_checkpoint(served, head: RayHead):
    """Two runs in one host: B (10 steps, a checkpoint every 2) is held in its step-8 save (rank 1 writes into a
    FIFO, as on a hung filesystem) and A may not restart (max_restarts=0; held in a save too, so it stops taking
    CPU). The host is SIGKILLed: A fails naming the host; B restarts in a new host from step 6, skips the
    interrupted write, and ends with one metric per step and the weights of an uninterrupted run of the same
    spec. A is then resumed from its newest checkpoint (POST .../resume)."""
    app, client = served
    # 1 CPU per rank, set: both runs fit the 4 CPUs side by side (a derived share would give A all of them)
    spec = tiny_run_spec(steps=10, ranks=2, **{"trainer.save_freq": 2, "attnboard.rank_cpus": 1})
    reference = _done(client, client.post("/api/runs", json={"name": "reference", "spec": spec}).json()["id"])
    assert reference["status"] == "succeeded", reference["status_reason"]
    ref_folder = Path(client.get(f"/api/runs/{reference['id']}/checkpoints").json()["folder"])

    a = client.post("/api/runs", json={"name": "no-restart", "spec": tiny_run_spec(
        steps=200, **{"attnboard.max_restarts": 0, "trainer.save_freq": 2, "attnboard.rank_cpus": 1})}).json()["id"]
    b = client.post("/api/runs", json={"name": "host-kill", "spec": spec}).json()["id"]

    def hold(run_id: int, step: int, rank: int) -> Path:
        """A FIFO where ``rank`` writes its RNG file in the run's save of ``step``: the save waits there."""
        held = checkpoint.partial_folder(Path(client.get(f"/api/runs/{run_id}/checkpoints").json()["folder"]),
                                         step, str(run_id)) / checkpoint.RNG_FOLDER
        held.mkdir(parents=True)
        os.mkfifo(held / f"rank_{rank}.pt")
        return held

    rank_pids(app, client, a)  # its ranks are up: its first scan of its folder is done
    hold(a, 6, 0)
    rank_pids(app, client, b)
    held = hold(b, 8, 1)
    folder = held.parent.parent
    wait_until(client, b, lambda r: (held / "rank_0.pt").exists(), timeout=120, what="held in its step-8 save")
    assert client.get(f"/api/runs/{b}").json()["step"] <= 8
    hosts = ray_query(head.address, head.env)["hosts"]
    assert len(hosts) == 1, hosts  # this app's host, attnboard-engine-<hash of its database>
    (name, host_pid), = hosts.items()
    assert name.startswith("attnboard-engine-")
    os.kill(host_pid, signal.SIGKILL)

    failed = wait_until(client, a, lambda r: r["status"] == "failed", timeout=60, what="failed with its host")
    assert "engine host" in failed["status_reason"] and failed["restarts"] == 0, failed["status_reason"]
    run = _done(client, b)
    assert run["status"] == "succeeded" and run["restarts"] == 1, (run["status_reason"], app.tail())
    events = all_events(client, b)
    assert [e["seq"] for e in events] == list(range(1, run["last_seq"] + 1))
    assert [e["payload"]["step"] for e in events if e["kind"] == "metric"] == list(range(1, 11))
    assert "failed" not in [e["payload"]["status"] for e in events if e["kind"] == "status"]
    restart, = [e["payload"] for e in events if e["kind"] == "restart"]
    assert (restart["source"], restart["attempt"], restart["resumed_from_step"]) == ("app", 1, 6)
    assert "the engine host is gone" in restart["cause"] and restart["checkpoint"] == str(folder / "global_step_6")
    skipped = [e["payload"]["message"] for e in events if e["kind"] == "log" and "skipped_checkpoint" in e["payload"]]
    assert skipped == [f"skipped global_step_8.partial-{b} in {folder}: an unfinished write (no rename to its final "
                       f"name): interrupted; removed"]
    listed = client.get(f"/api/runs/{b}/checkpoints").json()
    assert [c["step"] for c in listed["data"]] == [2, 4, 6, 8, 10] and listed["skipped"] == []
    assert_same_weights(full_weights(folder / "global_step_10"), full_weights(ref_folder / "global_step_10"))
    assert ray_query(head.address, head.env)["hosts"].get(name) not in (None, host_pid)  # a new host, same name

    saved = [c for c in client.get(f"/api/runs/{a}/checkpoints").json()["data"] if c["resumable"]]
    assert saved, "A saved at least once before the host died"
    resumed = client.post(f"/api/runs/{a}/resume", json={"patch": {"trainer.total_training_steps": saved[-1]["step"] + 2}})
    assert resumed.status_code == 201, resumed.text
    c = _done(client, resumed.json()["id"])
    assert c["status"] == "succeeded" and c["retry_of"] == a, c["status_reason"]
    assert [e["payload"]["step"] for e in all_events(client, c["id"]) if e["kind"] == "metric"] == \
        [saved[-1]["step"] + 1, saved[-1]["step"] + 2]


def test_a_run_the_cluster_can_never_fit_is_refused_with_409_naming_the_resources(served):
    """Preflight at submit: more ranks than the cluster has CPUs in all would wait forever, so it is refused
    (the key, the value, the rank count that fits); nothing is stored."""
    _, client = served
    before = client.get("/api/runs", params={"limit": 1}).json()["total"]
    resp = client.post("/api/runs", json={"name": "too-big", "spec": too_big_spec()})
    assert resp.status_code == 409, resp.text
    error = resp.json()["error"]
    assert error["code"] == "never_fits" and error["field"] == "trainer.n_gpus_per_node" and error["value"] == TOO_BIG
    assert f"{TOO_BIG} CPU" in error["message"] and f"{CLUSTER_CPUS} CPU" in error["message"]
    assert error["valid"] == f"at most {CLUSTER_CPUS}"
    assert client.get("/api/runs", params={"limit": 1}).json()["total"] == before


def test_a_queued_run_starts_when_the_run_before_it_frees_its_cpus(served):
    _, client = served
    # the first run's 2 ranks hold 1 CPU each (set: a derived share would give them all 4)
    first = client.post("/api/runs", json={"name": "fifo-1", "spec": tiny_run_spec(
        steps=1, ranks=2, **{"attnboard.rank_cpus": 1})}).json()["id"]
    wait_until(client, first, lambda r: r["ray_job"] is not None, timeout=30, what="launched")
    second = client.post("/api/runs", json={"name": "fifo-2", "spec": tiny_run_spec(
        steps=1, ranks=CLUSTER_CPUS, **{"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 1,
                                        "critic.ppo_micro_batch_size_per_gpu": 1})}).json()["id"]
    waiting = wait_until(client, second, lambda r: (r["status_reason"] or "").startswith("waiting"), timeout=30,
                         what="a waiting reason")
    assert waiting["status_reason"] == f"waiting for {CLUSTER_CPUS} CPU (2 free of {CLUSTER_CPUS})"
    assert waiting["ray_job"] is None

    done = wait_until(client, first, lambda r: r["status"] in TERMINAL, timeout=300, what="the first run's end")
    assert done["status"] == "succeeded", done["status_reason"]
    started = wait_until(client, second, lambda r: r["ray_job"] is not None, timeout=60, what="the second run launched")
    assert started["started_at"] is None or started["started_at"] >= done["finished_at"]
    assert client.post(f"/api/runs/{second}/cancel").status_code == 200
    wait_until(client, second, lambda r: r["status"] == "cancelled", timeout=120, what="cancelled")


def test_twenty_clients_submit_five_runs_each_and_every_run_is_accounted_for(served):
    app, client = served
    blocker = client.post("/api/runs", json={"name": "blocker", "spec": tiny_run_spec(steps=500, ranks=CLUSTER_CPUS, **{
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 1, "critic.ppo_micro_batch_size_per_gpu": 1})}).json()["id"]
    wait_until(client, blocker, lambda r: r["ray_job"] is not None, timeout=60, what="the blocker launched")
    spec = tiny_run_spec(steps=1, ranks=CLUSTER_CPUS, **{"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 1,
                                                         "critic.ppo_micro_batch_size_per_gpu": 1})  # waits behind it
    problems: list[str] = []
    lock = threading.Lock()

    def one_client(n: int) -> list[int]:
        ids = []
        with httpx.Client(base_url=app.url, headers=client.headers, timeout=120) as own:
            for i in range(5):
                resp = own.post("/api/runs", json={"name": f"c{n}-{i}", "spec": spec})
                if resp.status_code != 201:
                    with lock:
                        problems.append(f"POST {resp.status_code} {resp.text[:200]}")
                    continue
                ids.append(resp.json()["id"])
            for run_id in ids[::2]:  # half of them cancelled right away, concurrently with the others' submits
                resp = own.post(f"/api/runs/{run_id}/cancel")
                if resp.status_code != 200:
                    with lock:
                        problems.append(f"cancel {resp.status_code} {resp.text[:200]}")
        return ids

    with ThreadPoolExecutor(20) as pool:
        ids = [run_id for batch in pool.map(one_client, range(20)) for run_id in batch]
    assert problems == []
    assert len(ids) == len(set(ids)) == 100
    listed = client.get("/api/runs", params={"name": "c", "limit": 500}).json()
    assert {r["id"] for r in listed["data"]} >= set(ids)
    by_status = {}
    for run in listed["data"]:
        if run["id"] in ids:
            by_status[run["status"]] = by_status.get(run["status"], 0) + 1
    assert by_status == {"cancelled": 60, "queued": 40}, by_status
    assert "database is locked" not in app.tail(10**7)
    assert " 500 " not in app.tail(10**7)
    for run_id in [*ids, blocker]:
        client.post(f"/api/runs/{run_id}/cancel")
    # the blocker holds every CPU of the module's head: the next test's run must not wait behind it
    wait_until(client, blocker, lambda r: r["status"] == "cancelled", timeout=120, what="the blocker cancelled")


def test_ray_unreachable_at_submit_answers_503_and_the_run_starts_later(tmp_path: Path):
    # a head of its own: the module's served app keeps a warm rank on the shared head, holding every CPU a
    # one-rank run of that head asks for, and another app's scheduler cannot use it (CI saw 'waiting for 1 CPU
    # (0 free of 4)' for 60 s)
    head = RayHead.start(tmp_path / "ray-head", num_cpus=CLUSTER_CPUS)
    data = tmp_path / "data"
    nowhere = f"127.0.0.1:{free_port()}"
    down = AppProcess(app_env(head.env, data_dir=data, ray_address=nowhere), tmp_path / "down.log")
    up = AppProcess(app_env(head.env, data_dir=data, ray_address=head.address), tmp_path / "up.log")
    try:
        down.start()
        headers = token_headers(f"sqlite:///{data / 'attnboard.db'}")
        spec = tiny_run_spec(steps=200, **{"attnboard.rank_cpus": 1})
        with httpx.Client(base_url=down.url, headers=headers, timeout=60) as client:
            resp = client.post("/api/runs", json={"name": "later", "spec": spec})
            assert resp.status_code == 503, resp.text
            error = resp.json()["error"]
            assert nowhere in error["message"] and "saved and queued" in error["message"]
            run_id = error["value"]
            run = client.get(f"/api/runs/{run_id}").json()
            assert run["status"] == "queued" and run["spec"] == spec
            again = client.post(f"/api/runs/{run_id}/submit")
            assert again.status_code == 503 and nowhere in again.json()["error"]["message"]
        down.stop()

        up.start()  # the same database, now with a reachable Ray: the scheduler submits the kept run
        with httpx.Client(base_url=up.url, headers=headers, timeout=60) as client:
            run = wait_until(client, run_id, lambda r: r["ray_job"] == f"attnboard-run-{run_id}", timeout=60,
                             what="launched by the scheduler")
            wait_until(client, run_id, lambda r: r["status"] in ("starting", "running"), timeout=300, what="started")
            assert client.post(f"/api/runs/{run_id}/cancel").status_code == 200
            run = wait_until(client, run_id, lambda r: r["status"] == "cancelled", timeout=60, what="cancelled")
            seqs = [e["seq"] for e in all_events(client, run_id)]
            assert seqs == list(range(1, run["last_seq"] + 1))
        deadline = time.monotonic() + 60
        while held_by(ray_query(head.address, head.env), run_id):
            assert time.monotonic() < deadline, "cancel must free every actor of the run"
            time.sleep(1)
    finally:
        down.kill()
        up.stop()
        head.stop()
