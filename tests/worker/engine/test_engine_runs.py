"""End-to-end runs on CPU: 2 ranks, gloo, FSDP2, the built-in tiny Llama and the built-in count task.

One Ray instance for the module. Each run is small (a few prompts, short responses); the two learning
runs are the longest. Learning criterion: the mean score of the last 5 steps is at least twice the
first 5 steps' (the untrained model scores ~0.06 on ``builtin:count``; see worker/ppo/rewards.py).
"""

from __future__ import annotations

import os
import signal
import time

import pytest
import ray

from worker.engine import launch_controller, run_spec
from worker.engine.controller import run_actor_names
from worker.engine.host import RunUnknown, engine_host, get_controller
from worker.spec import RunSpec, spec_to_tree
from worker.spec.presets import tiny_cpu_spec

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("models")


def tiny_spec(*, algo: str = "grpo", actor_attn: str = "sdpa", critic_attn: str = "sdpa", policy: str = "strict",
              steps: int = 1, strategy: str = "fsdp2", **extra) -> RunSpec:
    """The project's tiny CPU preset, with one optimizer step per PPO step (8 prompts x 4 samples over 2
    ranks: a mini batch of 16 sequences per rank, in one micro batch) to keep each step short."""
    overrides = {
        "algorithm.adv_estimator": algo,
        "actor_rollout_ref.model.override_config": {"attn_implementation": actor_attn},
        "actor_rollout_ref.actor.ppo_mini_batch_size": 8,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 16,
        "critic.ppo_micro_batch_size_per_gpu": 16,
        "trainer.total_training_steps": steps,
        "attnboard.fallback_policy": policy,
        "actor_rollout_ref.actor.strategy": strategy,
        "critic.strategy": strategy,
        **extra,
    }
    if algo == "gae":
        overrides["critic.model.override_config"] = {"attn_implementation": critic_attn}
    return tiny_cpu_spec(**overrides)


def run(spec: RunSpec, run_id: str, cache_dir) -> tuple[str, list[dict]]:
    events: list[dict] = []
    state = run_spec(spec, run_id=run_id, on_event=events.append, cache_dir=cache_dir)
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert run_actor_names(run_id) == set() or _eventually_gone(run_id)
    return state, events


def _eventually_gone(run_id: str, timeout: float = 10.0) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if not run_actor_names(run_id):
            return True
        time.sleep(0.2)
    raise AssertionError(f"actors left behind: {run_actor_names(run_id)}")


def of(events: list[dict], kind: str) -> list[dict]:
    return [e["payload"] for e in events if e["kind"] == kind]


def states(events: list[dict]) -> list[str]:
    return [p["state"] for p in of(events, "status")]


def scores(events: list[dict]) -> list[float]:
    return [p["values"]["critic/score/mean"] for p in of(events, "metric")]


def assert_learns(events: list[dict]) -> None:
    s = scores(events)
    first, last = sum(s[:5]) / 5, sum(s[-5:]) / 5
    assert last >= 2 * first, f"mean score first 5 steps {first:.3f}, last 5 {last:.3f}: {s}"


def assert_observed(events: list[dict], expected: dict[str, str]) -> None:
    attention = of(events, "attention")
    seen = {(a["role"], a["rank"]) for a in attention}
    assert seen == {(role, rank) for role in expected for rank in (0, 1)}
    for a in attention:
        assert a["effective"] == expected[a["role"]] and a["observed"] == expected[a["role"]], a
        assert a["calls"][a["observed"]] > 0
    assert of(events, "attention_mismatch") == []


METRIC_KEYS = {"critic/rewards/mean", "critic/score/mean", "actor/pg_loss", "actor/entropy",
               "actor/pg_clipfrac", "response_length/mean", "perf/tokens_per_s", "perf/step_time_s",
               "training/rollout_probs_diff_mean"}


