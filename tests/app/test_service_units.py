"""The service's pure parts: resource needs and the FIFO plan, worker events -> stored events, the Ray
address helpers, and the long-poll notifier. No Ray here (tests/app/test_service_ray.py has it)."""

from __future__ import annotations

import asyncio
import math
import time

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from app.models import EventKind, storable_problem
from app.services.pump import RunChanges, attention_summary, gone_events, max_restarts_of, storable, to_event_create
from app.services.ray_launcher import Job, Need, free_resources, never_fits, plan_queue, wait_reason
from app.services.ray_runtime import HeadRecord, head_command, is_loopback, ray_token_available, split_address
from worker.core.devices import Cluster, rank_cpus

# --------------------------------------------------------------------------------------------
# Resources


ONE_CPU_EACH = Cluster(total_cpus=3, node_cpus=1)  # three 1-CPU nodes: a derived rank takes 1 CPU


@pytest.mark.parametrize("trainer,expected", [
    ({"device": "cpu", "n_gpus_per_node": 2, "nnodes": 1}, {"CPU": 2}),
    ({"device": "cpu", "n_gpus_per_node": 1, "nnodes": 3}, {"CPU": 3}),
    ({"device": "cuda", "n_gpus_per_node": 4, "nnodes": 2}, {"CPU": 8, "GPU": 8}),
    ({"device": "npu", "n_gpus_per_node": 1, "nnodes": 1}, {"CPU": 1, "GPU": 1}),
])
def test_need_of_spec_mirrors_what_each_rank_asks_ray(trainer, expected):
    assert dict(Need.of_spec({"trainer": trainer}, ONE_CPU_EACH).resources) == expected


@pytest.mark.parametrize("rank_cpus,world,cluster,expected", [
    (None, 1, Cluster(2, 2), {"CPU": 2}),  # one rank on the 2-core embedded head holds both cores
    (0, 2, Cluster(2, 2), {"CPU": 2}),  # two ranks share them, one each
    (0, 3, Cluster(2, 2), {"CPU": 3}),  # never less than 1 per rank (the run waits for a bigger cluster)
    (0, 1, Cluster(16, 4), {"CPU": 4}),  # never more than the smallest node has
    (0, 2, Cluster(16, 8), {"CPU": 16}),
    (3, 2, Cluster(2, 2), {"CPU": 6}),  # set: asked as set
])
def test_need_of_spec_counts_the_cpus_each_rank_derives(rank_cpus, world, cluster, expected):
    spec = {"trainer": {"device": "cpu", "n_gpus_per_node": world, "nnodes": 1}}
    if rank_cpus is not None:
        spec["attnboard"] = {"rank_cpus": rank_cpus}
    assert dict(Need.of_spec(spec, cluster).resources) == expected


def test_cluster_of_ray_nodes_reads_alive_nodes_cpus():
    nodes = [{"Alive": True, "Resources": {"CPU": 8.0}}, {"Alive": True, "Resources": {"CPU": 2.0, "GPU": 1.0}},
             {"Alive": False, "Resources": {"CPU": 1.0}}, {"Alive": True, "Resources": {"memory": 1.0}}]
    assert Cluster.of_nodes(nodes) == Cluster(total_cpus=10.0, node_cpus=2.0)
    assert Cluster.of_nodes([]) == Cluster(0.0, 0.0)
    assert rank_cpus(0, device="cpu", world=1, cluster=Cluster(0.0, 0.0)) == 1


@pytest.mark.parametrize("setting,world,free,expected", [
    (0, 2, 4.0, 2), (0, 2, 2.0, 1), (0, 2, 0.0, 1), (0, 1, 3.5, 3), (0, 1, None, 4), (3, 2, 0.0, 3),
])
def test_a_derived_share_shrinks_to_what_is_free_at_launch(setting, world, free, expected):
    """At launch the engine derives from what is free now (another holder the queue did not count, a run's
    ranks still being released); a set count is asked as set."""
    assert rank_cpus(setting, device="cpu", world=world, cluster=Cluster(4, 4), free_cpus=free) == expected


def test_rank_cpus_names_the_key_of_a_negative_setting():
    with pytest.raises(ValueError, match=r"attnboard.rank_cpus: -1 is negative; valid: 0 \(derived from the cluster\) or more"):
        rank_cpus(-1, device="cpu", world=1, cluster=Cluster(2, 2))


