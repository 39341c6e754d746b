"""Attention trials: create, list, read, compare, cancel; and the app's side of a trial's job.

A trial is a job of the engine host (``worker.engine.trial_job``), on the same queue as the runs: the
scheduler (``app.services.ray_launcher.schedule``, one ``plan_queue`` for runs and trials in the order they
were made) starts it when the ranks it needs are free, and until then ``status_reason`` says what it waits
for (``waiting for 2 CPU (0 free of 2)``). Nothing of a trial runs in this process (no torch here): the
supervisor (``app.services.pump``) reads the job's ``progress`` every pass and stores it in the ``Trial``
row (``pump_trials``), the only record the pages and the API read: ``queued -> running -> succeeded |
failed | cancelled``, the ``worker.engine.trial.TrialResult`` as JSON (columns as each is measured). A
trial in which no implementation completed ends ``failed``, naming why each did not.

A trial whose engine host died is started again in a new host while the spec's ``attnboard.max_restarts``
allows (the columns it had measured are kept), else it ends ``failed`` (``cancelled`` if a cancel was
pending) with the cause, as a run does.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from sqlalchemy import func
from sqlmodel import Session, col, select

from app.errors import AppError, not_found
from app.models import utcnow
from app.models_troubleshooting import TRIAL_TERMINAL, Trial, TrialCreate, TrialStatus
from app.services.common import check_paths, max_restarts_of, validated_spec
from app.services.troubleshooting import parse_environment
from worker.core.implementations import VALID_DESCRIPTION, is_valid_name

log = logging.getLogger("attnboard.trials")

DEFAULT_TRIAL_NAME = "attention trial"
MAX_COMPARE = 8
QUEUED = "queued: waiting for the scheduler"
CANCELLING = "cancel requested; waiting for the engine host to stop it"
HOST_CALL_TIMEOUT_S = 30.0
RELAUNCH_PATIENCE_S = 60.0

# --------------------------------------------------------------------------------------------
# Create and read


def create_trial(session: Session, *, data: TrialCreate, author: str) -> Trial:
    """Validate the spec, the implementations and the environment; store the trial as queued."""
    spec, tree, _ = validated_spec(data.spec)
    check_paths(session, spec)  # a trial loads the spec's model and data like a run: the same folders
    for i, impl in enumerate(data.implementations):
        if not isinstance(impl, str) or not is_valid_name(impl):
            raise AppError(422, "invalid_request", f"implementations[{i}]: {impl!r} is not an attention "
                           f"implementation; valid: {VALID_DESCRIPTION}", field=f"implementations[{i}]", value=impl,
                           valid=VALID_DESCRIPTION)
    if data.environment is not None:
        parse_environment(data.environment)
    implementations = list(dict.fromkeys(data.implementations))
    trial = Trial(name=data.name or DEFAULT_TRIAL_NAME, spec=tree, implementations=implementations, steps=data.steps,
                  environment=data.environment, author=author[:200], status_reason=QUEUED)
    session.add(trial)
    session.commit()
    session.refresh(trial)
    return trial


def get_trial(session: Session, *, trial_id: int) -> Trial:
    trial = session.get(Trial, trial_id)
    if trial is None:
        raise not_found("trial", trial_id, field="trial_id")
    return trial


def list_trials(session: Session, *, ids: Sequence[int] | None = None, limit: int = 50,
                offset: int = 0) -> tuple[list[Trial], int]:
    """Newest first; ``ids`` picks those trials (in the order given, for side-by-side comparison)."""
    if ids:
        wanted = list(dict.fromkeys(ids))[:MAX_COMPARE]
        return [get_trial(session, trial_id=i) for i in wanted], len(wanted)
    query = select(Trial)
    total = session.exec(select(func.count()).select_from(query.subquery())).one()
    rows = session.exec(query.order_by(col(Trial.id).desc()).limit(limit).offset(offset)).all()
    return list(rows), total


# --------------------------------------------------------------------------------------------
# Cancel


def cancel_trial(session: Session, *, trial_id: int, launcher: Any = None) -> Trial:
    """A queued trial (or one with no Ray launcher to reach its job) ends ``cancelled`` at once; for a started
    one the cancel is recorded and the supervisor is woken: its next pass asks the job to stop (``TrialPump``,
    again after an app restart or once Ray is back) and stores its end (``cancelled``)."""
    trial = get_trial(session, trial_id=trial_id)
    if trial.status in TRIAL_TERMINAL:
        raise AppError(409, "invalid_transition", f"trial {trial_id} is already {trial.status}: only queued or running "
                       f"trials can be cancelled", field="status", value=trial.status, valid=["queued", "running"])
    trial.cancel_requested = True
    wake = getattr(launcher, "wake", None)  # the Ray launcher's: its supervisor reaches the engine host
    if trial.engine_job is None or wake is None:
        why = "cancelled before it started" if trial.engine_job is None else "cancelled (no launcher attached)"
        trial.status, trial.status_reason, trial.finished_at = TrialStatus.cancelled.value, why, utcnow()
    else:
        trial.status_reason = CANCELLING
    session.add(trial)
    session.commit()
    session.refresh(trial)
    if wake is not None:
        wake.set()
    return trial


# --------------------------------------------------------------------------------------------
# The job in the engine host


LEGACY_ORPHANED = "the app stopped while this trial ran inside it (before trials were jobs of the engine host); start it again"


def fail_orphaned_trials(session: Session) -> int:
    """At start-up: a trial left ``running`` without a job in the engine host ran in the thread of an app
    before trials were engine jobs, and died with it: it is marked failed with the cause. Queued trials
    wait for the scheduler; trials with a job are followed by the pump. Returns how many were failed."""
    rows = session.exec(select(Trial).where(Trial.status == TrialStatus.running.value,
                                            col(Trial.engine_job).is_(None))).all()
    for trial in rows:
        trial.status, trial.error, trial.finished_at = TrialStatus.failed.value, LEGACY_ORPHANED, utcnow()
        trial.status_reason = LEGACY_ORPHANED
        session.add(trial)
    session.commit()
    return len(rows)


def job_name(trial_id: int) -> str:
    """A trial's name in the engine host (its ``engine_job``)."""
    return f"attnboard-trial-{trial_id}"


