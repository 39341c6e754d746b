"""The Ray launcher: runs go to the engine host (``worker.engine.host``, a detached Ray actor that runs each
run's controller and keeps warm rank actors), started FIFO when the cluster has room for their ranks.

Submitting only checks that Ray is reachable (503 otherwise; the run stays ``queued`` with its spec)
and wakes the scheduler. The scheduler (``schedule``, called by the supervisor thread in
``app.services.pump``) reads the queue from the database: queued runs without a controller, oldest
first. A run starts when its ranks fit (per rank the CPUs ``worker.core.devices.rank_cpus`` gives, plus
1 GPU off CPU, as the controller asks Ray); otherwise it stays ``queued`` and ``status_reason`` says what it waits for.
A run that needs more than the whole cluster does not hold up the runs behind it.

Attention trials are on the same queue (``app.services.trials``): a queued trial needs what a run of its
spec needs (its implementations run one after the other), waits in the order it was made among the
runs, says what it waits for the same way, and holds its ranks until its job in the engine host ends.

Resource accounting keeps the state in the database and Ray: free = min(cluster total - what our
submitted, unfinished runs need, what Ray reports available + what the engine's idle warm ranks hold).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import update
from sqlmodel import Session, col, select

from app.models import Run, RunStatus
from app.models_troubleshooting import TRIAL_ACTIVE, TRIAL_TERMINAL, Trial, TrialStatus
from app.services.launcher import LauncherUnavailable
from app.services.ray_runtime import RayRuntime, RayUnavailable
from app.services.trials import engine_request, job_name
from worker.core.contract import ACTIVE, TERMINAL, run_name
from worker.core.devices import Cluster, rank_cpus, run_resources

log = logging.getLogger("attnboard.scheduler")

HOST_CALL_TIMEOUT_S = 30.0
LAUNCH_TIMEOUT_S = 180.0  # the first launch may have to start the engine host's process


controller_name = run_name  # a run's name in the engine and its ``ray_job``


# --------------------------------------------------------------------------------------------
# Pure scheduling


@dataclass(frozen=True)
class Need:
    """What a run's ranks ask Ray for, e.g. ``{"CPU": 2}`` or ``{"CPU": 1, "GPU": 1}``."""

    resources: Mapping[str, float]

    @classmethod
    def of_spec(cls, spec: Mapping[str, Any], cluster: Cluster) -> Need:
        """From a stored spec tree: one rank per ``nnodes x n_gpus_per_node``, each the CPUs ``rank_cpus`` gives
        for ``attnboard.rank_cpus`` on ``cluster``, plus 1 GPU off CPU."""
        trainer = spec.get("trainer", {}) if isinstance(spec, Mapping) else {}
        ours = spec.get("attnboard", {}) if isinstance(spec, Mapping) else {}
        world = int(trainer.get("nnodes", 1)) * int(trainer.get("n_gpus_per_node", 1))
        device = trainer.get("device", "cuda")
        cpus = rank_cpus(int(ours.get("rank_cpus", 0) or 0), device=device, world=world, cluster=cluster)
        return cls(run_resources(device, world, cpus))

    def fits(self, free: Mapping[str, float]) -> bool:
        return all(free.get(k, 0.0) >= v for k, v in self.resources.items())


def _amount(value: float) -> str:
    return f"{value:g}"


def wait_reason(need: Need, free: Mapping[str, float], total: Mapping[str, float]) -> str | None:
    """None when ``need`` fits in ``free``; else what the run waits for, e.g.
    ``"waiting for 2 CPU (1 free of 4)"``.

    >>> wait_reason(Need({"CPU": 2}), {"CPU": 1}, {"CPU": 4})
    'waiting for 2 CPU (1 free of 4)'
    """
    short = [k for k, v in need.resources.items() if free.get(k, 0.0) < v]
    if not short:
        return None
    parts = [f"{_amount(need.resources[k])} {k} ({_amount(max(free.get(k, 0.0), 0.0))} free of "
             f"{_amount(total.get(k, 0.0))})" for k in short]
    return "waiting for " + " and ".join(parts)


