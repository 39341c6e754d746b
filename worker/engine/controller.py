"""The single controller of a run: it takes one Ray actor per rank, loads the roles with the attention
the resolution chose (falling back or failing as the policy says), runs the PPO steps, numbers every
event, and lets go of every rank on success, failure or cancellation.

Two entry points share one ``Trainer``:
- ``run_spec(spec, run_id=..., on_event=...)``: in this process (CLI, tests), with new rank actors that
  are killed at the end (``worker.engine.ranks.FreshRanks``).
- ``launch_controller(...)``: in the engine host (``worker.engine.host``), a detached Ray actor that
  outlives the app and keeps warm rank actors between runs; the app reads ``events_since`` and
  acknowledges with ``ack`` through a ``RunHandle``.
"""

from __future__ import annotations

import random
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
import torch
from ray.exceptions import RayActorError, RayTaskError

from worker import models, ppo_math
from worker.classify import EnvFacts, ErrorInfo, classify
from worker.contract import NAMESPACE
from worker.engine import compute, plan as planning
from worker.engine.dispatch import Dispatch, Mesh, check_resources, concat_batches, dispatch_of, split_batch
from worker.engine.events import Event, EventLog, Kind, RunState
from worker.engine.rank import RankWorker, RoleLoadError
from worker.engine.ranks import FreshRanks, RankSource, rank_name
from worker.environment import Environment
from worker.probe import environment_fields
from worker.resolution import ModelSupport, resolve
from worker.spec import RunSpec, check_spec, parse_spec

CANCEL_GRACE_S = 5.0  # a cancelled run lets the ranks' calls in flight finish this long before killing them


def controller_name(run_id: str) -> str:
    """The name of a run in the engine (and the app's ``ray_job``): ``attnboard-run-<run_id>``."""
    return f"attnboard-run-{run_id}"


def run_actor_names(run_id: str) -> set[str]:
    """The named rank actors of a ``run_spec`` run still alive (``attnboard-run-<id>-rank<r>``)."""
    prefix = rank_name(run_id, 0)[:-1]
    return {a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
            if a["namespace"] == NAMESPACE and a["name"].startswith(prefix)}


class Cancelled(Exception):
    """The run was cancelled while a call was in flight."""


class RankFailed(Exception):
    """A rank died or raised; ``rank`` and ``cause`` name it."""

    def __init__(self, rank: int, cause: str, *, died: bool, remote_traceback: str = ""):
        self.rank, self.cause, self.died, self.remote_traceback = rank, cause, died, remote_traceback
        what = "died" if died else "failed"
        super().__init__(f"rank {rank} {what}: {cause}")


# ---------------------------------------------------------------------------------------------
# The ranks as one group