@pytest.mark.parametrize("need,free,total,expected", [
    ({"CPU": 2}, {"CPU": 1}, {"CPU": 4}, "waiting for 2 CPU (1 free of 4)"),
    ({"CPU": 2}, {"CPU": 2}, {"CPU": 4}, None),
    ({"CPU": 1, "GPU": 1}, {"CPU": 3}, {"CPU": 4}, "waiting for 1 GPU (0 free of 0)"),
    ({"CPU": 2, "GPU": 2}, {"CPU": 1, "GPU": 0.5}, {"CPU": 4, "GPU": 2},
     "waiting for 2 CPU (1 free of 4) and 2 GPU (0.5 free of 2)"),
])
def test_wait_reason_names_what_is_missing(need, free, total, expected):
    assert wait_reason(Need(need), free, total) == expected


def test_free_is_the_smaller_of_our_accounting_and_rays():
    total = {"CPU": 4.0, "GPU": 1.0}
    # Ray has not seen our second run's ranks yet (4 available) but we know 3 CPUs are promised.
    assert free_resources(total, {"CPU": 4.0, "GPU": 1.0}, [Need({"CPU": 2}), Need({"CPU": 1})]) == {"CPU": 1.0, "GPU": 1.0}
    # Someone else holds 3 CPUs on the cluster: Ray's number wins.
    assert free_resources(total, {"CPU": 1.0, "GPU": 0.0}, []) == {"CPU": 1.0, "GPU": 0.0}


def test_plan_is_fifo_and_a_blocked_head_holds_the_queue():
    queue = [(1, Need({"CPU": 2})), (2, Need({"CPU": 3})), (3, Need({"CPU": 1}))]
    plan = plan_queue(queue, {"CPU": 4}, {"CPU": 4})
    assert [(d.run_id, d.start) for d in plan] == [(1, True), (2, False), (3, False)]
    assert plan[1].reason == "waiting for 3 CPU (2 free of 4)"
    assert plan[2].reason == "waiting behind run 2 (first in the queue)"


def test_a_run_bigger_than_the_cluster_does_not_block_the_queue():
    plan = plan_queue([(1, Need({"CPU": 64})), (2, Need({"CPU": 1}))], {"CPU": 4}, {"CPU": 4})
    assert [(d.run_id, d.start) for d in plan] == [(1, False), (2, True)]
    assert plan[0].reason == ("waiting for 64 CPU (4 free of 4); more than the cluster has in all, so it waits "
                              "for the cluster to grow")


needs = st.lists(st.tuples(st.integers(1, 6), st.integers(0, 2)), max_size=12)


@given(needs, st.integers(0, 8), st.integers(0, 2))
@hsettings(max_examples=200, deadline=None)
def test_plan_never_overcommits_and_starts_a_prefix(rows, cpus, gpus):
    total = {"CPU": float(cpus), "GPU": float(gpus)}
    queue = [(i + 1, Need({"CPU": c, **({"GPU": g} if g else {})})) for i, (c, g) in enumerate(rows)]
    plan = plan_queue(queue, total, total)
    started = [need for (rid, need), d in zip(queue, plan, strict=True) if d.start]
    for key in total:
        assert sum(n.resources.get(key, 0) for n in started) <= total[key]
    # FIFO: among runs that fit the cluster at all, the started ones come before every waiting one.
    fitting = [d for (rid, need), d in zip(queue, plan, strict=True) if not never_fits(need, total)]
    flags = [d.start for d in fitting]
    assert flags == sorted(flags, reverse=True)
    assert all(d.reason for d in plan if not d.start)


# --------------------------------------------------------------------------------------------
# Worker events -> stored events


def test_a_worker_status_event_gets_the_apps_status_key():
    ev = to_event_create({"run_id": "7", "seq": 3, "ts": 1_700_000_000.5, "kind": "status",
                          "payload": {"state": "running", "reason": "training for 3 steps"}})
    assert ev.kind == EventKind.status and ev.seq == 3
    assert ev.payload == {"state": "running", "status": "running", "reason": "training for 3 steps"}
    assert ev.ts is not None and ev.ts.timestamp() == 1_700_000_000.5


def test_attention_mismatch_is_a_known_kind():
    assert to_event_create({"seq": 1, "ts": 0.0, "kind": "attention_mismatch", "payload": {}}).kind \
        == EventKind.attention_mismatch


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)