def engine_request(trial: Trial) -> dict[str, Any]:
    """What the engine host's trial job takes: the spec, the implementations, the steps and the environment
    (``Environment.to_dict()``, or None: the job probes the node a rank runs on)."""
    env = None if trial.environment is None else parse_environment(trial.environment).to_dict()
    return {"spec": trial.spec, "implementations": list(trial.implementations), "steps": trial.steps,
            "environment": env}


def completed_columns(trial: Trial) -> list[dict[str, Any]]:
    """The columns a trial had measured (kept when it is started again in a new host)."""
    return [c for c in (trial.result or {}).get("columns") or [] if c.get("status") == "ok"]


def apply_progress(trial: Trial, progress: dict[str, Any]) -> bool:
    """Write a job's ``progress`` into the row (pure: no I/O) -> whether anything changed."""
    state = progress["state"]
    values: dict[str, Any] = {}
    if state in TRIAL_TERMINAL or not trial.cancel_requested:  # a pending cancel keeps saying so until it ends
        values["status_reason"] = progress.get("reason")
    if state in TRIAL_TERMINAL or state == TrialStatus.running.value:
        values["status"] = state
    if progress.get("result") is not None:
        values["result"] = progress["result"]
    if state in TRIAL_TERMINAL:
        values["error"] = progress.get("error")
    changed = {k: v for k, v in values.items() if getattr(trial, k) != v}
    for key, value in changed.items():
        setattr(trial, key, value)
    if trial.status != TrialStatus.queued.value and trial.started_at is None:
        trial.started_at, changed["started_at"] = utcnow(), True
    if trial.status in TRIAL_TERMINAL and trial.finished_at is None:
        trial.finished_at, changed["finished_at"] = utcnow(), True
    return bool(changed)


