"""The attention trial: run the same spec once per implementation, side by side, and recommend one.

The seed's advice (SUMMARY.md point 9): "run a small trial comparing throughput and memory on your model
and hardware before fixing the configuration". ``run_trial`` does exactly that:

1. For each implementation, the resolution preview (``worker.attention.resolution.resolve``, which walks the one
   availability check of ``worker.attention.availability``) says whether the environment can load it for every role;
   one it cannot is skipped with the preview's reason.
2. Each loadable one runs ``steps`` real PPO steps of the spec through the engine (``run_spec``, one Ray
   actor per rank) with that implementation on every role and the strict policy (no silent fallback);
   tokens/s, step time and peak memory come from the run's ``metric`` events.
3. A numerical parity check loads the actor with each implementation from the SAME weights in the actor's
   compute dtype (``actor_rollout_ref.actor.fsdp_config.dtype``: FlashAttention runs only in bf16/fp16),
   eager included, runs the same mixed-length batch twice, left-padded (like rollout) and packed into one
   row with ``position_ids`` and no mask (``use_remove_padding``, as the engine trains), and reports the
   largest absolute logit difference from eager's padded logits over the real positions of either case;
   the tolerance follows the dtype (``worker.engine.parity``; in the engine host's trial job it runs on a
   rank, ``worker.engine.trial_job``). It also times a forward of each case (tokens/s of real tokens) and
   every column carries the preview's ``remove-padding-cost`` sentence for its implementation, so the trial
   says what remove-padding does to each implementation's cost.
4. ``recommend`` picks the fastest implementation whose parity is within tolerance and says why, naming
   the figures; when the fastest two differ by less than the noise it says so and breaks the tie on
   memory, then on the fallback chain's order (``worker.attention.availability.chain_position``: flash_attention_2,
   sdpa, eager).

Pure parts (``trial_spec``, ``figures_from_events``, ``summarize``, ``recommend``, ``outcome``) are free of I/O; the
orchestration at the bottom needs Ray initialised (``run_spec`` schedules rank actors). No app import.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from worker.attention.availability import ModelSupport, Rule, chain_position
from worker.attention.packing import remove_padding_cost
from worker.attention.resolution import Status, resolve
from worker.core.environment import Environment
from worker.core.implementations import VALID_DESCRIPTION, is_valid_name
from worker.engine.parity import PARITY_REFERENCE, TOLERANCE_FP32, Parity, parity_batch, parity_check
from worker.spec import RunSpec, parse_spec, unflatten

NOISE_FLOOR = 0.05
"""Step times closer than 5% (or than the steps' own spread, if larger) are within noise."""
MEMORY_MARGIN = 0.05
"""A tie on time is broken by peak memory only when it differs by more than 5%."""

ATTN_KEYS = ("actor_rollout_ref.model.override_config.attn_implementation",
             "critic.model.override_config.attn_implementation")

# --------------------------------------------------------------------------------------------
# Results


@dataclass(frozen=True)
class StepFigures:
    """One PPO step's figures from a ``metric`` event."""

    step: int
    tokens_per_s: float
    step_time_s: float
    peak_memory_mb: float


@dataclass
class Column:
    """One implementation's side of the comparison."""

    implementation: str
    status: str  # "ok" | "skipped" | "failed"
    reason: str = ""  # why skipped or failed
    steps: list[StepFigures] = field(default_factory=list)
    tokens_per_s: float | None = None  # mean over the measured steps (the first is warm-up when there are more)
    step_time_s: float | None = None
    step_time_spread: float | None = None  # relative range of the step times (see summarize)
    peak_memory_mb: float | None = None  # highest over all steps and ranks
    parity_max_abs_diff: float | None = None  # vs eager, fp32, same weights and batch
    parity_ok: bool | None = None
    observed: dict[str, str | None] = field(default_factory=dict)  # role -> kernel the first forward called
    packed_parity_max_abs_diff: float | None = None  # the packed (remove-padding) case vs eager padded
    padded_forward_tokens_per_s: float | None = None  # one forward over the mixed-length parity batch, padded rows
    packed_forward_tokens_per_s: float | None = None  # the same batch packed into one row (use_remove_padding)
    remove_padding: dict[str, str] = field(default_factory=dict)  # {"rule": "remove-padding-cost", "text": ...}

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Column:
        values = dict(data)
        values["steps"] = [StepFigures(**s) for s in values.get("steps", [])]
        return cls(**values)


@dataclass(frozen=True)
class Recommendation:
    implementation: str | None  # None: nothing qualified
    reason: str  # one sentence naming the figures
    within_noise: bool = False


@dataclass
class TrialResult:
    columns: list[Column]
    recommendation: Recommendation
    steps: int
    environment: dict[str, Any]
    tolerance: float = TOLERANCE_FP32
    parity_reference: str = PARITY_REFERENCE
    parity_batch: list[int] = field(default_factory=list)  # (batch, sequence length) of the parity batch

    def column(self, implementation: str) -> Column:
        for col in self.columns:
            if col.implementation == implementation:
                return col
        raise KeyError(f"no column {implementation!r}; columns: {', '.join(c.implementation for c in self.columns)}")

    def as_dict(self) -> dict[str, Any]:
        return {"columns": [c.as_dict() for c in self.columns], "recommendation": asdict(self.recommendation),
                "steps": self.steps, "environment": self.environment, "tolerance": self.tolerance,
                "parity_reference": self.parity_reference, "parity_batch": list(self.parity_batch)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrialResult:
        return cls(columns=[Column.from_dict(c) for c in data["columns"]],
                   recommendation=Recommendation(**data["recommendation"]), steps=data["steps"],
                   environment=dict(data["environment"]), tolerance=data["tolerance"],
                   parity_reference=data["parity_reference"], parity_batch=list(data.get("parity_batch", [])))


# --------------------------------------------------------------------------------------------
# Pure helpers


def trial_spec(spec: RunSpec | Mapping[str, Any], implementation: str, steps: int) -> RunSpec:
    """``spec`` with ``implementation`` on every role, ``steps`` training steps and the strict policy (a trial
    measures the implementation asked for, never a silent fallback), from fresh weights with no checkpoint
    written or resumed and no restart (a trial measures; it does not train)."""
    if steps < 1:
        raise ValueError(f"steps: {steps!r} must be at least 1")
    base = spec if isinstance(spec, RunSpec) else parse_spec(dict(spec))
    tree = base.model_dump(mode="json")
    patch = dict.fromkeys(ATTN_KEYS, implementation)
    patch.update({"trainer.total_training_steps": steps, "attnboard.fallback_policy": "strict",
                  "trainer.save_freq": -1, "trainer.resume_mode": "disable", "attnboard.max_restarts": 0})
    return parse_spec(_merged(tree, unflatten(patch)))


def _merged(tree: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    out = dict(tree)
    for key, value in patch.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


_CONTEXT_RULES = frozenset(r.value for r in (
    Rule.default, Rule.override, Rule.strict, Rule.support_unknown, Rule.shared_section, Rule.rollout_engine,
    Rule.verl_critic_defect, Rule.fallback_step, Rule.remove_padding))
"""Reasons that explain the context of a choice, not why an implementation cannot load."""


def unloadable_reason(spec: RunSpec, implementation: str, env: Environment, *,
                      actor_support: ModelSupport | None = None, critic_support: ModelSupport | None = None) -> str | None:
    """Why the preview says ``env`` cannot run ``implementation`` on every role, or None when it can.

    A role where the engine forces another implementation (FSDP-Turbo with Ulysses) counts as "cannot":
    the trial would measure the forced one under the wrong name.
    """
    if not is_valid_name(implementation):
        return f"{implementation!r} is not an attention implementation; valid: {VALID_DESCRIPTION}"
    resolution = resolve(spec, env, actor_support=actor_support, critic_support=critic_support)
    for role in resolution.roles.values():
        if role.status == Status.error.value:
            why = next((r.text for r in role.reasons if r.rule not in _CONTEXT_RULES), role.error)
            return f"[{role.role}] {why}"
        if role.effective != implementation:
            why = role.reasons[-1].text if role.reasons else f"{role.effective} runs instead"
            return f"[{role.role}] {role.status}: {role.effective} would run instead ({why})"
    return None


def figures_from_events(events: Iterable[Mapping[str, Any]]) -> list[StepFigures]:
    """The per-step figures of a run's ``metric`` events (``perf/tokens_per_s``, ``perf/step_time_s``,
    ``perf/max_memory_mb``), in step order; metric events missing a figure are skipped."""
    out: dict[int, StepFigures] = {}
    for event in events:
        if event.get("kind") != "metric":
            continue
        payload = event.get("payload") or {}
        values = payload.get("values") or {}
        try:
            figures = StepFigures(step=int(payload["step"]), tokens_per_s=float(values["perf/tokens_per_s"]),
                                  step_time_s=float(values["perf/step_time_s"]),
                                  peak_memory_mb=float(values["perf/max_memory_mb"]))
        except (KeyError, TypeError, ValueError):
            continue
        out[figures.step] = figures
    return [out[s] for s in sorted(out)]


def summarize(steps: Sequence[StepFigures]) -> dict[str, float]:
    """Means over the measured steps (all but the first, a warm-up, when there are two or more), the relative
    range of the step times (of every step when only one is measured: one step alone says nothing of the
    noise), and the peak memory over every step."""
    if not steps:
        raise ValueError("summarize: no steps to summarize")
    measured = list(steps[1:]) if len(steps) > 1 else list(steps)
    mean_time = statistics.fmean(s.step_time_s for s in measured)
    times = [s.step_time_s for s in (measured if len(measured) > 1 else steps)]
    spread = (max(times) - min(times)) / mean_time if mean_time > 0 else 0.0
    return {"tokens_per_s": statistics.fmean(s.tokens_per_s for s in measured), "step_time_s": mean_time,
            "step_time_spread": spread, "peak_memory_mb": max(s.peak_memory_mb for s in steps)}


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def recommend(columns: Sequence[Column], tolerance: float = TOLERANCE_FP32) -> Recommendation:
    """The fastest implementation (mean step time) whose parity with eager is within ``tolerance``.

    Two step times closer than the noise (``NOISE_FLOOR`` or the columns' own spread, whichever is larger)
    are a tie: the one with clearly lower peak memory wins, else the earlier in the fallback chain.
    """
    measured = [c for c in columns if c.status == "ok" and c.step_time_s is not None]
    if not measured:
        why = "; ".join(f"{c.implementation}: {c.reason}" for c in columns if c.reason) or "no implementation ran"
        return Recommendation(None, f"No implementation completed the trial ({why}).")
    qualified = [c for c in measured if c.parity_max_abs_diff is not None and c.parity_max_abs_diff <= tolerance]
    rejected = [c for c in measured if c not in qualified]
    rejected_note = "".join(
        f" {c.implementation} was left out: its logits differ from eager by "
        f"{'an unmeasured amount' if c.parity_max_abs_diff is None else f'{c.parity_max_abs_diff:.2e}'}"
        f" (tolerance {tolerance:.0e})." for c in rejected)
    if not qualified:
        return Recommendation(None, f"No implementation passed the parity check.{rejected_note}")
    by_time = sorted(qualified, key=lambda c: (c.step_time_s, chain_position(c.implementation)))
    best = by_time[0]
    if len(by_time) == 1:
        return Recommendation(best.implementation,
                              f"{best.implementation} is the only implementation that ran within tolerance: "
                              f"{_ms(best.step_time_s)} per step, {best.tokens_per_s:.0f} tokens/s, peak "
                              f"{best.peak_memory_mb:.0f} MB, max logit difference from eager "
                              f"{best.parity_max_abs_diff:.1e}.{rejected_note}")
    runner = by_time[1]
    gap = (runner.step_time_s - best.step_time_s) / best.step_time_s
    noise = max(NOISE_FLOOR, best.step_time_spread or 0.0, runner.step_time_spread or 0.0)
    figures = (f"{best.implementation} {_ms(best.step_time_s)} per step ({best.tokens_per_s:.0f} tokens/s, peak "
               f"{best.peak_memory_mb:.0f} MB) vs {runner.implementation} {_ms(runner.step_time_s)} "
               f"({runner.tokens_per_s:.0f} tokens/s, peak {runner.peak_memory_mb:.0f} MB)")
    parity = f"max logit difference from eager {best.parity_max_abs_diff:.1e}"
    if gap > noise:
        return Recommendation(best.implementation, f"{best.implementation} is the fastest: {figures}, "
                                                   f"{gap:.0%} faster, {parity}.{rejected_note}")
    tied = [c for c in by_time if (c.step_time_s - best.step_time_s) / best.step_time_s <= noise]
    lowest = min(c.peak_memory_mb for c in tied)
    lighter = [c for c in tied if c.peak_memory_mb <= lowest * (1 + MEMORY_MARGIN)]
    pick = min(lighter, key=lambda c: chain_position(c.implementation))
    if len(lighter) < len(tied):
        tiebreak = f"{pick.implementation} uses the least memory"
    else:
        tiebreak = f"{pick.implementation} is preferred as the faster kernel family (fallback chain order)"
    return Recommendation(pick.implementation,
                          f"The difference is within noise ({gap:.1%} < {noise:.0%}): {figures}; {tiebreak}, "
                          f"max logit difference from eager {pick.parity_max_abs_diff:.1e}.{rejected_note}",
                          within_noise=True)


def outcome(columns: Sequence[Column]) -> tuple[str, str]:
    """How a finished trial ends: ``("succeeded" | "failed", why)``. Failed when no implementation completed
    (each one's status and reason named); else succeeded, naming those that completed and why the others
    did not."""
    completed = [c.implementation for c in columns if c.status == "ok"]
    others = "; ".join(f"{c.implementation} {c.status}: {c.reason or 'no reason given'}" for c in columns
                       if c.status != "ok")
    if not completed:
        return "failed", f"no implementation completed the trial ({others or 'none was asked for'})"
    done = f"{', '.join(completed)} completed"
    return "succeeded", f"{done}; {others}" if others else done


# --------------------------------------------------------------------------------------------
# Orchestration

Runner = Callable[..., str]
"""``run_spec``'s signature: ``(spec, *, run_id, on_event, model_roots, cache_dir) -> final state``."""
ParityCheck = Callable[..., Parity]
"""``parity_check``'s signature: ``(folder, implementations, *, device, dtype) -> Parity``."""


def _observed(events: Sequence[Mapping[str, Any]]) -> dict[str, str | None]:
    return {e["payload"]["role"]: e["payload"].get("observed") for e in events
            if e.get("kind") == "attention" and isinstance(e.get("payload"), dict) and "role" in e["payload"]}


def _failure(events: Sequence[Mapping[str, Any]], state: str) -> str:
    errors = [e["payload"].get("message") for e in events if e.get("kind") == "error"]
    statuses = [e["payload"].get("reason") for e in events if e.get("kind") == "status"]
    return f"the run ended {state}: {(errors or statuses or ['no reason given'])[-1]}"


def run_trial(
    spec: RunSpec | Mapping[str, Any],
    implementations: Sequence[str],
    *,
    steps: int,
    env: Environment,
    model_roots: Sequence[Path] = (),
    cache_dir: Path | str | None = None,
    tolerance: float | None = None,
    run: Runner | None = None,
    parity: ParityCheck = parity_check,
    on_column: Callable[[Column], None] | None = None,
    trial_id: str = "trial",
    done: Sequence[Column] = (),
) -> TrialResult:
    """Run ``steps`` PPO steps of ``spec`` per implementation, check parity with eager, recommend one.

    The parity check runs in the actor's compute dtype; ``tolerance`` None takes that dtype's
    (``parity_tolerance``).

    Ray must be initialised (the engine schedules one actor per rank). ``run`` defaults to
    ``worker.engine.run_spec``; ``parity`` runs the parity check (in this process by default; the engine
    host's trial job runs it on a rank); ``on_column`` sees each column as soon as it is measured;
    ``done``: columns measured before (by a host that died since), kept as they are and not run again.
    """
    from worker.engine import models

    if run is None:
        from worker.engine import run_spec as run
    if not implementations:
        raise ValueError("implementations: give at least one, e.g. ['sdpa', 'eager']")
    base = spec if isinstance(spec, RunSpec) else parse_spec(dict(spec))
    roots = [Path(r) for r in model_roots]
    actor_folder = models.resolve_model_path(base.actor_rollout_ref.model.path, roots, cache_dir=cache_dir)
    actor_support = ModelSupport(**models.architecture_support(actor_folder))
    critic_support = None
    if base.has_critic:
        critic_folder = models.resolve_model_path(base.critic.model.path, roots, cache_dir=cache_dir)
        critic_support = ModelSupport(**models.architecture_support(critic_folder))

    columns: list[Column] = []
    kept = {c.implementation: c for c in done}
    for impl in dict.fromkeys(implementations):
        if impl in kept:
            columns.append(kept[impl])
            continue
        column = _measure(base, impl, steps, env, run=run, roots=roots, cache_dir=cache_dir,
                          actor_support=actor_support, critic_support=critic_support, run_id=f"{trial_id}-{impl}")
        columns.append(column)
        if on_column is not None:
            on_column(column)

    ran = [c.implementation for c in columns if c.status == "ok"]
    compute_dtype = base.precision("actor")[0]
    result = parity(actor_folder, ran or [PARITY_REFERENCE], device=base.trainer.device, dtype=compute_dtype)
    if tolerance is None:
        tolerance = result.tolerance
    for column in columns:
        found = result.differences.get(column.implementation) if ran else None
        if isinstance(found, float):
            column.parity_max_abs_diff = found
            column.parity_ok = found <= tolerance
            column.packed_parity_max_abs_diff = result.packed.get(column.implementation)
            speed = result.speed.get(column.implementation, {})
            column.padded_forward_tokens_per_s = speed.get("padded")
            column.packed_forward_tokens_per_s = speed.get("packed")
        elif isinstance(found, str):
            column.parity_ok = False
            column.reason = f"parity check could not load it: {found}"
    batch, length = parity_batch(8)[0].shape
    return TrialResult(columns=columns, recommendation=recommend(columns, tolerance), steps=steps,
                       environment=env.to_dict(), tolerance=tolerance, parity_batch=[int(batch), int(length)])


def _measure(base: RunSpec, impl: str, steps: int, env: Environment, *, run: Runner, roots: list[Path],
             cache_dir: Path | str | None, actor_support: ModelSupport, critic_support: ModelSupport | None,
             run_id: str) -> Column:
    if not is_valid_name(impl):
        return Column(impl, "skipped", unloadable_reason(base, impl, env) or "")
    column = _measure_run(base, impl, steps, env, run=run, roots=roots, cache_dir=cache_dir,
                          actor_support=actor_support, critic_support=critic_support, run_id=run_id)
    column.remove_padding = {"rule": Rule.remove_padding.value,
                             "text": remove_padding_cost(impl, remove_padding=base.actor_rollout_ref.model.use_remove_padding,
                                                         sp=base.actor_sp)}
    return column


def _measure_run(base: RunSpec, impl: str, steps: int, env: Environment, *, run: Runner, roots: list[Path],
                 cache_dir: Path | str | None, actor_support: ModelSupport, critic_support: ModelSupport | None,
                 run_id: str) -> Column:
    spec = trial_spec(base, impl, steps)
    why = unloadable_reason(spec, impl, env, actor_support=actor_support, critic_support=critic_support)
    if why is not None:
        return Column(impl, "skipped", why)
    events: list[dict[str, Any]] = []
    state = run(spec, run_id=run_id, on_event=events.append, model_roots=roots, cache_dir=cache_dir)
    figures = figures_from_events(events)
    if state != "succeeded" or not figures:
        return Column(impl, "failed", _failure(events, state), steps=figures, observed=_observed(events))
    summary = summarize(figures)
    return Column(impl, "ok", steps=figures, observed=_observed(events), tokens_per_s=summary["tokens_per_s"],
                  step_time_s=summary["step_time_s"], step_time_spread=summary["step_time_spread"],
                  peak_memory_mb=summary["peak_memory_mb"])