def never_fits(need: Need, total: Mapping[str, float]) -> bool:
    """More than the whole cluster has: it waits for the cluster to grow without blocking the queue."""
    return not need.fits(total)


def free_resources(total: Mapping[str, float], available: Mapping[str, float],
                   held: list[Need]) -> dict[str, float]:
    """min(total - held by our active runs, available as Ray reports it), per resource."""
    free = {}
    for key, amount in total.items():
        ours = amount - sum(n.resources.get(key, 0.0) for n in held)
        free[key] = max(0.0, min(ours, available.get(key, 0.0)))
    return free


@dataclass(frozen=True)
class Job:
    """An entry of the app's one queue: a run or an attention trial (``Job("trial", 3)`` reads ``trial 3``)."""

    kind: str  # "run" | "trial"
    id: int

    def __str__(self) -> str:
        return f"{self.kind} {self.id}"


@dataclass(frozen=True)
class Decision:
    key: Hashable  # the queue entry: a run's id, or a ``Job``
    start: bool
    reason: str | None

    @property
    def run_id(self) -> Hashable:
        return self.key


def _run_label(key: Hashable) -> str:
    return str(key) if isinstance(key, Job) else f"run {key}"


def plan_queue(queue: list[tuple[Hashable, Need]], free: Mapping[str, float], total: Mapping[str, float],
               label: Callable[[Hashable], str] = _run_label) -> list[Decision]:
    """FIFO: start jobs (runs and trials) while they fit; the first that does not fit blocks the ones behind
    it, except jobs that could never fit the whole cluster (those wait aside). ``label`` names a key in the
    reasons (a bare key is a run's id)."""
    free = dict(free)
    decisions = []
    blocker: Hashable | None = None
    for run_id, need in queue:
        if never_fits(need, total):
            reason = wait_reason(need, free, total)
            decisions.append(Decision(run_id, False, f"{reason}; more than the cluster has in all, so it waits "
                                                     f"for the cluster to grow"))
            continue
        if blocker is None and need.fits(free):
            for key, amount in need.resources.items():
                free[key] = free.get(key, 0.0) - amount
            decisions.append(Decision(run_id, True, None))
            continue
        reason = wait_reason(need, free, total) or f"waiting behind {label(blocker)} (first in the queue)"
        if blocker is None:
            blocker = run_id
        decisions.append(Decision(run_id, False, reason))
    return decisions


# --------------------------------------------------------------------------------------------
# The launcher


