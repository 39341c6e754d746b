"""The trainer of one run: it takes one Ray actor per rank, loads the roles with the attention the
resolution chose (falling back or failing as the policy says), runs the PPO steps (``worker.engine.step``),
saves and resumes checkpoints, restarts after a rank died, numbers every event, and lets go of every rank
on success, failure or cancellation.

The run controller (``worker.engine.controller``) drives it in the engine host or in this process.
"""

from __future__ import annotations

import os
import random
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray

from worker.attention.resolution import ModelSupport, resolve
from worker.core.contract import ACTIVE
from worker.core.devices import rank_cpus
from worker.core.environment import Environment
from worker.engine import checkpoint, models
from worker.engine import plan as planning
from worker.engine.checkpoint import Checkpoint, CheckpointError
from worker.engine.dispatch import Mesh, ResourceError, check_resources
from worker.engine.events import EventLog, Kind, RunState
from worker.engine.group import Cancelled, RankFailed, WorkerGroup
from worker.engine.probe import environment_fields
from worker.engine.rank import RoleLoadError
from worker.engine.ranks import FreshRanks, RankSource, cluster
from worker.engine.ranks import kill as kill_rank
from worker.engine.step import PPOStep
from worker.spec import RunSpec, check_spec, spec_to_tree
from worker.troubleshoot.classify import ErrorInfo, classify

CANCEL_BOUND_S = 15.0
"""A cancel ends the run within this: a controller still busy after the grace (and 5 s more) has its ranks
killed, and one still stuck after that (e.g. in a read that never returns) is left behind with the run
marked cancelled."""
STATE_ORDER = ACTIVE  # queued -> starting -> running
RESOURCE_WAIT_S = 30.0  # how long a run waits for CPUs a released run's ranks still hold


@dataclass
class RunOptions:
    model_roots: list[Path]
    cache_dir: Path
    save_actor_to: Path | None = None
    artefact_dir: Path | None = None
    """The run's own folder: a relative ``trainer.default_local_dir`` goes under it (None: a folder of this
    run under the temp folder)."""
    checkpoint_roots: list[Path] | None = None
    """Folders checkpoints may be written to and read from (None: anywhere). The service confines them to
    its checkpoint folder."""


@dataclass(frozen=True)
class Continuation:
    """A run started again in a new engine host after its host died (the app decides, see
    ``app.services.pump``): why, which restart this is, and where its stored events stand."""

    cause: str
    attempt: int
    first_seq: int
    state: str
    last_metric_step: int = 0

    @classmethod
    def of(cls, data: dict[str, Any] | None) -> Continuation | None:
        return None if data is None else cls(**data)