class WorkerGroup:
    """The rank actors of one run; ``call`` fans a method out as its ``@register`` declaration says."""

    def __init__(self, handles: list[Any], meshes: dict[str, Mesh], cancelled: Callable[[], bool],
                 grace_s: float = CANCEL_GRACE_S):
        self.handles, self.meshes, self.cancelled, self.grace_s = handles, meshes, cancelled, grace_s
        self.idle = True  # no call in flight: the ranks can be reset and reused

    @property
    def world(self) -> int:
        return len(self.handles)

    def wait(self, refs: list[Any], ranks: list[int]) -> list[Any]:
        """Results in rank order; a dead or failing rank raises RankFailed, cancellation raises Cancelled.

        On cancellation the calls in flight get ``grace_s`` to finish (a PPO step of a small model does),
        so the ranks end idle and can be reused; after that the ranks are left busy and get killed."""
        results: dict[Any, Any] = {}
        rank_of = dict(zip(refs, ranks))
        pending = list(refs)
        self.idle = False
        deadline = None
        while pending:
            if self.cancelled():
                deadline = deadline or time.monotonic() + self.grace_s
                if time.monotonic() >= deadline:
                    raise Cancelled()
            ready, pending = ray.wait(pending, num_returns=1, timeout=0.25)
            for ref in ready:
                try:
                    results[ref] = ray.get(ref)
                except RayActorError as exc:
                    if self.cancelled():
                        raise Cancelled() from None
                    raise RankFailed(rank_of[ref], _actor_death_cause(exc), died=True) from None
                except RayTaskError as exc:
                    if self.cancelled():
                        raise Cancelled() from None
                    cause = exc.cause if exc.cause is not None else exc
                    raise RankFailed(rank_of[ref], f"{type(cause).__name__}: {cause}", died=False,
                                     remote_traceback=str(exc)) from cause
        self.idle = True
        if self.cancelled():
            raise Cancelled()
        return [results[ref] for ref in refs]

    def call(self, method: str, *args: Any, batch: dict[str, Any] | None = None, **kwargs: Any) -> Any:
        if self.cancelled():
            raise Cancelled()  # between calls: nothing in flight, the ranks stay reusable
        spec = dispatch_of(RankWorker, method)
        if spec.mode == Dispatch.ONE_TO_ALL:
            refs = [getattr(h, method).remote(*args, **kwargs) for h in self.handles]
            return self.wait(refs, list(range(self.world)))
        mesh = self.meshes[spec.mesh]
        parts = split_batch(batch, mesh.dp)
        refs = [getattr(h, method).remote(parts[mesh.dp_rank(r)], *args, **kwargs) for r, h in enumerate(self.handles)]
        results = self.wait(refs, list(range(self.world)))
        return [results[r] for r in range(self.world) if mesh.sp_rank(r) == 0]  # one per data-parallel shard


def _actor_death_cause(exc: RayActorError) -> str:
    text = str(exc).strip().splitlines()
    return next((line.strip() for line in text if "cause" in line.lower() or "killed" in line.lower()),
                text[0] if text else type(exc).__name__)


def _mean(rows: list[dict[str, float]]) -> dict[str, float]:
    keys = {k for row in rows for k in row}
    return {k: sum(r[k] for r in rows if k in r) / sum(1 for r in rows if k in r) for k in sorted(keys)}


# ---------------------------------------------------------------------------------------------
# The run


@dataclass
class RunOptions:
    model_roots: list[Path]
    cache_dir: Path
    save_actor_to: Path | None = None