class RayLauncher:
    """The ``Launcher`` of ``app.services.launcher`` on Ray; ``wake`` is set to nudge the scheduler."""

    def __init__(self, runtime: RayRuntime, *, model_roots: list[str] | None = None, warm_ranks: int = 0,
                 warm_device: str = "cpu", engine_name: str = "attnboard-engine", checkpoint_root: Path | None = None):
        self.runtime = runtime
        self.model_roots = model_roots or []
        self.checkpoint_root = checkpoint_root  # run N's artefacts go to <root>/N (settings.checkpoint_root)
        self.warm_ranks, self.warm_device = warm_ranks, warm_device
        self.engine_name = engine_name  # this app's engine host (``worker.core.contract.host_name`` of its database)
        self.wake = threading.Event()

    # ---- the Launcher protocol

    def submit(self, run: Run) -> str | None:
        """Check Ray is reachable and wake the scheduler; the run starts when its ranks fit."""
        self.connect()
        self.wake.set()
        return run.ray_job

    def cancel(self, run: Run) -> None:
        """A queued run's controller is killed at once (the app marks it cancelled); a starting or running run
        is asked to stop and confirms with its ``status: cancelled`` event."""
        if not run.ray_job:
            return
        try:
            self.connect()
        except LauncherUnavailable:
            log.warning("run %s: cannot reach Ray to cancel it; the supervisor finishes it when Ray is back", run.id)
            return
        handle = self.controller(run.id)
        if handle is None:
            self.wake.set()
            return
        if run.status == RunStatus.queued.value:
            self.kill_run(run.id)
        else:
            handle.cancel("cancelled by the user")
        self.wake.set()

    # ---- Ray access for the scheduler and the pump

    def connect(self) -> None:
        try:
            self.runtime.ensure()
        except RayUnavailable as exc:
            raise LauncherUnavailable(str(exc)) from None

    def warm(self) -> None:
        """Start the engine host now (or resize the pool of the one running), so the first run does not wait
        for its process."""
        host = self.find_host()
        if host is None:
            self.host()
        else:
            host.configure.remote(self.warm_ranks, self.warm_device)

    def find_host(self) -> Any | None:
        """This app's engine host, or None when it is not running."""
        from worker.engine.host import find_host

        return find_host(self.engine_name)

    def host(self) -> Any:
        """The engine host, started with this app's pool settings when there is none."""
        from worker.engine.host import engine_host

        return self.find_host() or engine_host(name=self.engine_name, warm_ranks=self.warm_ranks,
                                               warm_device=self.warm_device)

    def stop_host(self) -> None:
        """Stop this app's engine host, and with it its warm ranks (the app calls this at a graceful stop
        with no active run, so an idle app holds nothing on a shared cluster)."""
        import ray

        if not ray.is_initialized():
            return
        try:
            host = self.find_host()
            if host is not None:
                ray.kill(host, no_restart=True)
                log.info("stopped the engine host %s", self.engine_name)
        except Exception as exc:
            log.warning("could not stop the engine host %s: %s", self.engine_name, exc)

    def controller(self, run_id: int) -> Any | None:
        """The run in the engine host (a ``RunHandle``), or None when the host or the run is gone."""
        import ray
        from ray.exceptions import RayActorError

        from worker.engine.host import RunHandle

        host = self.find_host()
        if host is None:
            return None
        try:
            known = ray.get(host.has_run.remote(str(run_id)), timeout=HOST_CALL_TIMEOUT_S)
        except RayActorError:
            return None
        return RunHandle(host, str(run_id)) if known else None

    def kill_run(self, run_id: int) -> None:
        """Stop the run in the engine host at once (its ranks are killed) and drop it there."""
        self._stop_in_host("kill", "run", run_id)

    def _stop_in_host(self, method: str, kind: str, key: int) -> None:
        """Call the engine host's ``method`` (kill or kill_trial) for the ``kind`` ``key``, when there is a host;
        a failure is logged, not raised (the caller has already recorded the end)."""
        import ray

        host = self.find_host()
        if host is None:
            return
        try:
            ray.get(getattr(host, method).remote(str(key), "stopped by the app"), timeout=HOST_CALL_TIMEOUT_S)
        except Exception as exc:
            log.warning("%s %s: could not stop it in the engine host: %s", kind, key, exc)

    def cluster_resources(self) -> tuple[dict[str, float], dict[str, float], Cluster]:
        """(total, available, the CPUs a rank's share derives from); available includes what the engine's idle
        warm ranks hold, since a run takes those first."""
        import ray

        total, available = dict(ray.cluster_resources()), dict(ray.available_resources())
        nodes = Cluster.of_nodes(ray.nodes())
        host = self.find_host()
        if host is not None:
            try:
                idle = ray.get(host.idle_resources.remote(), timeout=HOST_CALL_TIMEOUT_S)
            except Exception as exc:
                log.warning("engine host: could not read its idle ranks: %s", exc)
                idle = {}
            for key, amount in idle.items():
                available[key] = available.get(key, 0.0) + amount
        return total, available, nodes

    def cluster_total(self) -> dict[str, float]:
        """What the cluster has in all (preflight: resources it can never offer); raises LauncherUnavailable."""
        import ray

        self.connect()
        return dict(ray.cluster_resources())

    def run_folders(self, run_id: int) -> dict[str, Any]:
        """Where the engine puts a run's artefacts (its checkpoints) and the only folder they may be in."""
        if self.checkpoint_root is None:
            return {}
        return {"artefact_dir": str(self.checkpoint_root / str(run_id)), "checkpoint_roots": [str(self.checkpoint_root)]}

    def launch(self, run: Run) -> bool:
        """Start the run in the engine host; False when the host has it already (started before a crash)."""
        import ray

        return bool(ray.get(self.host().submit.remote(run.spec, str(run.id), self.model_roots,
                                                      **self.run_folders(run.id)), timeout=LAUNCH_TIMEOUT_S))

    # ---- trials (jobs of the engine host, see app.services.trials)

    def launch_trial(self, trial: Trial, *, done: list[dict[str, Any]] | None = None, attempt: int = 0) -> bool:
        """Start the trial's job in the engine host (``done``, ``attempt``: again after its host died); False
        when the host has it already."""
        import ray

        return bool(ray.get(self.host().submit_trial.remote(str(trial.id), engine_request(trial), self.model_roots,
                                                            done=done, attempt=attempt), timeout=LAUNCH_TIMEOUT_S))

    def kill_trial(self, trial_id: int) -> None:
        """Stop the trial's job at once and drop it (a trial cancelled while it was being launched)."""
        self._stop_in_host("kill_trial", "trial", trial_id)

    def relaunch(self, run: Run, *, cause: str, attempt: int) -> None:
        """Start a run whose engine host died again, in this app's engine host (a new one when the old is
        gone): it resumes from its newest complete checkpoint and its events continue after ``last_seq``
        (see ``worker.engine.trainer.Continuation``). Raises when Ray or the host refuses."""
        import ray

        continuation = {"cause": cause, "attempt": attempt, "first_seq": run.last_seq + 1, "state": run.status,
                        "last_metric_step": run.step}
        if not ray.get(self.host().submit.remote(run.spec, str(run.id), self.model_roots, continuation=continuation,
                                                 **self.run_folders(run.id)), timeout=LAUNCH_TIMEOUT_S):
            raise RuntimeError(f"run {run.id}: the engine host has it already")