def test_gae_learns_with_sdpa_actor_and_eager_critic(local_ray, cache_dir):
    state, events = run(tiny_spec(algo="gae", actor_attn="sdpa", critic_attn="eager", steps=20), "gae-learn", cache_dir)
    assert state == "succeeded", of(events, "error")
    assert states(events) == ["queued", "starting", "running", "succeeded"]
    assert_observed(events, {"actor": "sdpa", "rollout": "sdpa", "reference": "sdpa", "critic": "eager"})
    metrics = of(events, "metric")
    assert [m["step"] for m in metrics] == list(range(1, 21)) and metrics[0]["total_steps"] == 20
    assert METRIC_KEYS | {"critic/vf_loss"} <= metrics[-1]["values"].keys()
    # no KL term (verl's defaults): no step ran the reference forward, so there is no KL to the reference to report
    assert all("actor/kl" not in m["values"] for m in metrics)
    assert set(metrics[-1]["peak_memory_mb"]) == {"0", "1"}
    # Same kernel for rollout and training: sampling and re-scoring agree (verl's bound is 0.005).
    assert max(m["values"]["training/rollout_probs_diff_mean"] for m in metrics) < 0.005
    assert_learns(events)


BF16 = {"actor_rollout_ref.actor.fsdp_config.dtype": "bf16", "actor_rollout_ref.ref.fsdp_config.dtype": "bf16",
        "actor_rollout_ref.rollout.dtype": "bf16", "critic.fsdp.dtype": "bf16"}
"""verl's defaults (bf16 compute over fp32 master weights, ``model_dtype`` left at fp32), over the CPU preset's fp32."""

PG_LOSS_ATOL = 1e-4
VF_LOSS_RTOL = 1e-2
"""First-step losses, bf16 vs fp32 (same seed, same prompts). bf16 keeps 8 significant bits (unit roundoff
2^-8 = 0.39%). Measured over seeds 0, 1, 2: the critic's vf_loss (~0.012-0.017) differs by 0.03% to 0.14%,
so 1% is ~2.5 bf16 roundoffs and 7x the worst seen. The actor's pg_loss is -mean(advantage) at the first
step (the ratio is 1), a small difference of near-equal terms (-5e-4 to 8e-4), so a relative bound means
nothing; it differs by 2e-6 to 2.2e-5 in absolute terms, and 1e-4 is 4.5x the worst seen."""


def test_bf16_gae_learns_like_fp32_and_its_first_step_loss_is_within_bf16_rounding(local_ray, cache_dir):
    state, events = run(tiny_spec(algo="gae", actor_attn="sdpa", critic_attn="eager", steps=20, **BF16), "gae-bf16",
                        cache_dir)
    assert state == "succeeded", of(events, "error")
    assert_observed(events, {"actor": "sdpa", "rollout": "sdpa", "reference": "sdpa", "critic": "eager"})
    for a in of(events, "attention"):
        held = "bfloat16" if a["role"] == "reference" else "float32"  # the frozen reference holds bf16 weights
        assert (a["compute_dtype"], a["weights_dtype"]) == ("bfloat16", held), a
        # kernel-level truth: sdpa ran CPU's fused flash kernel in bf16; eager calls no SDPA at all
        assert a["sdpa_backend"] == ("flash_attention" if a["effective"] == "sdpa" else None), a
    metrics = of(events, "metric")
    assert max(m["values"]["training/rollout_probs_diff_mean"] for m in metrics) < 0.005
    assert_learns(events)

    state, fp32_events = run(tiny_spec(algo="gae", actor_attn="sdpa", critic_attn="eager", steps=1), "gae-fp32-step1",
                             cache_dir)
    assert state == "succeeded", of(fp32_events, "error")
    assert {a["compute_dtype"] for a in of(fp32_events, "attention")} == {"float32"}
    bf16, fp32 = metrics[0]["values"], of(fp32_events, "metric")[0]["values"]
    assert bf16["critic/vf_loss"] != fp32["critic/vf_loss"]  # it did compute in bf16
    assert abs(bf16["actor/pg_loss"] - fp32["actor/pg_loss"]) <= PG_LOSS_ATOL, (bf16["actor/pg_loss"], fp32["actor/pg_loss"])
    assert abs(bf16["critic/vf_loss"] - fp32["critic/vf_loss"]) <= VF_LOSS_RTOL * fp32["critic/vf_loss"], \
        (bf16["critic/vf_loss"], fp32["critic/vf_loss"])