class Trainer:
    """One run from start to a terminal status, every step reported through ``log``.

    A rank that dies (its process is gone: SIGKILL, a crash, Ray's memory monitor, a lost node) does not
    end the run while ``attnboard.max_restarts`` allows another attempt: the ranks are let go of, the run
    resumes on new ranks from its newest complete checkpoint (or from the start when it has none), and a
    ``restart`` event says why and from which step. A rank that raises (an exception in its step, e.g. a
    CUDA out-of-memory error) fails the run: the same step would fail again."""

    def __init__(self, spec: RunSpec, *, log: EventLog, options: RunOptions, ranks: RankSource | None = None,
                 continuation: Continuation | None = None):
        self.spec, self.log, self.options = spec, log, options
        self.ranks: RankSource = ranks or FreshRanks()
        self._cancel = threading.Event()
        self.group: WorkerGroup | None = None
        self._held: list[Any] = []  # every rank actor the run holds, until released
        self._lock = threading.Lock()
        self.continuation = continuation
        self.restarts = continuation.attempt if continuation else 0
        self.last_metric_step = continuation.last_metric_step if continuation else 0
        self.resume: Checkpoint | None = None  # what the next attempt resumes from
        self._resume_decided = False
        self.placements: list[dict[str, Any]] = []
        self.total_steps = spec.total_steps or 0
        self.rank_cpus = 1  # what each rank asks Ray for and its torch threads (``worker.core.devices``), set at start

    # ---- control

    def cancel(self, reason: str = "cancelled by the user") -> None:
        """Stop at the next call boundary (see ``WorkerGroup.wait``); ``run`` then lets go of the ranks."""
        self._cancel_reason = reason
        self._cancel.set()

    def kill(self, reason: str) -> None:
        """Stop now: cancel and kill the ranks, whatever they are doing (also ranks a stuck release holds)."""
        self.cancel(reason)
        with self._lock:
            held = list(self._held)
        for handle in held:
            kill_rank(handle)
        self.stop_ranks(reusable=False)

    def abandon(self, reason: str) -> None:
        """The controller did not stop after ``kill``: end the run here (cancelled); whatever its thread
        does when it returns is not recorded (the event log takes nothing after the final status)."""
        self.kill(reason)
        self.log.status(RunState.cancelled, f"{reason} (the controller did not stop within {CANCEL_BOUND_S:g} s: "
                                            f"its ranks were killed)")

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def run(self) -> str:
        """Run to the end; returns the terminal state. Never raises: failures become events.

        The final status is emitted after the ranks were let go of, so a run that reads ``succeeded``
        holds nothing any more (and its warm ranks are back in the pool for the next run)."""
        log = self.log
        restart = (self.continuation.cause, None, "app") if self.continuation else None
        while True:
            try:
                if restart is None:
                    self._status(RunState.starting, "scheduling rank workers")
                else:
                    self._restart(*restart)
                    restart = None
                self._run()
                final = (RunState.succeeded, f"{self.total_steps} steps done", {})
            except Cancelled:
                final = self._cancelled_end()
            except RankFailed as exc:
                if self.cancelled:
                    final = self._cancelled_end()
                elif exc.died and self.restarts < self.spec.attnboard.max_restarts:
                    self.stop_ranks(reusable=False)  # the survivors may be stuck in a collective with the dead one
                    self.restarts += 1
                    restart = (str(exc), exc.rank, "engine")
                    continue
                else:
                    after = f" (after {self.restarts} restart{'s' if self.restarts != 1 else ''})" if self.restarts else ""
                    log.emit(Kind.error, {"message": f"{exc}{after}", "rank": exc.rank, "cause": exc.cause,
                                          "died": exc.died, "traceback": exc.remote_traceback[-4000:]})
                    final = (RunState.failed, f"{exc}{after}", {"rank": exc.rank})
            except RoleFailure as exc:
                log.emit(Kind.error, exc.payload)
                final = (RunState.failed, exc.payload["message"], {"role": exc.payload["role"]})
            except CheckpointError as exc:
                log.emit(Kind.error, {"message": str(exc), "field": exc.issues[0].field,
                                      "issues": [i.as_dict() for i in exc.issues]})
                final = (RunState.failed, str(exc), {})
            except Exception as exc:
                if self.cancelled:
                    final = self._cancelled_end()
                else:
                    log.emit(Kind.error, {"message": f"{type(exc).__name__}: {exc}",
                                          "traceback": traceback.format_exc()[-4000:]})
                    final = (RunState.failed, f"{type(exc).__name__}: {exc}", {})
            break
        state, reason, extra = final
        try:
            self.stop_ranks(reusable=state in (RunState.succeeded, RunState.cancelled))
        except Exception:
            traceback.print_exc()
        log.status(state, reason, **extra)
        return log.state

    def _cancelled_end(self) -> tuple[RunState, str, dict[str, Any]]:
        return RunState.cancelled, getattr(self, "_cancel_reason", "cancelled"), {}

    def _status(self, state: RunState, reason: str, **extra: Any) -> None:
        """A status that never goes back: a restarted run that was running stays running (its reason changes)."""
        current = self.log.state
        if current in STATE_ORDER and STATE_ORDER.index(current) > STATE_ORDER.index(state.value):
            state = RunState(current)
        self.log.status(state, reason, **extra)

    def stop_ranks(self, *, reusable: bool = False) -> None:
        """Hand the ranks back: reused (warm pool) only when ``reusable`` and no call is in flight."""
        with self._lock:
            group, self.group = self.group, None
        if group is not None:
            self.ranks.release(group.handles, device=self.spec.trainer.device, reusable=reusable and group.idle,
                               cpus=self.rank_cpus)
            with self._lock:
                self._held = [h for h in self._held if h not in group.handles]

    # ---- checkpoints and restarts

    @property
    def run_id(self) -> str:
        return self.log.run_id

    def _artefact_dir(self) -> Path:
        import tempfile

        if self.options.artefact_dir is not None:
            return self.options.artefact_dir
        return Path(tempfile.gettempdir()) / f"attnboard-runs-{os.getuid()}" / checkpoint._safe(self.run_id)

    def checkpoint_folder(self) -> Path:
        """``trainer.default_local_dir`` of this run, resolved and checked against the allowed roots."""
        folder = checkpoint.checkpoint_folder(self.spec, self._artefact_dir())
        return checkpoint.confine(folder, self.options.checkpoint_roots, key="trainer.default_local_dir")

    def _log_skipped(self, skipped: list[checkpoint.Skipped], *, removed: bool) -> None:
        for item in skipped:
            self.log.emit(Kind.log, {"message": item.message + ("; removed" if removed else ""),
                                     "skipped_checkpoint": str(item.path)})

    def _initial_point(self) -> Checkpoint | None:
        """What ``trainer.resume_mode`` resumes from: auto, the newest complete checkpoint in
        ``default_local_dir``; resume_path, ``resume_from_path``; disable, nothing."""
        trainer = self.spec.trainer
        folder = self.checkpoint_folder()
        self._log_skipped(checkpoint.remove_partials(folder, self.run_id), removed=True)
        if trainer.resume_mode == "disable":
            found = [c for c in checkpoint.scan(folder)[0] if c.resumable]
            if found:
                self.log.emit(Kind.log, {"message": f"trainer.resume_mode=disable: starting fresh; the {len(found)} "
                                                    f"checkpoint(s) in {folder} are not used"})
            return None
        if trainer.resume_mode == "resume_path":
            path = checkpoint.under(str(trainer.resume_from_path), self._artefact_dir())
            path = checkpoint.confine(path, self.options.checkpoint_roots, key="trainer.resume_from_path")
            self._log_skipped(checkpoint.scan(path if not path.name.startswith(checkpoint.STEP_PREFIX)
                                              else path.parent)[1], removed=False)
            return checkpoint.locate(path)
        self._log_skipped(checkpoint.scan(folder)[1], removed=False)
        return checkpoint.newest(folder)

    def _restart_point(self) -> Checkpoint | None:
        """After a death: the newest complete checkpoint this run saved, else what it started from."""
        folder = self.checkpoint_folder()
        self._log_skipped(checkpoint.remove_partials(folder, self.run_id), removed=True)
        return checkpoint.newest(folder, run_id=self.run_id) or self._initial_point()

    def _restart(self, cause: str, rank: int | None, source: str) -> None:
        """Announce a restart (``restart`` event) and decide the checkpoint the next attempt resumes from."""
        point = self._restart_point()
        self.resume, self._resume_decided = point, True
        limit = self.spec.attnboard.max_restarts
        where = f"resuming from step {point.step} ({point.path})" if point else \
            "from the start (no complete checkpoint yet)"
        message = f"restart {self.restarts} of {limit}: {cause}; {where}"
        self.log.emit(Kind.restart, {"message": message, "cause": cause, "rank": rank, "attempt": self.restarts,
                                     "max_restarts": limit, "resumed_from_step": point.step if point else 0,
                                     "checkpoint": str(point.path) if point else None, "source": source})
        self._status(RunState.starting, message)

    def _models_meta(self, folders: dict[str, Path]) -> dict[str, dict[str, Any]]:
        """Per trained role: its model folder and the shape-deciding config attributes (for ``fit_issues``)."""
        sections = {"actor": self.spec.actor_rollout_ref.model, "critic": self.spec.critic.model}
        return {role: {"path": str(folder), "shape": checkpoint.shape_of(
                    models.build_config(folder, sections[role].override_config, "eager"))}
                for role, folder in folders.items()}

    def _save(self, step: int, order_rng: random.Random, pending: list[int], signature: dict[str, Any]) -> None:
        """A checkpoint of this step (see ``worker.engine.checkpoint``): ranks write their shards into the partial
        folder, the marker goes last, one rename commits it, then the tracker and the pruning."""
        spec, group = self.spec, self.group
        assert group is not None
        folder = self.checkpoint_folder()
        partial = checkpoint.partial_folder(folder, step, self.run_id)
        partial.mkdir(parents=True, exist_ok=True)
        parts = group.call("save_checkpoint", str(partial))
        meta = {
            "format": checkpoint.FORMAT, "step": step, "run_id": self.run_id, "saved_at": checkpoint.now_iso(),
            "world_size": group.world, "roles": parts[0]["roles"], "generations": parts[0]["generations"],
            "total_steps": self.total_steps,
            "data": {"signature": signature, "rng_state": _rng_to_json(order_rng.getstate()), "pending": pending},
            "kl_ctrl": {"type": "fixed", "kl_coef": spec.algorithm.kl_ctrl.kl_coef},
            "models": self._models, "spec": spec_to_tree(spec),
        }
        checkpoint.write_marker(partial, meta)
        final = checkpoint.step_folder(folder, step)
        checkpoint.commit(partial, final)
        checkpoint.write_tracker(folder, step)
        pruned = checkpoint.prune(folder, run_id=self.run_id, keep={
            "actor": spec.trainer.max_actor_ckpt_to_keep, "critic": spec.trainer.max_critic_ckpt_to_keep})
        size = checkpoint.folder_size(final)
        self.log.emit(Kind.log, {"message": f"checkpoint saved: step {step} ({size / 2**20:.1f} MiB) in {final}"
                                            + (f"; pruned {', '.join(pruned)}" if pruned else ""),
                                 "checkpoint": {"step": step, "path": str(final), "size_bytes": size},
                                 "pruned": pruned})

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
        self._models = self._models_meta({"actor": actor_folder, **({"critic": critic_folder} if critic_folder else {})})
        if not self._resume_decided:
            self.resume, self._resume_decided = self._initial_point(), True
        if self.resume is not None:
            issues = checkpoint.fit_issues(self.resume.meta, models=self._models, spec_tree=spec_to_tree(spec),
                                           path=self.resume.path)
            if issues:
                raise CheckpointError(issues)

        device = spec.trainer.device
        world = spec.world_size
        self.rank_cpus = rank_cpus(spec.attnboard.rank_cpus, device=device, world=world, cluster=cluster(),
                                   free_cpus=self._available().get("CPU", 0.0))
        self._wait_for_resources(device, world)
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
            if exc.died:
                raise
            raise _role_failure(exc, load, env) from None
        for rank_reports in reports:
            for report in rank_reports:
                self._emit_attention(report, resolution)
        if self.resume is not None:
            self._load_checkpoint(self.resume)

        self.tokenizer = models.load_tokenizer(actor_folder)
        self._train(resolution)
        if self.options.save_actor_to is not None:
            saved = group.call("save_actor", str(self.options.save_actor_to))
            log.emit(Kind.log, {"message": f"saved the actor to {saved[0]}", "path": saved[0]})

    def _load_checkpoint(self, point: Checkpoint) -> None:
        """Every rank loads its shards of the trained roles (resharded when the world size differs) and
        continues the rollout's sampling seeds; its RNG state too when the world size is the same."""
        group = self.group
        assert group is not None
        saved_world = point.meta.get("world_size")
        same = saved_world == group.world
        group.call("load_checkpoint", str(point.path), int(point.meta.get("generations", point.step)), same)
        note = "" if same else f"; resharded from a world of {saved_world} to {group.world} (per-rank RNG states not restored)"
        unused = [r for r in point.roles if r not in self._models]
        if unused:
            note += f"; its {', '.join(unused)} is not used by this run"
        self.log.emit(Kind.log, {"message": f"resumed from the checkpoint of step {point.step} in {point.path}{note}",
                                 "resumed_from": {"step": point.step, "path": str(point.path)}})

    def _available(self) -> dict[str, float]:
        """What Ray has free, plus what the idle warm ranks hold (ours to take)."""
        available = dict(ray.available_resources())
        for key, amount in self.ranks.idle_resources().items():
            available[key] = available.get(key, 0.0) + amount
        return available

    def _wait_for_resources(self, device: str, world: int) -> None:
        """``check_resources`` for the run's ranks, waiting up to ``RESOURCE_WAIT_S`` while the cluster could
        hold them but its CPUs are still held (a finished run's ranks that Ray is releasing): a run that
        never fits fails at once, naming both numbers."""
        deadline = time.monotonic() + RESOURCE_WAIT_S
        while True:
            try:
                check_resources(device=device, world=world, available=self._available(), per_rank_cpus=self.rank_cpus)
                return
            except ResourceError:
                check_resources(device=device, world=world, available=dict(ray.cluster_resources()),
                                per_rank_cpus=self.rank_cpus)  # raises when it never fits
                if time.monotonic() > deadline or self.cancelled:
                    raise
            time.sleep(0.25)

    def _start_ranks(self, device: str, world: int, meshes: dict[str, Mesh]) -> None:
        acquired = self.ranks.acquire(run_id=self.log.run_id, device=device, world=world, cpus=self.rank_cpus)
        handles = acquired.handles
        group = WorkerGroup(handles, meshes, lambda: self.cancelled)
        with self._lock:
            self.group = group
            self._held = list(handles)
        if self.cancelled:
            raise Cancelled()
        self.pids = group.wait([h.assign.remote(r, world, self.log.run_id) for r, h in enumerate(handles)],
                               list(range(world)))
        self.placements = group.call("placement")
        addr, port = group.wait([handles[0].address.remote()], [0])[0]
        group.call("init_process_group", addr, port, sorted({m.sp for m in meshes.values()}))
        started = f"{acquired.warm} warm, {world - acquired.warm} new" if acquired.warm else "all new"
        self.log.emit(Kind.log, {"message": f"{world} rank workers up ({device}, {self.rank_cpus} CPU(s) and torch "
                                            f"thread(s) each, {started}, process group on {addr}:{port})",
                                 "pids": self.pids, "warm": acquired.warm, "rank_cpus": self.rank_cpus,
                                 "threads": [p.get("threads") for p in self.placements],
                                 "nodes": [p["node"] for p in self.placements], "attempt": self.restarts})

    def _emit_attention(self, report: dict[str, Any], resolution) -> None:
        predicted = resolution.roles[report["role"]]
        for payload in planning.fallback_payloads(report):
            self.log.emit(Kind.fallback, payload)
        where = self.placements[report["rank"]] if report["rank"] < len(self.placements) else {}
        payload = planning.attention_payload(report, predicted, node=where.get("node"), pid=where.get("pid"),
                                             attempt=self.restarts)
        self.log.emit(Kind.attention, payload)
        for mismatch in planning.mismatches(payload):
            self.log.emit(Kind.attention_mismatch, mismatch)

    # ---- PPO

    def _train(self, resolution) -> None:
        from worker.ppo import data

        spec, log = self.spec, self.log
        tok = self.tokenizer
        rows = data.load_prompts(spec.data.train_files, tok, spec.data.max_prompt_length, seed=spec.attnboard.seed)
        bsz = spec.data.train_batch_size
        if len(rows) < bsz:
            raise ValueError(f"data.train_files {spec.data.train_files!r} has {len(rows)} prompts, fewer than "
                             f"data.train_batch_size ({bsz})")
        steps_per_epoch = len(rows) // bsz
        self.total_steps = spec.trainer.total_training_steps or spec.trainer.total_epochs * steps_per_epoch
        order_rng = random.Random(spec.attnboard.seed)
        order: list[int] = []  # the shuffled prompt indices not drawn yet (epochs appended as needed)
        signature = {"train_files": spec.data.train_files, "rows": len(rows), "seed": spec.attnboard.seed}
        first = 1
        if self.resume is not None:
            first = self.resume.step + 1
            data_state = self.resume.meta.get("data") or {}
            if data_state.get("signature") == signature:
                order_rng.setstate(_rng_from_json(data_state["rng_state"]))
                order = list(data_state["pending"])
            else:
                log.emit(Kind.log, {"message": f"data position not restored: the checkpoint's data was "
                                               f"{data_state.get('signature')}, this run's is {signature}; a new "
                                               f"shuffle starts"})
        what = (f"training for {self.total_steps} steps" if first == 1 else
                f"training steps {first} to {self.total_steps} (resumed from step {first - 1})" if first <= self.total_steps
                else f"nothing left to train: the checkpoint is at step {first - 1} of {self.total_steps}")
        self._status(RunState.running, what, total_steps=self.total_steps)
        assert self.group is not None
        ppo_step = PPOStep(spec, self.group, tok, on_first_rollout=lambda: self._emit_rollout_attention(resolution))
        save_freq = spec.trainer.save_freq
        for step in range(first, self.total_steps + 1):
            if len(order) < bsz:
                epoch = list(range(len(rows)))
                order_rng.shuffle(epoch)
                order.extend(epoch)
            picked = [rows[i] for i in order[:bsz]]
            del order[:bsz]
            metrics = ppo_step(picked, step=step, total_steps=self.total_steps)
            if step > self.last_metric_step:  # a step replayed after a restart was reported already
                log.emit(Kind.metric, metrics)
                self.last_metric_step = step
            if save_freq > 0 and (step % save_freq == 0 or step == self.total_steps):
                self._save(step, order_rng, list(order), signature)

    def _emit_rollout_attention(self, resolution) -> None:
        """The first generate on each rank was observed; ask each rank for its rollout report."""
        reports = self.group.call("rollout_attention")
        for report in reports:
            if report is not None:
                self._emit_attention({**report, "attempts": [{"implementation": report["effective"], "ok": True}]},
                                     resolution)


def _rng_to_json(state: tuple) -> list[Any]:
    """``random.Random.getstate()`` as JSON: [version, [625 ints], gauss_next]."""
    version, internal, gauss = state
    return [version, list(internal), gauss]


def _rng_from_json(data: list[Any]) -> tuple:
    version, internal, gauss = data
    return (version, tuple(internal), gauss)


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
    diagnosis = classify(ErrorInfo.from_traceback_text(exc.remote_traceback or exc.cause), env)
    return RoleFailure({"message": str(exc), "role": None, "rank": exc.rank, "policy": load.policy, "attempts": [],
                        "diagnosis": diagnosis.as_dict()})