class Trainer:
    """One run from start to a terminal status, every step reported through ``log``."""

    def __init__(self, spec: RunSpec, *, log: EventLog, options: RunOptions, ranks: RankSource | None = None):
        self.spec, self.log, self.options = spec, log, options
        self.ranks: RankSource = ranks or FreshRanks()
        self._cancel = threading.Event()
        self.group: WorkerGroup | None = None
        self._lock = threading.Lock()

    # ---- control

    def cancel(self, reason: str = "cancelled by the user") -> None:
        """Stop at the next call boundary (see ``WorkerGroup.wait``); ``run`` then lets go of the ranks."""
        self._cancel_reason = reason
        self._cancel.set()

    def kill(self, reason: str) -> None:
        """Stop now: cancel and kill the ranks, whatever they are doing."""
        self.cancel(reason)
        self.stop_ranks(reusable=False)

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def run(self) -> str:
        """Run to the end; returns the terminal state. Never raises: failures become events.

        The final status is emitted after the ranks were let go of, so a run that reads ``succeeded``
        holds nothing any more (and its warm ranks are back in the pool for the next run)."""
        log = self.log
        try:
            log.status(RunState.starting, "scheduling rank workers")
            self._run()
            final = (RunState.succeeded, f"{self.total_steps} steps done", {})
        except Cancelled:
            final = self._cancelled_end()
        except RankFailed as exc:
            if self.cancelled:
                final = self._cancelled_end()
            else:
                log.emit(Kind.error, {"message": str(exc), "rank": exc.rank, "cause": exc.cause, "died": exc.died,
                                      "traceback": exc.remote_traceback[-4000:]})
                final = (RunState.failed, str(exc), {"rank": exc.rank})
        except RoleFailure as exc:
            log.emit(Kind.error, exc.payload)
            final = (RunState.failed, exc.payload["message"], {"role": exc.payload["role"]})
        except Exception as exc:  # noqa: BLE001 - the run ends failed with the cause, never silently
            if self.cancelled:
                final = self._cancelled_end()
            else:
                log.emit(Kind.error, {"message": f"{type(exc).__name__}: {exc}",
                                      "traceback": traceback.format_exc()[-4000:]})
                final = (RunState.failed, f"{type(exc).__name__}: {exc}", {})
        state, reason, extra = final
        try:
            self.stop_ranks(reusable=state in (RunState.succeeded, RunState.cancelled))
        except Exception:  # noqa: BLE001 - letting go must never hide the run's end
            traceback.print_exc()
        log.status(state, reason, **extra)
        return log.state

    def _cancelled_end(self) -> tuple[RunState, str, dict[str, Any]]:
        return RunState.cancelled, getattr(self, "_cancel_reason", "cancelled"), {}

    def stop_ranks(self, *, reusable: bool = False) -> None:
        """Hand the ranks back: reused (warm pool) only when ``reusable`` and no call is in flight."""
        with self._lock:
            group, self.group = self.group, None
        if group is not None:
            self.ranks.release(group.handles, device=self.spec.trainer.device, reusable=reusable and group.idle)

    # ---- phases

    def _run(self) -> None:
        spec, log = self.spec, self.log
        arr = spec.actor_rollout_ref
        actor_folder = models.resolve_model_path(arr.model.path, self.options.model_roots,
                                                 cache_dir=self.options.cache_dir)
        critic_folder = (models.resolve_model_path(spec.critic.model.path, self.options.model_roots,
                                                   cache_dir=self.options.cache_dir) if spec.has_critic else None)
        errors = [i for i in check_spec(spec, actor_model=models.model_info(actor_folder),
                                        critic_model=models.model_info(critic_folder) if critic_folder else None,
                                        launch=True)
                  if i.severity == "error"]
        if errors:
            raise ValueError("; ".join(f"{i.field}: {i.message}" for i in errors))

        device = spec.trainer.device
        world = spec.world_size
        available = dict(ray.available_resources())
        for key, amount in self.ranks.idle_resources().items():  # idle warm ranks are ours to take
            available[key] = available.get(key, 0.0) + amount
        check_resources(device=device, world=world, available=available)
        meshes = {"actor": Mesh(world, spec.actor_sp), "critic": Mesh(world, spec.critic_sp if spec.has_critic else 1)}
        self._start_ranks(device, world, meshes)
        group = self.group
        assert group is not None

        # Probe the node the ranks run on, then resolve for it.
        probe = group.handles[0].probe.remote(None)
        probe = group.wait([probe], [0])[0]
        log.emit(Kind.env_probe, {"rank": 0, **probe})
        env = Environment.from_dict(environment_fields(probe))
        resolution = resolve(spec, env, actor_support=ModelSupport(**models.architecture_support(actor_folder)),
                             critic_support=ModelSupport(**models.architecture_support(critic_folder))
                             if critic_folder else None)
        log.emit(Kind.log, {"message": "resolution preview for the probed environment", "resolution": resolution.to_dict()})

        load = planning.load_plan(spec, resolution, actor_folder=str(actor_folder),
                                  critic_folder=str(critic_folder) if critic_folder else None, env=env.to_dict())
        note = planning.checkpointing_note(spec)
        if note:
            log.emit(Kind.log, {"message": note})
        try:
            reports = group.call("load", load)
        except RankFailed as exc:
            raise _role_failure(exc, load, env) from None
        for rank_reports in reports:
            for report in rank_reports:
                self._emit_attention(report, resolution)

        self.tokenizer = models.load_tokenizer(actor_folder)
        self._train(resolution)
        if self.options.save_actor_to is not None:
            saved = group.call("save_actor", str(self.options.save_actor_to))
            log.emit(Kind.log, {"message": f"saved the actor to {saved[0]}", "path": saved[0]})

    def _start_ranks(self, device: str, world: int, meshes: dict[str, Mesh]) -> None:
        acquired = self.ranks.acquire(run_id=self.log.run_id, device=device, world=world)
        handles = acquired.handles
        group = WorkerGroup(handles, meshes, lambda: self.cancelled)
        with self._lock:
            self.group = group
        if self.cancelled:
            raise Cancelled()
        self.pids = group.wait([h.assign.remote(r, world, self.log.run_id) for r, h in enumerate(handles)],
                               list(range(world)))
        addr, port = group.wait([handles[0].address.remote()], [0])[0]
        group.call("init_process_group", addr, port, sorted({m.sp for m in meshes.values()}))
        started = f"{acquired.warm} warm, {world - acquired.warm} new" if acquired.warm else "all new"
        self.log.emit(Kind.log, {"message": f"{world} rank workers up ({device}, {started}, process group on "
                                            f"{addr}:{port})", "pids": self.pids, "warm": acquired.warm})

    def _emit_attention(self, report: dict[str, Any], resolution) -> None:
        predicted = resolution.roles[report["role"]]
        for payload in planning.fallback_payloads(report):
            self.log.emit(Kind.fallback, payload)
        payload = planning.attention_payload(report, predicted)
        self.log.emit(Kind.attention, payload)
        for mismatch in planning.mismatches(payload):
            self.log.emit(Kind.attention_mismatch, mismatch)

    # ---- PPO

    def _train(self, resolution) -> None:
        from worker import data

        spec, log = self.spec, self.log
        tok = self.tokenizer
        rows = data.load_prompts(spec.data.train_files, tok, spec.data.max_prompt_length, seed=spec.attnboard.seed)
        bsz = spec.data.train_batch_size
        if len(rows) < bsz:
            raise ValueError(f"data.train_files {spec.data.train_files!r} has {len(rows)} prompts, fewer than "
                             f"data.train_batch_size ({bsz})")
        steps_per_epoch = len(rows) // bsz
        self.total_steps = spec.trainer.total_training_steps or spec.trainer.total_epochs * steps_per_epoch
        log.status(RunState.running, f"training for {self.total_steps} steps", total_steps=self.total_steps)
        order_rng = random.Random(spec.attnboard.seed)
        order: list[int] = []
        eos = tok.eos_token_id
        pad = tok.pad_token_id if tok.pad_token_id is not None else (eos if eos is not None else 0)
        first_step = True
        for step in range(1, self.total_steps + 1):
            if len(order) < bsz:
                epoch = list(range(len(rows)))
                order_rng.shuffle(epoch)
                order.extend(epoch)
            picked = [rows[i] for i in order[:bsz]]
            del order[:bsz]
            metrics = self._step(picked, step=step, eos=eos, pad=pad, resolution=resolution, emit_rollout=first_step)
            first_step = False
            log.emit(Kind.metric, metrics)

    def _step(self, picked: list[Any], *, step: int, eos: int | None, pad: int, resolution, emit_rollout: bool) -> dict[str, Any]:
        from worker import rewards

        spec, group = self.spec, self.group
        arr = spec.actor_rollout_ref
        n = arr.rollout.n
        t0 = time.perf_counter()

        # Prompts, left-padded to the longest in the batch, each repeated n times (a GRPO group).
        p = max(len(r.prompt_ids) for r in picked)
        prompt_ids = torch.full((len(picked), p), pad, dtype=torch.long)  # (B, P)
        prompt_mask = torch.zeros(len(picked), p, dtype=torch.long)  # (B, P)
        for i, row in enumerate(picked):
            ids = torch.tensor(row.prompt_ids, dtype=torch.long)
            prompt_ids[i, p - len(ids):] = ids
            prompt_mask[i, p - len(ids):] = 1
        prompt_ids = prompt_ids.repeat_interleave(n, dim=0)  # (N, P), N = B * n
        prompt_mask = prompt_mask.repeat_interleave(n, dim=0)  # (N, P)
        uid = [i for i in range(len(picked)) for _ in range(n)]  # (N,) the GRPO group of each row

        temperature = arr.rollout.temperature if arr.rollout.do_sample and arr.rollout.temperature > 0 else 1.0
        gen_settings = {"max_new_tokens": spec.data.max_response_length, "eos_token_id": eos, "pad_token_id": pad,
                        "temperature": arr.rollout.temperature, "top_p": arr.rollout.top_p,
                        "do_sample": arr.rollout.do_sample, "seed": spec.attnboard.seed}
        gen_parts = group.call("generate", gen_settings, batch={"prompt_ids": prompt_ids, "prompt_mask": prompt_mask})
        if emit_rollout:
            self._emit_rollout_attention(resolution)
        gen = concat_batches(gen_parts)
        batch = {**compute.assemble(prompt_ids, prompt_mask, gen["responses"], gen["response_mask"]),
                 "responses": gen["responses"], "response_mask": gen["response_mask"]}
        mask = batch["response_mask"].float()  # (N, R)
        t_gen = time.perf_counter()

        # Rule-based reward on the decoded text, placed on each response's last token.
        scores = torch.zeros_like(mask)  # (N, R)
        seq_scores = []
        for i, row in enumerate(picked_rows(picked, n)):
            length = int(mask[i].sum())
            text = self.tokenizer.decode(batch["responses"][i, :length].tolist(), skip_special_tokens=True)
            score = float(rewards.get_reward_fn(spec.custom_reward_function.name, row.data_source)(
                row.data_source, text, row.ground_truth))
            seq_scores.append(score)
            scores[i, max(length - 1, 0)] = score

        old = concat_batches(group.call("compute_log_prob", temperature, batch=batch))
        batch["old_log_probs"] = old["old_log_probs"]
        batch["ref_log_prob"] = concat_batches(group.call("compute_ref_log_prob", temperature, batch=batch))["ref_log_prob"]
        metrics: dict[str, float] = {}
        if spec.algorithm.use_kl_in_reward:
            token_rewards, kl_metrics = ppo_math.apply_kl_in_reward(
                scores, batch["old_log_probs"], batch["ref_log_prob"], mask, spec.algorithm.kl_ctrl.kl_coef,
                spec.algorithm.kl_penalty)
            metrics.update(kl_metrics)
        else:
            token_rewards = scores
        if spec.has_critic:
            batch["values"] = concat_batches(group.call("compute_values", batch=batch))["values"]
            advantages, returns = ppo_math.compute_gae_advantage_return(
                token_rewards, batch["values"], mask, spec.algorithm.gamma, spec.algorithm.lam)
        else:
            advantages, returns = ppo_math.compute_grpo_outcome_advantage(
                token_rewards, mask, uid, norm_adv_by_std=spec.algorithm.norm_adv_by_std_in_grpo)
        batch["advantages"], batch["returns"] = advantages, returns

        actor_mesh = group.meshes["actor"]
        rows_per_rank = len(uid) // actor_mesh.dp
        mini = max(arr.actor.ppo_mini_batch_size * n // actor_mesh.dp, 1)
        micro = arr.actor.ppo_micro_batch_size_per_gpu or mini
        if spec.has_critic:
            critic_mesh = group.meshes["critic"]
            c_mini = min(max(arr.actor.ppo_mini_batch_size * n // critic_mesh.dp, 1), len(uid) // critic_mesh.dp)
            c_settings = compute.CriticSettings(
                ppo_epochs=arr.actor.ppo_epochs, mini_batch=c_mini,
                micro_batch=spec.critic.ppo_micro_batch_size_per_gpu or c_mini,
                cliprange_value=spec.critic.cliprange_value, grad_clip=spec.critic.grad_clip)
            metrics.update(_mean(group.call("update_critic", c_settings, batch=batch)))
        a_settings = compute.ActorSettings(
            ppo_epochs=arr.actor.ppo_epochs, mini_batch=min(mini, rows_per_rank), micro_batch=min(micro, mini),
            clip_ratio=arr.actor.clip_ratio, entropy_coeff=arr.actor.entropy_coeff, use_kl_loss=arr.actor.use_kl_loss,
            kl_loss_coef=arr.actor.kl_loss_coef, kl_loss_type=arr.actor.kl_loss_type, grad_clip=arr.actor.grad_clip,
            temperature=temperature)
        metrics.update(_mean(group.call("update_actor", a_settings, batch=batch)))
        step_time = time.perf_counter() - t0

        valid_tokens = float(batch["attention_mask"].sum())
        kl = ppo_math.masked_mean(batch["old_log_probs"] - batch["ref_log_prob"], mask)  # k1 estimate
        probs_diff = ppo_math.masked_mean((gen["rollout_log_probs"].exp() - batch["old_log_probs"].exp()).abs(), mask)
        peak = group.call("peak_memory_mb")
        metrics.update({
            "critic/rewards/mean": float(token_rewards.sum(-1).mean()),
            "critic/score/mean": sum(seq_scores) / len(seq_scores),
            "actor/kl": float(kl),
            "actor/entropy": float(ppo_math.masked_mean(old["entropy"], mask)),
            "response_length/mean": float(mask.sum(-1).mean()),
            "training/rollout_probs_diff_mean": float(probs_diff),
            "perf/tokens_per_s": valid_tokens / step_time,
            "perf/step_time_s": step_time,
            "timing_s/gen": t_gen - t0,
            "perf/max_memory_mb": max(peak),
        })
        return {"step": step, "total_steps": self.total_steps, "values": metrics,
                "peak_memory_mb": {str(r): m for r, m in enumerate(peak)}}

    def _emit_rollout_attention(self, resolution) -> None:
        """The first generate on each rank was observed; ask each rank for its rollout report."""
        reports = self.group.call("rollout_attention")
        for report in reports:
            if report is not None:
                self._emit_attention({**report, "attempts": [{"implementation": report["effective"], "ok": True}]},
                                     resolution)


def picked_rows(picked: list[Any], n: int) -> list[Any]:
    return [row for row in picked for _ in range(n)]


class RoleFailure(Exception):
    def __init__(self, payload: dict[str, Any]):
        self.payload = payload
        super().__init__(payload["message"])


def _role_failure(exc: RankFailed, load, env: Environment) -> Exception:
    """A load that failed on a rank -> the classified error of the role (strict policy, or chain exhausted)."""
    cause = exc.__cause__
    if isinstance(cause, RoleLoadError):
        last = cause.attempts[-1]
        return RoleFailure({"message": f"[{cause.role}] rank {exc.rank}: {last['error']}", "role": cause.role,
                            "rank": exc.rank, "policy": load.policy, "attempts": cause.attempts,
                            "diagnosis": last.get("diagnosis")})
    diagnosis = classify(ErrorInfo.from_traceback_text(exc.remote_traceback or exc.cause), EnvFacts.of(env))
    return RoleFailure({"message": str(exc), "role": None, "rank": exc.rank, "policy": load.policy, "attempts": [],
                        "diagnosis": diagnosis.as_dict()})


# ---------------------------------------------------------------------------------------------
# Entry points


def run_spec(spec: RunSpec | dict, *, run_id: str, on_event: Callable[[Event], None] | None = None,
             model_roots: list[Path] | None = None, cache_dir: Path | str | None = None,
             save_actor_to: Path | str | None = None) -> str:
    """Run a spec in this process (one Ray actor per rank; Ray must be initialised) -> the final state."""
    spec = spec if isinstance(spec, RunSpec) else parse_spec(spec)
    log = EventLog(run_id, on_event)
    log.status(RunState.queued, "submitted")
    options = RunOptions(model_roots=list(model_roots or []),
                         cache_dir=Path(cache_dir) if cache_dir else models.default_cache_dir(),
                         save_actor_to=Path(save_actor_to) if save_actor_to else None)
    return Trainer(spec, log=log, options=options).run()


class RunController:
    """One run inside the engine host: the trainer on its own thread and the run's events until the app
    has acknowledged them all."""

    def __init__(self, spec: dict, run_id: str, model_roots: list[str] | None = None, cache_dir: str | None = None,
                 save_actor_to: str | None = None, ranks: RankSource | None = None):
        self.run_id = run_id
        self.log = EventLog(run_id)
        self.acked = 0
        self.log.status(RunState.queued, "submitted")
        options = RunOptions(model_roots=[Path(r) for r in model_roots or []],
                             cache_dir=Path(cache_dir) if cache_dir else models.default_cache_dir(),
                             save_actor_to=Path(save_actor_to) if save_actor_to else None)
        self.trainer = Trainer(parse_spec(spec), log=self.log, options=options, ranks=ranks)
        self.thread: threading.Thread | None = None

    def start(self) -> bool:
        if self.thread is None:
            self.thread = threading.Thread(target=self.trainer.run, name=f"run-{self.run_id}", daemon=True)
            self.thread.start()
        return True

    def events_since(self, after_seq: int, limit: int = 1000) -> list[Event]:
        return self.log.since(after_seq, limit)

    def status(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "state": self.log.state, "last_seq": self.log.last_seq, "acked": self.acked,
                "terminal": self.log.terminal}

    def cancel(self, reason: str = "cancelled by the user", timeout: float = CANCEL_GRACE_S + 5.0) -> dict[str, Any]:
        """Stop the run; a run still busy after ``timeout`` seconds has its ranks killed."""
        if self.thread is None:  # never started: nothing runs, end it here
            if not self.log.terminal:
                self.log.status(RunState.cancelled, reason)
        else:
            self.trainer.cancel(reason)
            self.thread.join(timeout=timeout)
            if self.thread.is_alive():
                self.trainer.kill(reason)
                self.thread.join(timeout=5.0)
        return self.status()

    def kill(self, reason: str) -> None:
        """Stop at once (the app gave up on the run): ranks killed, no grace."""
        self.trainer.kill(reason)

    def ack(self, seq: int) -> dict[str, Any]:
        """The app persisted every event up to ``seq``; a finished, fully acknowledged run is done
        (``finished`` in the answer): the host forgets it."""
        self.acked = max(self.acked, int(seq))
        status = self.status()
        status["finished"] = bool(status["terminal"] and self.acked >= self.log.last_seq)
        return status


def launch_controller(spec: dict, *, run_id: str, model_roots: list[str] | None = None,
                      cache_dir: str | None = None, save_actor_to: str | None = None) -> Any:
    """Start a run in the engine host (created on first use) -> its ``RunHandle``.

    ValueError when the host already has a run of that id."""
    from worker.engine.host import RunHandle, engine_host

    host = engine_host()
    if not ray.get(host.submit.remote(spec, run_id, model_roots, cache_dir, save_actor_to)):
        raise ValueError(f"run {run_id}: the engine host already has it")
    return RunHandle(host, run_id)


def get_controller(run_id: str) -> Any:
    """The ``RunHandle`` of a run the engine host has (ValueError when it has not, or there is no host)."""
    from worker.engine.host import RunHandle, find_host

    host = find_host()
    if host is None or not ray.get(host.has_run.remote(run_id)):
        raise ValueError(f"run {run_id}: not in the engine host")
    return RunHandle(host, run_id)