def test_grpo_learns_on_sdpa_after_falling_back_from_flash_attention_2(local_ray, cache_dir):
    spec = tiny_spec(algo="grpo", actor_attn="flash_attention_2", policy="fallback", steps=20)
    state, events = run(spec, "grpo-learn", cache_dir)
    assert state == "succeeded", of(events, "error")
    assert_observed(events, {"actor": "sdpa", "rollout": "sdpa", "reference": "sdpa"})
    fallbacks = of(events, "fallback")
    assert {(f["role"], f["rank"]) for f in fallbacks} == {(r, k) for r in ("actor", "reference") for k in (0, 1)}
    for f in fallbacks:
        assert (f["from"], f["to"]) == ("flash_attention_2", "sdpa")
        assert "FlashAttention2 has been toggled on" in f["error"]  # transformers' own words
        assert f["diagnosis"]["category"] in ("flash_attn_not_installed", "not_on_cpu")
    for a in of(events, "attention"):
        assert a["requested"] == "flash_attention_2" and a["status"] == "fallback"
    assert_learns(events)


def test_flash_attention_2_on_cpu_under_strict_fails_with_the_classified_error(local_ray, cache_dir):
    state, events = run(tiny_spec(actor_attn="flash_attention_2", policy="strict"), "strict-fa2", cache_dir)
    assert state == "failed"
    assert states(events) == ["queued", "starting", "failed"]
    error = of(events, "error")[0]
    assert error["role"] == "actor" and "FlashAttention2 has been toggled on" in error["message"]
    assert error["diagnosis"]["category"] in ("flash_attn_not_installed", "not_on_cpu")
    assert error["attempts"][0]["implementation"] == "flash_attention_2" and len(error["attempts"]) == 1
    assert of(events, "metric") == []


def test_asking_for_attention_weights_falls_back_from_sdpa_to_eager_with_transformers_warning(local_ray, cache_dir):
    spec = tiny_spec(actor_attn="sdpa", policy="fallback", **{"attnboard.debug.output_attentions": True})
    state, events = run(spec, "output-attentions", cache_dir)
    assert state == "succeeded", of(events, "error")
    assert_observed(events, {"actor": "eager", "rollout": "eager", "reference": "eager"})  # preview agreed: no mismatch
    fallbacks = of(events, "fallback")
    assert {(f["role"], f["rank"]) for f in fallbacks} == {(r, k) for r in ("actor", "reference") for k in (0, 1)}
    for f in fallbacks:
        assert (f["from"], f["to"]) == ("sdpa", "eager")
        assert "`sdpa` attention does not support `output_attentions=True`" in f["error"]
        assert f["diagnosis"]["category"] == "output_attentions_unsupported"
    assert all(a["output_attentions"] for a in of(events, "attention"))


def _wait_for(controller, predicate, timeout: float) -> list[dict]:
    deadline = time.time() + timeout
    events: list[dict] = []
    while time.time() < deadline:
        events.extend(ray.get(controller.events_since(events[-1]["seq"] if events else 0)))
        if predicate(events):
            return events
        time.sleep(0.2)
    raise AssertionError(f"timed out; statuses so far: {states(events)}")


def _finish(controller, events: list[dict]) -> None:
    """Acknowledge every event: the engine host drops the finished run."""
    status = ray.get(controller.ack(events[-1]["seq"]))
    assert status["terminal"] and status["finished"]
    with pytest.raises(RunUnknown):
        ray.get(controller.status())