class TrialPump:
    """The supervisor's part for trials: every pass, each started, unfinished trial's ``progress`` is read from
    the engine host and stored; a finished one is acknowledged (the host forgets it); one whose host is gone
    is started again or ended with the cause."""

    def __init__(self, launcher: Any):
        self.launcher = launcher
        self._relaunch_failing_since: dict[int, float] = {}
        self._cancel_sent: set[int] = set()  # trials whose job this process asked to stop

    def tick(self, session: Session) -> bool:
        """One pass -> whether a trial changed."""
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        from worker.engine.host import TrialUnknown

        trials = session.exec(select(Trial).where(col(Trial.status).in_([TrialStatus.queued.value,
                                                                          TrialStatus.running.value]),
                                                  col(Trial.engine_job).is_not(None)).order_by(col(Trial.id))).all()
        if not trials:
            return False
        host = self.launcher.find_host()
        changed = False
        for trial in trials:
            assert trial.id is not None
            if host is None:
                changed |= self._lost(session, trial, "not found: the engine host is gone")
                continue
            try:
                progress = ray.get(host.trial_progress.remote(str(trial.id)), timeout=HOST_CALL_TIMEOUT_S)
            except TrialUnknown:
                changed |= self._lost(session, trial, "not found in the engine host")
                continue
            except RayActorError as exc:
                text = str(exc).strip()
                cause = text.splitlines()[0] if text else type(exc).__name__
                changed |= self._lost(session, trial, f"died with the engine host ({cause})")
                continue
            except GetTimeoutError:
                log.warning("trial %s: the engine host did not answer within %g s", trial.id, HOST_CALL_TIMEOUT_S)
                continue
            if apply_progress(trial, progress):
                session.add(trial)
                session.commit()
                changed = True
            if progress["terminal"]:
                host.ack_trial.remote(str(trial.id))
                self._cancel_sent.discard(trial.id)
            elif trial.cancel_requested and trial.id not in self._cancel_sent:
                host.cancel_trial.remote(str(trial.id), "cancelled by the user")  # it answers once the job ended
                self._cancel_sent.add(trial.id)
        return changed

    def _lost(self, session: Session, trial: Trial, why: str) -> bool:
        """A trial whose job is gone: started again in this app's engine host while ``attnboard.max_restarts``
        allows and no cancel is pending (the columns it measured are kept), else ended with the cause."""
        assert trial.id is not None
        self._cancel_sent.discard(trial.id)
        limit = max_restarts_of(trial.spec)
        cause = f"the engine host is gone: trial job {job_name(trial.id)} {why}"
        if not trial.cancel_requested and trial.restarts < limit:
            attempt = trial.restarts + 1
            try:
                self.launcher.launch_trial(trial, done=completed_columns(trial), attempt=attempt)
            except Exception as exc:
                since = self._relaunch_failing_since.setdefault(trial.id, time.monotonic())
                log.warning("trial %s: could not restart it yet: %s", trial.id, exc)
                if time.monotonic() - since < RELAUNCH_PATIENCE_S:
                    return False
                cause += f"; it could not be restarted: {type(exc).__name__}: {exc}"
            else:
                self._relaunch_failing_since.pop(trial.id, None)
                trial.restarts, trial.status_reason = attempt, f"restart {attempt} of {limit}: {cause}"
                session.add(trial)
                session.commit()
                log.warning("trial %s: restarted in the engine host (%d of %d): %s", trial.id, attempt, limit, cause)
                return True
        self._relaunch_failing_since.pop(trial.id, None)
        if trial.restarts and "could not be restarted" not in cause:
            cause += f" (after {trial.restarts} restart{'s' if trial.restarts != 1 else ''})"
        final = TrialStatus.cancelled if trial.cancel_requested else TrialStatus.failed
        trial.status, trial.status_reason, trial.finished_at = final.value, cause, utcnow()
        if final == TrialStatus.failed:
            trial.error = cause
        session.add(trial)
        session.commit()
        log.warning("trial %s: %s", trial.id, cause)
        return True
