"""The attention trial: pure parts by tables and properties, then one real CPU trial (eager vs sdpa,
tiny model, 2 steps, through the engine and Ray)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.worker.engine.support import TINY
from worker.core.environment import PROFILES
from worker.engine.parity import PARITY_ULPS, TOLERANCE_FP32, packed_inputs, parity_batch, parity_check, parity_tolerance
from worker.engine.trial import (
    NOISE_FLOOR,
    Column,
    StepFigures,
    TrialResult,
    figures_from_events,
    outcome,
    recommend,
    summarize,
    trial_spec,
    unloadable_reason,
)
from worker.spec import unflatten


def col(impl: str, time_s: float | None, *, mem: float = 100.0, parity: float | None = 0.0, spread: float = 0.0,
        status: str = "ok", reason: str = "") -> Column:
    return Column(impl, status, reason, tokens_per_s=None if time_s is None else 1000 / time_s, step_time_s=time_s,
                  step_time_spread=spread, peak_memory_mb=mem, parity_max_abs_diff=parity,
                  parity_ok=None if parity is None else parity <= TOLERANCE_FP32)


# --------------------------------------------------------------------------------------------
# trial_spec and the preview's verdict


@pytest.mark.parametrize("impl", ["eager", "sdpa", "flash_attention_2"])
def test_trial_spec_sets_every_role_steps_and_strict(impl):
    spec = trial_spec(unflatten({**TINY, "attnboard.fallback_policy": "fallback", "trainer.save_freq": 1}), impl, 3)
    assert spec.actor_rollout_ref.model.override_config["attn_implementation"] == impl
    assert spec.critic.model.override_config["attn_implementation"] == impl
    assert spec.trainer.total_training_steps == 3
    assert spec.attnboard.fallback_policy == "strict"
    trainer = spec.trainer  # a trial neither saves, resumes nor restarts
    assert (trainer.save_freq, trainer.resume_mode, spec.attnboard.max_restarts) == (-1, "disable", 0)
    assert spec.data.train_batch_size == 4  # the rest of the spec is kept


def test_trial_spec_refuses_zero_steps():
    with pytest.raises(ValueError, match=r"steps: 0 must be at least 1"):
        trial_spec(TINY, "eager", 0)


@pytest.mark.parametrize("impl,env,expected", [
    ("eager", "cpu", None),
    ("sdpa", "cpu", None),
    ("flash_attention_2", "cpu", "flash-attn package is not installed"),
    ("flash_attention_2", "cuda-sm75", "flash-attn package is not installed"),
    ("flash_attention_2", "cuda-sm80-fa2", None),
    ("flash_attention_3", "cuda-sm80-fa2", "[actor]"),
    ("no_such_kernel", "cpu", "is not an attention implementation; valid: eager, sdpa"),
])
def test_unloadable_reason_follows_the_preview(impl, env, expected):
    spec = trial_spec(TINY, impl, 1) if impl != "no_such_kernel" else trial_spec(TINY, "eager", 1)
    why = unloadable_reason(spec, impl, PROFILES[env])
    if expected is None:
        assert why is None
    else:
        assert why is not None and expected in why


def test_forced_eager_is_not_measured_under_another_name():
    spec = trial_spec({**TINY, "actor_rollout_ref.actor.strategy": "fsdp_turbo", "trainer.n_gpus_per_node": 2,
                       "actor_rollout_ref.actor.fsdp_config.turbo_cp_size": 2}, "sdpa", 1)
    why = unloadable_reason(spec, "sdpa", PROFILES["cpu"])
    assert why is not None and why.startswith("[actor] forced: eager would run instead")


# --------------------------------------------------------------------------------------------
# Figures


def metric(step: int, tps: float, t: float, mem: float) -> dict:
    return {"kind": "metric", "payload": {"step": step, "values": {"perf/tokens_per_s": tps, "perf/step_time_s": t,
                                                                  "perf/max_memory_mb": mem}}}


def test_figures_from_events_in_step_order_skipping_other_kinds_and_incomplete_metrics():
    events = [metric(2, 20.0, 0.5, 300.0), {"kind": "log", "payload": {"message": "x"}}, metric(1, 10.0, 1.0, 200.0),
              {"kind": "metric", "payload": {"step": 3, "values": {"perf/tokens_per_s": 1.0}}}]
    assert figures_from_events(events) == [StepFigures(1, 10.0, 1.0, 200.0), StepFigures(2, 20.0, 0.5, 300.0)]


@pytest.mark.parametrize("times,expected_time,expected_spread", [
    ([1.0], 1.0, 0.0),
    ([2.0, 1.0], 1.0, 1.0),  # one measured step: the spread comes from every step
    ([5.0, 1.0, 1.2, 0.8], 1.0, 0.4),  # the first step is warm-up
])
def test_summarize_drops_the_warm_up_step(times, expected_time, expected_spread):
    steps = [StepFigures(i + 1, 100 / t, t, 50.0 + i) for i, t in enumerate(times)]
    out = summarize(steps)
    assert out["step_time_s"] == pytest.approx(expected_time)
    assert out["step_time_spread"] == pytest.approx(expected_spread)
    assert out["peak_memory_mb"] == 50.0 + len(times) - 1  # the peak over every step, warm-up included


# --------------------------------------------------------------------------------------------
# Recommendation


@pytest.mark.parametrize("columns,expected,within_noise,words", [
    ([col("sdpa", 0.5), col("eager", 1.0)], "sdpa", False, ["sdpa is the fastest", "500.0 ms", "1000.0 ms", "100% faster"]),
    ([col("eager", 0.5), col("sdpa", 1.0)], "eager", False, ["eager is the fastest"]),
    # within noise: the chain's order decides (sdpa before eager)
    ([col("eager", 1.00), col("sdpa", 1.02)], "sdpa", True, ["within noise", "fallback chain order"]),
    # within noise: clearly lower memory decides
    ([col("sdpa", 1.00), col("eager", 1.01, mem=50.0)], "eager", True, ["eager uses the least memory"]),
    # a large spread makes a 20% gap noise
    ([col("sdpa", 1.0, spread=0.3), col("eager", 1.2)], "sdpa", True, ["within noise"]),
    # the fastest fails parity: left out, named
    ([col("sdpa", 0.5, parity=1e-2), col("eager", 1.0)], "eager", False, ["only implementation", "sdpa was left out",
                                                                           "1.00e-02"]),
    ([col("flash_attention_2", None, status="skipped", reason="not installed"), col("eager", 1.0)], "eager", False,
     ["only implementation"]),
    ([col("sdpa", None, status="failed", reason="boom")], None, False, ["No implementation completed", "sdpa: boom"]),
    ([col("sdpa", 0.5, parity=None)], None, False, ["No implementation passed the parity check"]),
])
def test_recommend_table(columns, expected, within_noise, words):
    rec = recommend(columns)
    assert rec.implementation == expected
    assert rec.within_noise is within_noise
    for word in words:
        assert word in rec.reason


times = st.floats(min_value=1e-3, max_value=10.0, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["eager", "sdpa", "flash_attention_2", "flex_attention"]), times,
                          st.floats(min_value=0, max_value=1e-3), st.floats(min_value=1, max_value=1e4)),
                min_size=1, max_size=4, unique_by=lambda t: t[0]))
def test_recommend_properties(rows):
    columns = [col(impl, t, parity=p, mem=m) for impl, t, p, m in rows]
    rec = recommend(columns)
    qualified = [c for c in columns if c.parity_max_abs_diff <= TOLERANCE_FP32]
    if not qualified:
        assert rec.implementation is None
        return
    pick = next(c for c in columns if c.implementation == rec.implementation)
    assert pick in qualified  # never one that failed parity
    fastest = min(c.step_time_s for c in qualified)
    # the pick is the fastest, or within noise of it (and then the reason says so)
    assert pick.step_time_s <= fastest * (1 + NOISE_FLOOR) + 1e-12
    assert rec.within_noise == (pick.step_time_s != fastest or any(
        c is not pick and c.step_time_s <= fastest * (1 + NOISE_FLOOR) for c in qualified))
    assert rec.reason.strip()


def test_result_round_trips_through_json_shapes():
    result = TrialResult(columns=[col("sdpa", 0.5), col("eager", 1.0)], recommendation=recommend([col("sdpa", 0.5)]),
                         steps=2, environment=PROFILES["cpu"].to_dict(), parity_batch=[4, 32])
    result.columns[0].steps = [StepFigures(1, 1.0, 2.0, 3.0)]
    assert TrialResult.from_dict(result.as_dict()) == result


# --------------------------------------------------------------------------------------------
# Real models


def test_parity_of_eager_and_sdpa_on_the_same_weights_is_below_tolerance(tmp_path):
    from worker.engine.models import ensure_builtin_folder

    folder = ensure_builtin_folder("builtin:tiny-llama", tmp_path)
    parity = parity_check(folder, ["eager", "sdpa", "flash_attention_2"])
    out = parity.differences
    assert (parity.dtype, parity.tolerance) == ("float32", TOLERANCE_FP32)
    assert 0.0 <= out["eager"] == parity.packed["eager"] < TOLERANCE_FP32  # eager packed vs its own padded logits
    assert isinstance(out["sdpa"], float) and 0.0 <= out["sdpa"] < TOLERANCE_FP32
    assert isinstance(out["flash_attention_2"], str) and out["flash_attention_2"].startswith("ImportError")


def test_parity_covers_the_packed_mixed_length_batch_and_times_both_cases(tmp_path):
    """The trial's cases include the remove-padding path: the mixed-length parity batch packed into one row
    with position_ids and no mask gives eager's padded logits on every implementation, and each case's
    forward is timed."""
    from worker.engine.models import ensure_builtin_folder

    folder = ensure_builtin_folder("builtin:tiny-llama", tmp_path)
    ids, mask = parity_batch(64)
    packed_ids, positions = packed_inputs(ids, mask)
    assert packed_ids.shape == (1, int(mask.sum())) and positions[0, :32].tolist() == list(range(32))
    assert positions[0, 32:61].tolist() == list(range(29))  # the second row (3 pads) starts again at 0
    parity = parity_check(folder, ["eager", "sdpa"])
    for impl in ("eager", "sdpa"):
        assert 0.0 <= parity.packed[impl] < TOLERANCE_FP32, impl
        assert parity.differences[impl] >= parity.packed[impl]
        assert set(parity.speed[impl]) == {"padded", "packed"} and min(parity.speed[impl].values()) > 0


def test_parity_in_bf16_loads_every_model_in_bf16_and_allows_its_rounding(tmp_path):
    """FlashAttention runs only in bf16/fp16, so the parity check runs in the actor's compute dtype; eager and
    sdpa then differ by bf16 rounding (1 ulp on the tiny model), far inside the bf16 tolerance."""
    from worker.engine.models import ensure_builtin_folder

    folder = ensure_builtin_folder("builtin:tiny-llama", tmp_path)
    parity = parity_check(folder, ["eager", "sdpa"], dtype="bfloat16")
    assert parity.dtype == "bfloat16"
    assert parity.tolerance == pytest.approx(PARITY_ULPS * 2.0**-7)  # the tiny model's logits are below 1
    assert 0.0 < parity.differences["sdpa"] <= parity.tolerance  # bf16 rounding shows, and is accepted


@pytest.mark.parametrize("dtype,scale,expected", [
    ("float32", 50.0, TOLERANCE_FP32),  # fp32: absolute, the kernels agree to ~1e-7
    ("bfloat16", 0.5, 32 * 2.0**-7),  # at least 1 as the scale
    ("bfloat16", 20.0, 32 * 2.0**-7 * 20.0),  # real models' logits: the ulp grows with them
    ("float16", 20.0, 32 * 2.0**-10 * 20.0),
])
def test_parity_tolerance_follows_the_dtype_and_the_logits_scale(dtype, scale, expected):
    assert parity_tolerance(dtype, scale) == pytest.approx(expected)


# The real trial (Ray, two ranks per implementation) runs once, through the API: tests/app/test_trials.py.


@pytest.mark.parametrize("columns,expected", [
    ([col("sdpa", 1.0), col("eager", 1.2)], ("succeeded", "sdpa, eager completed")),
    ([col("sdpa", None, status="failed", reason="the run ended failed: ResourceError: no CPUs"),
      col("eager", 1.2)],
     ("succeeded", "eager completed; sdpa failed: the run ended failed: ResourceError: no CPUs")),
    ([col("sdpa", None, status="failed", reason="the run ended failed: ResourceError: no CPUs"),
      col("eager", None, status="failed", reason="the run ended cancelled: stop"),
      col("flash_attention_2", None, status="skipped", reason="[actor] flash-attn is not installed")],
     ("failed", "no implementation completed the trial (sdpa failed: the run ended failed: ResourceError: no CPUs; "
                "eager failed: the run ended cancelled: stop; flash_attention_2 skipped: [actor] flash-attn is not "
                "installed)")),
    ([col("eager", None, status="failed")], ("failed", "no implementation completed the trial (eager failed: no "
                                                       "reason given)")),
    ([], ("failed", "no implementation completed the trial (none was asked for)")),
])
def test_a_trial_with_no_completed_implementation_fails_naming_each_reason(columns, expected):
    assert outcome(columns) == expected