def _processes_gone(pids: list[int], timeout: float = 10.0) -> None:
    deadline = time.time() + timeout
    while any(_alive(pid) for pid in pids):
        assert time.time() < deadline, f"rank processes still alive: {[p for p in pids if _alive(p)]}"
        time.sleep(0.2)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _held(run_id: str) -> list[int]:
    return ray.get(engine_host().held_pids.remote(run_id))


def test_cancel_stops_every_rank_within_10_seconds_and_eager_runs_where_asked(local_ray, cache_dir):
    run_id = "cancel-me"
    spec = tiny_spec(algo="gae", actor_attn="eager", critic_attn="sdpa", steps=500)
    controller = launch_controller(spec_to_tree(spec), run_id=run_id, cache_dir=str(cache_dir))
    assert get_controller(run_id) is not None
    with pytest.raises(ValueError, match="already has it"):
        launch_controller(spec_to_tree(spec), run_id=run_id, cache_dir=str(cache_dir))
    events = _wait_for(controller, lambda ev: any(e["kind"] == "metric" for e in ev), timeout=240)
    # Eager on every actor-side role and sdpa on the critic: what each role asked for is what ran.
    assert_observed(events, {"actor": "eager", "rollout": "eager", "reference": "eager", "critic": "sdpa"})
    assert of(events, "env_probe")[0]["device"] == "cpu"
    up = next(p for p in of(events, "log") if "pids" in p)
    pids = up["pids"]
    assert sorted(_held(run_id)) == sorted(pids) and len(pids) == 2
    assert up["warm"] == 0 and "all new" in up["message"]  # this host has no warm ranks
    started = time.time()
    ray.get(controller.cancel("test cancel"), timeout=15)
    events = _wait_for(controller, lambda ev: ev and ev[-1]["kind"] == "status" and ev[-1]["payload"]["state"] == "cancelled",
                       timeout=10)
    assert time.time() - started < 10
    assert _held(run_id) == []  # let go of before the final status
    assert states(events)[-1] == "cancelled" and events[-1]["payload"]["reason"] == "test cancel"
    _processes_gone(pids)  # no warm pool in this host: the ranks are killed
    _finish(controller, events)


def test_a_killed_rank_fails_the_run_naming_the_rank_under_fsdp1(local_ray, cache_dir):
    """With attnboard.max_restarts=0 (test_engine_resume.py restarts one)."""
    run_id = "kill-rank"
    spec = tiny_spec(steps=500, strategy="fsdp", **{"attnboard.max_restarts": 0})  # FSDP1 trains until the kill
    controller = launch_controller(spec_to_tree(spec), run_id=run_id, cache_dir=str(cache_dir))
    events = _wait_for(controller, lambda ev: any(e["kind"] == "metric" for e in ev), timeout=240)
    pids = next(p["pids"] for p in of(events, "log") if "pids" in p)
    os.kill(pids[1], signal.SIGKILL)
    events = _wait_for(controller, lambda ev: ev and ev[-1]["kind"] == "status" and ev[-1]["payload"]["state"] == "failed",
                       timeout=15)
    error = of(events, "error")[-1]
    assert error["rank"] == 1 and error["died"] and "rank 1 died" in error["message"]
    assert events[-1]["payload"]["rank"] == 1
    assert _held(run_id) == []
    _processes_gone(pids)  # the surviving rank is killed too
    _finish(controller, events)