# --------------------------------------------------------------------------------------------
# One scheduling pass (database + Ray)


def schedule(session: Session, launcher: RayLauncher) -> list[int]:
    """Start the queued runs and trials that fit, in the order they were made (one ``plan_queue``); record
    why the others wait. Returns the started runs' ids."""
    queued = session.exec(select(Run).where(Run.status == RunStatus.queued.value, col(Run.ray_job).is_(None))
                          .order_by(col(Run.id))).all()
    trials = session.exec(select(Trial).where(Trial.status == TrialStatus.queued.value, col(Trial.engine_job).is_(None),
                                              col(Trial.cancel_requested).is_(False)).order_by(col(Trial.id))).all()
    if not queued and not trials:
        return []
    try:
        launcher.connect()
        total, available, nodes = launcher.cluster_resources()
    except LauncherUnavailable as exc:
        _set_reasons(session, "run", {run.id: f"waiting for Ray: {exc}" for run in queued})
        _set_reasons(session, "trial", {trial.id: f"waiting for Ray: {exc}" for trial in trials})
        return []
    held_rows = session.exec(select(Run.spec).where(col(Run.status).in_(ACTIVE), col(Run.ray_job).is_not(None))).all()
    held_rows += session.exec(select(Trial.spec).where(col(Trial.status).in_(TRIAL_ACTIVE),
                                                       col(Trial.engine_job).is_not(None))).all()
    free = free_resources(total, available, [Need.of_spec(spec, nodes) for spec in held_rows])
    jobs: dict[Job, Run | Trial] = {Job("run", run.id): run for run in queued}
    jobs.update({Job("trial", trial.id): trial for trial in trials})
    order = sorted(jobs, key=lambda job: (jobs[job].created_at, job.kind, job.id))
    decisions = plan_queue([(job, Need.of_spec(jobs[job].spec, nodes)) for job in order], free, total, label=str)
    started = []
    for decision in decisions:
        job = decision.key
        assert isinstance(job, Job)
        if decision.start and _start(session, launcher, job.kind, jobs[job]) and job.kind == "run":
            started.append(job.id)
    waiting = [d for d in decisions if not d.start and d.reason]
    for kind in STARTERS:
        _set_reasons(session, kind, {d.key.id: d.reason for d in waiting if d.key.kind == kind})
    return started