@given(json_values)
@hsettings(max_examples=200, deadline=None)
def test_storable_output_is_always_storable_and_keeps_finite_numbers(value):
    cleaned = storable(value)
    assert storable_problem(cleaned) is None
    if isinstance(value, float) and math.isfinite(value):
        assert cleaned == value


def test_a_nan_metric_is_stored_as_null():
    ev = to_event_create({"seq": 5, "ts": 1.0, "kind": "metric",
                          "payload": {"step": 1, "values": {"actor/pg_loss": float("nan"), "critic/vf_loss": 0.5}}})
    assert ev.payload["values"] == {"actor/pg_loss": None, "critic/vf_loss": 0.5}


@pytest.mark.parametrize("cancel_requested,final", [(False, "failed"), (True, "cancelled")])
def test_gone_events_continue_the_sequence_with_the_cause(cancel_requested, final):
    error, status = gone_events(12, name="attnboard-run-7", why="not found after restart",
                                cancel_requested=cancel_requested)
    assert (error.seq, error.kind, status.seq, status.kind) == (13, EventKind.error, 14, EventKind.status)
    assert error.payload["message"] == "workers gone: controller attnboard-run-7 not found after restart"
    assert status.payload["status"] == final and status.payload["reason"] == error.payload["message"]


@pytest.mark.parametrize("spec,expected", [
    ({"attnboard": {"max_restarts": 0}}, 0),
    ({"attnboard": {"max_restarts": 5}}, 5),
    ({"attnboard": {"seed": 1}}, 2),  # stored before the key existed: its default
    ({"attnboard": {"max_restarts": True}}, 2),
    ({}, 2),
])
def test_max_restarts_of_a_stored_spec(spec, expected):
    assert max_restarts_of(spec) == expected


def test_attention_summary_takes_the_first_rank_of_each_role():
    payloads = [
        {"role": "actor", "rank": 0, "requested": "sdpa", "effective": "sdpa", "observed": "sdpa", "status": "ok"},
        {"role": "actor", "rank": 1, "requested": "sdpa", "effective": "eager", "observed": "eager", "status": "fallback"},
        {"role": "critic", "rank": 0, "requested": "flash_attention_2", "effective": "eager", "forced": True,
         "status": "forced"},
        {"rank": 0},
    ]
    summary = attention_summary(payloads)
    assert set(summary) == {"actor", "critic"}
    assert summary["actor"].effective == "sdpa" and summary["critic"].status == "forced"
    restarted = attention_summary([
        *payloads,
        {"role": "actor", "rank": 1, "effective": "eager", "observed": "eager", "attempt": 1, "node": "10.0.0.9"},
        {"role": "actor", "rank": 0, "effective": "sdpa", "observed": "sdpa", "attempt": 1, "node": "10.0.0.8"},
    ])
    assert (restarted["actor"].rank, restarted["actor"].effective, restarted["actor"].node,
            restarted["actor"].attempt) == (1, "eager", "10.0.0.9", 1)  # the first rank seen after the restart
    assert restarted["critic"].attempt == 0


# --------------------------------------------------------------------------------------------
# Ray addresses and the embedded head


@pytest.mark.parametrize("address,expected", [
    ("127.0.0.1:6379", ("127.0.0.1", 6379)),
    ("ray://head.example:10001", ("head.example", 10001)),
    ("[::1]:6379", ("::1", 6379)),
    ("auto", None),
])
def test_split_address(address, expected):
    assert split_address(address) == expected


@pytest.mark.parametrize("address", ["head", "head:", ":6379", "head:port"])
def test_split_address_refuses_what_is_not_an_address(address):
    with pytest.raises(ValueError, match="valid: auto, HOST:PORT or ray://HOST:PORT"):
        split_address(address)


@pytest.mark.parametrize("address,expected", [
    ("127.0.0.1:6379", True), ("localhost:6379", True), ("127.0.1.1:1", True), ("ray-head:6379", False),
    ("auto", False), ("", False),
])
def test_is_loopback(address, expected):
    assert is_loopback(address) is expected