@pytest.mark.parametrize("remove_padding", [True, False])
def test_a_run_packs_or_pads_its_micro_batches_as_use_remove_padding_says(local_ray, cache_dir, remove_padding):
    """verl's use_remove_padding (default true) packs every micro-batch of the actor, the reference and the
    critic into one row; false trains on padded rows. Both succeed and each attention event says which;
    the rollout generates padded rows either way. The KL loss makes the step run the reference's forward."""
    spec = tiny_spec(algo="gae", steps=1, **{"actor_rollout_ref.model.use_remove_padding": remove_padding,
                                            "critic.model.use_remove_padding": remove_padding,
                                            "actor_rollout_ref.actor.use_kl_loss": True})
    state, events = run(spec, f"remove-padding-{remove_padding}".lower(), cache_dir)
    assert state == "succeeded", of(events, "error")
    packed = {(a["role"], a["rank"]): a["remove_padding"] for a in of(events, "attention")}
    assert packed == {(role, rank): remove_padding and role != "rollout"
                      for role in ("actor", "reference", "critic", "rollout") for rank in (0, 1)}
    assert of(events, "attention_mismatch") == []
    # one epoch of one mini-batch: on policy, the old log-probs come from the update's own forwards (no forward
    # of their own) and at step 1 they are the reference's (the same initial weights): KL 0, entropy measured
    (metric,) = of(events, "metric")
    assert abs(metric["values"]["actor/kl"]) < 1e-5 and metric["values"]["actor/entropy"] > 0
    assert metric["values"]["training/rollout_probs_diff_mean"] < 1e-3


def test_warm_ranks_serve_the_next_run_and_a_failed_run_gives_them_up(local_ray, cache_dir):
    """A host with 2 warm ranks: a run takes them (no new process), hands them back clean when it succeeds,
    and the next run reuses the same processes; a failed run's ranks are killed and the pool refills."""
    host = engine_host()
    ray.get(host.configure.remote(2, "cpu"))
    try:
        warm = _wait_pool(host, lambda p: p["idle"] == 2, timeout=120)
        assert warm["idle_resources"] == {"CPU": 4.0}  # the local Ray's 4 CPUs shared by a run of 2 ranks
        pids = []
        for n in range(2):
            controller = launch_controller(spec_to_tree(tiny_spec(steps=1)), run_id=f"warm-{n}", cache_dir=str(cache_dir))
            events = _wait_for(controller, lambda ev: ev and ev[-1]["kind"] == "status"
                               and ev[-1]["payload"]["state"] in ("succeeded", "failed"), timeout=240)
            assert states(events)[-1] == "succeeded", of(events, "error")
            up = next(p for p in of(events, "log") if "pids" in p)
            assert up["warm"] == 2 and up["rank_cpus"] == 2
            assert "(cpu, 2 CPU(s) and torch thread(s) each, 2 warm, 0 new, process group on 127.0.0.1:" in up["message"]
            assert up["threads"] == [2, 2]  # what torch.get_num_threads() says in each rank
            pids.append(sorted(up["pids"]))
            assert ray.get(host.pool_status.remote())["idle"] == 2  # back before the final status
            _finish(controller, events)
        assert pids[0] == pids[1]  # the same two processes ran both runs

        controller = launch_controller(spec_to_tree(tiny_spec(actor_attn="flash_attention_2", policy="strict")),
                                       run_id="warm-fail", cache_dir=str(cache_dir))
        events = _wait_for(controller, lambda ev: ev and ev[-1]["kind"] == "status"
                           and ev[-1]["payload"]["state"] == "failed", timeout=240)
        assert sorted(next(p["pids"] for p in of(events, "log") if "pids" in p)) == pids[0]
        _processes_gone(pids[0])
        _finish(controller, events)
        refilled = _wait_pool(host, lambda p: p["idle"] == 2, timeout=120)
        assert refilled["idle_resources"] == {"CPU": 4.0}
    finally:
        ray.get(host.configure.remote(0, "cpu"))
    assert ray.get(host.pool_status.remote())["idle"] == 0


def _wait_pool(host, predicate, timeout: float) -> dict:
    deadline = time.time() + timeout
    while True:
        status = ray.get(host.pool_status.remote())
        if predicate(status):
            return status
        assert time.time() < deadline, f"pool: {status}"
        time.sleep(0.5)


def test_probe_runs_as_a_ray_task_on_a_worker_node(local_ray):
    from worker.engine.probe import probe_on_ray

    probed = probe_on_ray()
    assert probed["device"] == "cpu" and probed["flash_attn_version"] is None and "implementations" not in probed