@dataclass(frozen=True)
class _Starter:
    """How the scheduler claims and starts one kind of job in the engine host (``STARTERS``)."""

    table: type[Run] | type[Trial]
    job: Any  # the column naming the job in the engine once claimed (Run.ray_job, Trial.engine_job)
    queued: str  # the status a claim requires
    claimable: tuple[Any, ...]  # what else a claim requires of the row (a trial: no cancel asked)
    job_name: Callable[[int], str]
    submitted: str  # the status_reason of a claimed job
    launch: Callable[[RayLauncher, Any], bool]  # False: the engine host has it already
    kill: Callable[[RayLauncher, int], None]
    terminal: frozenset[str]
    started: str  # the log's words for a started job


STARTERS = {
    "run": _Starter(Run, Run.ray_job, RunStatus.queued.value, (), controller_name,
                    "submitted to Ray; starting the controller", lambda launcher, run: launcher.launch(run),
                    lambda launcher, run_id: launcher.kill_run(run_id), frozenset(TERMINAL),
                    "launched in the engine host"),
    "trial": _Starter(Trial, Trial.engine_job, TrialStatus.queued.value, (col(Trial.cancel_requested).is_(False),),
                      job_name, "submitted to the engine host; starting",
                      lambda launcher, trial: launcher.launch_trial(trial),
                      lambda launcher, trial_id: launcher.kill_trial(trial_id), frozenset(TRIAL_TERMINAL),
                      "started in the engine host"),
}


def _start(session: Session, launcher: RayLauncher, kind: str, row: Run | Trial) -> bool:
    """Claim the queued run or trial (a conditional UPDATE, so a concurrent cancel wins), then start it in the
    engine host: a run's controller, a trial's job. False when it was not claimed or Ray refused it (its
    ``status_reason`` says why and it stays queued)."""
    how = STARTERS[kind]
    table, job_id = how.table, row.id
    assert job_id is not None
    name = how.job_name(job_id)
    claimed = session.exec(update(table).where(col(table.id) == job_id, table.status == how.queued,  # type: ignore[call-overload]
                                               col(how.job).is_(None), *how.claimable)
                           .values({how.job: name, table.status_reason: how.submitted}))
    session.commit()
    if claimed.rowcount != 1:
        return False
    try:
        if not how.launch(launcher, row):  # the engine has it already (launched before a crash): adopt it
            log.info("%s %s: adopting it from the engine host", kind, job_id)
            return True
    except Exception as exc:
        session.exec(update(table).where(col(table.id) == job_id)  # type: ignore[call-overload]
                     .values({how.job: None, table.status_reason: f"could not start on Ray: {type(exc).__name__}: {exc}"}))
        session.commit()
        return False
    session.expire_all()
    fresh = session.get(table, job_id)
    if fresh is None or fresh.status in how.terminal:
        how.kill(launcher, job_id)  # cancelled (or deleted) while it was being launched
    log.info("%s %s: %s as %s", kind, job_id, how.started, name)
    return True


def _set_reasons(session: Session, kind: str, reasons: dict[int, str]) -> None:
    """Conditional UPDATEs of ``kind``'s table (``STARTERS``): only rows still queued without a job in the engine,
    and only when the text changes (a concurrent cancel keeps its own reason)."""
    how = STARTERS[kind]
    table = how.table
    for job_id, reason in reasons.items():
        session.exec(update(table).where(col(table.id) == job_id, table.status == how.queued,  # type: ignore[call-overload]
                                         col(how.job).is_(None),
                                         (col(table.status_reason).is_(None)) | (col(table.status_reason) != reason))
                     .values({table.status_reason: reason}))
    session.commit()