def test_head_command_stays_on_loopback_in_the_foreground():
    cmd = head_command("/venv/bin/ray", port=6380, agent_port=52000, temp_dir="/tmp/attnboard-ray-x", num_cpus=3)
    assert cmd[:4] == ["/venv/bin/ray", "start", "--head", "--block"]
    assert {"--node-ip-address=127.0.0.1", "--port=6380", "--include-dashboard=false", "--num-cpus=3",
            "--temp-dir=/tmp/attnboard-ray-x"} <= set(cmd)


def test_head_record_round_trip(tmp_path):
    record = HeadRecord(address="127.0.0.1:6380", pid=123, temp_dir="/tmp/x", started_at=1.5)
    record.save(tmp_path / "ray_head.json")
    assert HeadRecord.load(tmp_path / "ray_head.json") == record
    (tmp_path / "broken.json").write_text("{not json")
    assert HeadRecord.load(tmp_path / "broken.json") is None
    assert HeadRecord.load(tmp_path / "missing.json") is None


def test_ray_token_available(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert ray_token_available({}) is False
    assert ray_token_available({"RAY_AUTH_TOKEN": "abc"}) is True
    token_file = tmp_path / "token"
    assert ray_token_available({"RAY_AUTH_TOKEN_PATH": str(token_file)}) is False
    token_file.write_text("abc")
    assert ray_token_available({"RAY_AUTH_TOKEN_PATH": str(token_file)}) is True
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("abc")
    assert ray_token_available({}) is True


# --------------------------------------------------------------------------------------------
# The long-poll notifier


def test_run_changes_wakes_a_waiter_from_another_thread():
    import threading

    async def scenario() -> tuple[float, float]:
        changes = RunChanges()
        changes.bind(asyncio.get_running_loop())
        t0 = time.monotonic()
        await changes.wait(0.2)  # nobody notifies: the timeout ends it
        idle = time.monotonic() - t0
        threading.Timer(0.1, changes.notify).start()
        t1 = time.monotonic()
        await changes.wait(30)
        return idle, time.monotonic() - t1

    idle, woken = asyncio.run(scenario())
    assert 0.15 <= idle < 2
    assert woken < 5


def test_each_database_gets_its_own_engine_host(tmp_path, monkeypatch):
    """Run ids are unique within one database only: apps on different databases must not share a host,
    while one database spelled two ways (relative or absolute path, another password) keeps its host."""
    from app.core.config import database_identity
    from worker.core.contract import host_name

    monkeypatch.chdir(tmp_path)
    relative = host_name(database_identity("sqlite:///data/attnboard.db"))
    absolute = host_name(database_identity(f"sqlite:///{tmp_path}/data/attnboard.db"))
    other_file = host_name(database_identity(f"sqlite:///{tmp_path}/other/attnboard.db"))
    postgres = host_name(database_identity("postgresql+psycopg://postgres@127.0.0.1:5432/test"))
    assert relative == absolute
    assert len({relative, other_file, postgres}) == 3
    assert all(name.startswith("attnboard-engine-") for name in (relative, other_file, postgres))
    assert database_identity("postgresql+psycopg://u:one@h:5432/d") == database_identity("postgresql+psycopg://u:two@h:5432/d")
    assert "one" not in database_identity("postgresql+psycopg://u:one@h:5432/d")


def test_runs_and_trials_share_one_queue_in_the_order_they_were_made():
    """A trial is a job of the same queue: it waits behind a run that holds the CPUs, and says for what."""
    run, trial, later = Job("run", 1), Job("trial", 1), Job("run", 2)
    plan = plan_queue([(run, Need({"CPU": 2})), (trial, Need({"CPU": 2})), (later, Need({"CPU": 1}))],
                      {"CPU": 3}, {"CPU": 3}, label=str)
    assert [(str(d.key), d.start) for d in plan] == [("run 1", True), ("trial 1", False), ("run 2", False)]
    assert plan[1].reason == "waiting for 2 CPU (1 free of 3)"
    assert plan[2].reason == "waiting behind trial 1 (first in the queue)"  # it would fit: FIFO keeps it waiting
    # A trial first in line starts like a run would.
    assert [d.start for d in plan_queue([(trial, Need({"CPU": 2}))], {"CPU": 2}, {"CPU": 2}, label=str)] == [True]


def test_a_runs_ray_job_is_its_name_in_the_engine():
    from app.services.ray_launcher import controller_name
    from worker.core.contract import run_name

    assert controller_name(7) == run_name(7) == "attnboard-run-7"
