"""Attention trials: create, run in the background, list, read, compare.

The state of a trial lives in its ``Trial`` row, never in memory: ``queued -> running -> succeeded |
failed``, with the ``worker.engine.trial.TrialResult`` as JSON (partial columns are stored as each one is
measured, so the page shows progress). ``start_in_thread`` runs ``execute_trial`` in a daemon thread of the
app process; the PPO steps themselves run through Ray like a run's (one rank actor each), on the
launcher's cluster when a Ray launcher is attached, else on a local Ray started for the purpose.

Known limit: a trial whose app process stops mid-way stays ``running`` (its thread died with the process).
"""

from __future__ import annotations

import logging
import threading
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, func
from sqlmodel import Session, col, select

from app.errors import AppError, not_found
from app.models import utcnow
from app.models_troubleshooting import Trial, TrialCreate, TrialStatus
from app.services.common import validated_spec
from app.services.troubleshooting import parse_environment
from worker.core.implementations import VALID_DESCRIPTION, is_valid_name

log = logging.getLogger("attnboard.trials")

DEFAULT_TRIAL_NAME = "attention trial"
MAX_COMPARE = 8

# --------------------------------------------------------------------------------------------
# Create and read


def create_trial(session: Session, *, data: TrialCreate, author: str) -> Trial:
    """Validate the spec, the implementations and the environment; store the trial as queued."""
    _, tree, _ = validated_spec(data.spec)
    for i, impl in enumerate(data.implementations):
        if not isinstance(impl, str) or not is_valid_name(impl):
            raise AppError(422, "invalid_request", f"implementations[{i}]: {impl!r} is not an attention "
                           f"implementation; valid: {VALID_DESCRIPTION}", field=f"implementations[{i}]", value=impl,
                           valid=VALID_DESCRIPTION)
    if data.environment is not None:
        parse_environment(data.environment)
    implementations = list(dict.fromkeys(data.implementations))
    trial = Trial(name=data.name or DEFAULT_TRIAL_NAME, spec=tree, implementations=implementations, steps=data.steps,
                  environment=data.environment, author=author[:200])
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
# Execute


ORPHANED = "the app stopped while this trial ran (trials run inside the app process); start it again"


def fail_orphaned_trials(session: Session) -> int:
    """At start-up no trial of this process runs yet: mark those a previous process left queued or running
    as failed with the cause, so no trial stays non-terminal forever. Returns how many."""
    rows = session.exec(select(Trial).where(col(Trial.status).in_([TrialStatus.queued.value,
                                                                    TrialStatus.running.value]))).all()
    for trial in rows:
        trial.status, trial.error, trial.finished_at = TrialStatus.failed.value, ORPHANED, utcnow()
        session.add(trial)
    session.commit()
    return len(rows)


def connect_local_ray() -> None:
    """Join Ray when no Ray launcher is attached: a local instance of this process's own."""
    import ray

    if not ray.is_initialized():  # no Ray launcher: a Ray of our own, never someone else's local cluster
        ray.init(address="local", include_dashboard=False, log_to_driver=False)


def execute_trial(engine: Engine, trial_id: int, *, model_roots: Sequence[Path] = (),
                  cache_dir: Path | str | None = None, connect: Callable[[], None] = connect_local_ray) -> str:
    """Run a queued trial to its end, writing every change to its row; -> the final status. Never raises."""
    from worker.core.environment import Environment
    from worker.engine.probe import environment_fields, probe_on_ray
    from worker.engine.trial import Column, run_trial

    try:
        with Session(engine, expire_on_commit=False) as session:
            trial = get_trial(session, trial_id=trial_id)
            if trial.status != TrialStatus.queued.value:
                return trial.status
            trial.status, trial.started_at = TrialStatus.running.value, utcnow()
            session.add(trial)
            session.commit()
            columns: list[dict[str, Any]] = []

            def store_column(column: Column) -> None:
                columns.append(column.as_dict())
                trial.result = {"columns": list(columns), "recommendation": None, "steps": trial.steps}
                session.add(trial)
                session.commit()

            try:
                connect()
                if trial.environment is not None:
                    env = parse_environment(trial.environment)
                else:  # probe a node like the ones the ranks will run on
                    gpus = 0 if (trial.spec.get("trainer") or {}).get("device") == "cpu" else 1
                    env = Environment.from_dict(environment_fields(probe_on_ray(num_gpus=gpus), name="probed node"))
                result = run_trial(trial.spec, trial.implementations, steps=trial.steps, env=env,
                                   model_roots=list(model_roots), cache_dir=cache_dir, on_column=store_column,
                                   trial_id=f"trial{trial_id}")
                trial.result, trial.status = result.as_dict(), TrialStatus.succeeded.value
            except Exception as exc:
                log.exception("trial %s failed", trial_id)
                trial.status = TrialStatus.failed.value
                trial.error = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=6)}"[-4000:]
            trial.finished_at = utcnow()
            session.add(trial)
            session.commit()
            return trial.status
    except Exception:
        log.exception("trial %s could not be run or recorded", trial_id)
        return TrialStatus.failed.value


def start_in_thread(engine: Engine, trial_id: int, *, model_roots: Sequence[Path] = (),
                    connect: Callable[[], None] = connect_local_ray) -> threading.Thread:
    """Run ``execute_trial`` in a daemon thread (the row says how it goes)."""
    thread = threading.Thread(target=execute_trial, args=(engine, trial_id),
                              kwargs={"model_roots": model_roots, "connect": connect},
                              name=f"trial-{trial_id}", daemon=True)
    thread.start()
    return thread
