"""Checkpoints, restarts and cancels that must end, on CPU with 2 ranks (gloo, FSDP2, the tiny Llama with a
critic: both trained roles are checkpointed).

One uninterrupted 6-step run with ``save_freq=2`` is the reference; a run whose rank is SIGKILLed at step 3,
and one whose rank is killed while it writes the step-4 checkpoint, must end with the same weights (the data
order and the sampling seeds are deterministic and restored, so the replayed steps are the same steps).
The kill during a save is made certain with a FIFO where rank 1 writes its RNG file: the write blocks, as on
a hung filesystem, until the rank is killed.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
import ray

from tests.utils.checkpoints import assert_same_weights
from tests.utils.checkpoints import full_weights as weights
from tests.worker.engine.test_engine_runs import _finish, _processes_gone, _wait_for, of, states, tiny_spec
from worker.engine import checkpoint, launch_controller, run_spec
from worker.engine.controller import run_actor_names
from worker.engine.trainer import CANCEL_BOUND_S
from worker.spec import spec_to_tree

pytestmark = pytest.mark.ray

STEPS, SAVE_FREQ = 6, 2


def resume_spec(**extra):
    return tiny_spec(algo="gae", steps=STEPS, **{"trainer.save_freq": SAVE_FREQ, **extra})


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("models")


def folder_of(spec, artefact_dir: Path) -> Path:
    return checkpoint.checkpoint_folder(spec, artefact_dir)


def run_and_record(spec, run_id: str, cache_dir, artefact_dir: Path, on_event=None) -> tuple[str, list[dict]]:
    events: list[dict] = []

    def record(event: dict) -> None:
        events.append(event)
        if on_event is not None:
            on_event(event, events)

    state = run_spec(spec, run_id=run_id, on_event=record, cache_dir=cache_dir, artefact_dir=artefact_dir)
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    deadline = time.time() + 10
    while run_actor_names(run_id):
        assert time.time() < deadline, f"actors left behind: {run_actor_names(run_id)}"
        time.sleep(0.2)
    return state, events


def metric_steps(events: list[dict]) -> list[int]:
    return [p["step"] for p in of(events, "metric")]


def saved_step(event: dict) -> int | None:
    return event["payload"].get("checkpoint", {}).get("step") if event["kind"] == "log" else None


@pytest.fixture(scope="module")
def reference(local_ray, cache_dir, tmp_path_factory):
    """The uninterrupted run: its events and its final (step 6) weights."""
    spec = resume_spec()
    artefact = tmp_path_factory.mktemp("reference")
    state, events = run_and_record(spec, "reference", cache_dir, artefact)
    assert state == "succeeded", of(events, "error")
    assert metric_steps(events) == list(range(1, STEPS + 1))
    folder = folder_of(spec, artefact)
    assert [c.step for c in checkpoint.scan(folder)[0]] == [2, 4, 6]
    assert checkpoint.read_tracker(folder) == 6
    return {"events": events, "folder": folder, "weights": weights(folder / "global_step_6")}


def assert_restarted_once_from_step_2(events: list[dict], *, rank: int) -> dict:
    restarts = of(events, "restart")
    assert len(restarts) == 1, restarts
    restart = restarts[0]
    assert restart["resumed_from_step"] == 2 and restart["attempt"] == 1 and restart["source"] == "engine"
    assert restart["rank"] == rank and f"rank {rank} died" in restart["cause"], restart
    assert restart["checkpoint"].endswith("global_step_2")
    assert states(events)[0] == "queued" and states(events)[-1] == "succeeded" and "failed" not in states(events)
    assert metric_steps(events) == list(range(1, STEPS + 1)), "one metric per step, none replayed"
    # The new ranks report their attention again, tagged with the attempt, the node and their pids.
    ups = [p for p in of(events, "log") if "pids" in p]
    assert len(ups) == 2 and set(ups[0]["pids"]).isdisjoint(ups[1]["pids"]) and ups[1]["attempt"] == 1
    again = [a for a in of(events, "attention") if a["attempt"] == 1]
    assert {(a["role"], a["rank"]) for a in again} == {(r, k) for r in ("actor", "rollout", "reference", "critic")
                                                      for k in (0, 1)}
    assert all(a["node"] == "127.0.0.1" and a["pid"] in ups[1]["pids"] for a in again)
    return restart


def test_a_rank_killed_at_step_3_restarts_from_step_2_and_ends_with_the_uninterrupted_weights(
        local_ray, cache_dir, reference, tmp_path):
    """The rank is killed once the step-2 checkpoint is saved (from the controller's own event callback, so
    the kill lands at step 3 for certain)."""
    killed: list[int] = []

    def kill_at_step_3(event: dict, events: list[dict]) -> None:
        if saved_step(event) == 2 and not killed:
            pids = next(p["pids"] for p in of(events, "log") if "pids" in p)
            os.kill(pids[1], signal.SIGKILL)
            killed.append(pids[1])
            _processes_gone(killed)

    spec = resume_spec()
    state, events = run_and_record(spec, "kill-at-3", cache_dir, tmp_path, kill_at_step_3)
    assert state == "succeeded", of(events, "error")
    assert killed and assert_restarted_once_from_step_2(events, rank=1)
    assert of(events, "error") == []
    assert_same_weights(weights(folder_of(spec, tmp_path) / "global_step_6"), reference["weights"])


def test_a_checkpoint_interrupted_by_a_kill_is_skipped_and_the_previous_one_used(local_ray, cache_dir, reference,
                                                                                 tmp_path):
    """Rank 1 blocks writing its part of the step-4 checkpoint and is killed there: the partial folder is
    skipped (and removed) with a log line, the run resumes from step 2. Keep limits prune per role."""
    spec = resume_spec(**{"trainer.max_actor_ckpt_to_keep": 1, "trainer.max_critic_ckpt_to_keep": 2})
    folder = folder_of(spec, tmp_path)
    blocked = checkpoint.partial_folder(folder, 4, "kill-in-save") / checkpoint.RNG_FOLDER

    pids: list[int] = []

    def block_step_4_save(event: dict, events: list[dict]) -> None:
        if "pids" in event["payload"] and not pids:
            pids.extend(event["payload"]["pids"])
        if saved_step(event) == 2 and not blocked.exists():
            blocked.mkdir(parents=True)
            os.mkfifo(blocked / "rank_1.pt")  # rank 1's torch.save blocks opening it; rank 0's file lands beside

    result: dict = {}
    runner = threading.Thread(target=lambda: result.update(zip(("state", "events"), run_and_record(
        spec, "kill-in-save", cache_dir, tmp_path, block_step_4_save), strict=True)))
    runner.start()
    deadline = time.time() + 300
    while not (blocked / "rank_0.pt").exists():  # both ranks wrote their model shards; rank 1 waits on the FIFO
        assert runner.is_alive() and time.time() < deadline, "the step-4 save never started"
        time.sleep(0.1)
    os.kill(pids[1], signal.SIGKILL)
    runner.join(300)
    state, events = result["state"], result["events"]
    assert state == "succeeded", of(events, "error")
    assert_restarted_once_from_step_2(events, rank=1)
    skipped = [p["message"] for p in of(events, "log") if "skipped_checkpoint" in p]
    assert skipped == [f"skipped global_step_4.partial-kill-in-save in {folder}: an unfinished write (no rename to "
                       f"its final name): interrupted; removed"]
    assert_same_weights(weights(folder / "global_step_6"), reference["weights"])
    complete, leftovers = checkpoint.scan(folder)
    assert leftovers == []
    assert [(c.step, c.roles, c.resumable) for c in complete] == [(4, ("critic",), False), (6, ("actor", "critic"), True)]
    assert checkpoint.read_tracker(folder) == 6


def test_resume_mode_disable_starts_fresh_and_a_changed_model_shape_is_refused_naming_the_key(
        local_ray, cache_dir, reference):
    artefact = reference["folder"].parents[2]  # the reference run's folder: checkpoints 2, 4 and 6
    refused_spec = resume_spec(**{"actor_rollout_ref.model.override_config": {"attn_implementation": "sdpa",
                                                                               "num_hidden_layers": 3}})
    state, events = run_and_record(refused_spec, "shape-changed", cache_dir, artefact)
    assert state == "failed"
    error = of(events, "error")[-1]
    assert error["field"] == "actor_rollout_ref.model.override_config.num_hidden_layers"
    assert error["message"].startswith("actor_rollout_ref.model.override_config.num_hidden_layers: [actor] the "
                                       f"checkpoint at {reference['folder'] / 'global_step_6'} was saved with "
                                       "num_hidden_layers=2, this spec's model has num_hidden_layers=3: resume refused")
    assert not [p for p in of(events, "log") if "pids" in p], "refused before any rank started"

    fresh = resume_spec(**{"trainer.resume_mode": "disable", "trainer.total_training_steps": 1,
                           "trainer.save_freq": -1, "trainer.n_gpus_per_node": 1})
    state, events = run_and_record(fresh, "fresh", cache_dir, artefact)
    assert state == "succeeded", of(events, "error")
    assert metric_steps(events) == [1]
    assert any(p["message"] == f"trainer.resume_mode=disable: starting fresh; the 3 checkpoint(s) in "
                               f"{reference['folder']} are not used" for p in of(events, "log"))


def test_checkpoints_reshard_between_an_fsdp2_world_of_2_an_unwrapped_world_of_1_and_fsdp1(
        local_ray, cache_dir, reference, tmp_path):
    """DCP reshards model and optimizer: the reference's FSDP2 shards (2 ranks) load into one unwrapped module,
    which saves steps 5 and 6; those load into FSDP1 (FullyShardedDataParallel) on 2 ranks, which saves step 7."""
    one = resume_spec(**{"trainer.resume_mode": "resume_path", "trainer.n_gpus_per_node": 1, "trainer.save_freq": 1,
                         "trainer.resume_from_path": str(reference["folder"] / "global_step_4")})
    state, events = run_and_record(one, "world-1", cache_dir, tmp_path / "one")
    assert state == "succeeded", of(events, "error")
    assert metric_steps(events) == [5, 6]
    resumed = next(p for p in of(events, "log") if "resumed_from" in p)
    assert resumed["resumed_from"]["step"] == 4 and "resharded from a world of 2 to 1" in resumed["message"]

    saved = folder_of(one, tmp_path / "one")
    fsdp1 = resume_spec(strategy="fsdp", **{"trainer.resume_mode": "resume_path", "trainer.total_training_steps": 7,
                                            "trainer.save_freq": 1, "trainer.resume_from_path": str(saved)})
    state, events = run_and_record(fsdp1, "fsdp1", cache_dir, tmp_path / "two")
    assert state == "succeeded", of(events, "error")
    assert metric_steps(events) == [7]
    resumed = next(p for p in of(events, "log") if "resumed_from" in p)
    assert resumed["resumed_from"]["step"] == 6 and "resharded from a world of 1 to 2" in resumed["message"]
    last = checkpoint.newest(folder_of(fsdp1, tmp_path / "two"))
    assert (last.step, last.roles, last.meta["world_size"]) == (7, ("actor", "critic"), 2)
    assert set(weights(last.path)["actor"]) == set(reference["weights"]["actor"])  # the same parameter names


# --------------------------------------------------------------------------------------------
# Cancels that must end (issue 12, item 5): in the engine host, whose RunController bounds them


def _launch(spec, run_id: str, cache_dir, artefact: Path):
    return launch_controller(spec_to_tree(spec), run_id=run_id, cache_dir=str(cache_dir), artefact_dir=str(artefact))


def test_a_cancel_to_a_run_whose_ranks_hang_ends_within_the_bound_and_kills_them(local_ray, cache_dir, tmp_path):
    """Both ranks are stopped (SIGSTOP) mid-run: the call in flight never returns."""
    controller = _launch(tiny_spec(steps=500), "hung-ranks", cache_dir, tmp_path)
    events = _wait_for(controller, lambda ev: any(e["kind"] == "metric" for e in ev), timeout=240)
    pids = next(p["pids"] for p in of(events, "log") if "pids" in p)
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    started = time.monotonic()
    answer = ray.get(controller.cancel("test cancel"), timeout=CANCEL_BOUND_S + 10)
    assert time.monotonic() - started < CANCEL_BOUND_S
    assert answer["state"] == "cancelled" and answer["terminal"]
    events = _wait_for(controller, lambda ev: ev and ev[-1]["payload"].get("state") == "cancelled", timeout=10)
    assert events[-1]["payload"]["reason"] == "test cancel"
    _processes_gone(pids)
    _finish(controller, events)


def test_a_cancel_to_a_stuck_controller_ends_within_the_bound_kills_the_ranks_and_records_nothing_after(
        local_ray, cache_dir, tmp_path):
    """The controller blocks reading a checkpoint marker that never comes (a FIFO, as on a hung shared
    filesystem) while it prunes after the step-2 save: no kill reaches it. The cancel still answers within the
    bound with the run cancelled and its ranks killed; when the read returns later, nothing more is recorded."""
    spec = tiny_spec(steps=500, **{"trainer.save_freq": 2})
    folder = folder_of(spec, tmp_path)
    hung = folder / "global_step_99" / checkpoint.MARKER
    controller = _launch(spec, "stuck-controller", cache_dir, tmp_path)
    events = _wait_for(controller, lambda ev: any(e["kind"] == "metric" for e in ev), timeout=240)
    hung.parent.mkdir(parents=True)
    os.mkfifo(hung)
    pids = next(p["pids"] for p in of(events, "log") if "pids" in p)
    events = _wait_for(controller, lambda ev: any(e["kind"] == "metric" and e["payload"]["step"] == 2 for e in ev),
                       timeout=60)
    # the step-2 save is committed (renamed to its final name); the controller makes no call to its ranks
    # between that rename and the pruning scan, which now waits on the FIFO
    deadline = time.monotonic() + 60
    while not (folder / "global_step_2").is_dir() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)
    started = time.monotonic()
    answer = ray.get(controller.cancel("test cancel"), timeout=CANCEL_BOUND_S + 10)
    took = time.monotonic() - started
    assert took < CANCEL_BOUND_S + 1 and answer["terminal"], (took, answer)
    events = _wait_for(controller, lambda ev: ev and ev[-1]["payload"].get("state") == "cancelled", timeout=5)
    assert events[-1]["payload"]["reason"] == (f"test cancel (the controller did not stop within {CANCEL_BOUND_S:g} s: "
                                               f"its ranks were killed)")
    _processes_gone(pids)
    last = events[-1]["seq"]
    fd = os.open(hung, os.O_WRONLY | os.O_NONBLOCK)  # ENXIO unless the controller is still reading it
    os.close(fd)  # the hung read returns (an empty marker): the controller goes on, unrecorded
    time.sleep(3)
    assert ray.get(controller.events_since(last)) == []
    _finish(controller, events)
