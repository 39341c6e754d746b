"""A run's checkpoints as the app shows them, and "resume from checkpoint" for a failed or cancelled run.

The engine writes checkpoints (``worker.engine.checkpoint`` has the layout and the rules); the app reads the same
folder: run N's relative ``trainer.default_local_dir`` lies under ``<CHECKPOINT_DIR>/N``
(``Settings.checkpoint_root``), an absolute one where it says. What is listed is what is on disk: a pruned
checkpoint is gone, an interrupted write is listed as skipped with the reason.

Resuming makes a new run (``retry_of`` the old one): the old run's spec, the caller's patch, and
``trainer.resume_mode=resume_path`` at the old run's newest resumable checkpoint. Terminal states stay
final, and the new run's events start at its own seq 1 with the steps after the checkpoint.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlmodel import Session

from app.errors import AppError
from app.models import CheckpointPublic, CheckpointsPublic, Run, RunStatus
from app.services.launcher import Launcher
from worker.engine import checkpoint
from worker.spec import SpecError, parse_spec

RESUMABLE_STATUSES = (RunStatus.failed.value, RunStatus.cancelled.value)


def run_folder(run: Run, root: Path) -> Path:
    """The run's checkpoint folder: its ``trainer.default_local_dir`` resolved as the engine resolves it."""
    assert run.id is not None
    try:
        spec = parse_spec(run.spec)
    except SpecError:  # a spec stored before a schema change: verl's default folder
        from worker.spec import RunSpec

        spec = RunSpec()
    return checkpoint.checkpoint_folder(spec, root / str(run.id))


def run_checkpoints(run: Run, root: Path) -> CheckpointsPublic:
    folder = run_folder(run, root)
    complete, skipped = checkpoint.scan(folder)
    return CheckpointsPublic(
        folder=str(folder),
        data=[CheckpointPublic(step=c.step, path=str(c.path), size_bytes=c.size_bytes, saved_at=c.saved_at,
                               roles=list(c.roles), resumable=c.resumable) for c in complete],
        skipped=[{"path": str(s.path), "why": s.why} for s in skipped],
    )


def resume_point(run: Run, root: Path) -> checkpoint.Checkpoint:
    """The newest resumable checkpoint of a failed or cancelled run; 409 naming what is missing otherwise."""
    if run.status not in RESUMABLE_STATUSES:
        raise AppError(409, "invalid_transition", f"run {run.id} is {run.status}: only a failed or cancelled run can "
                       f"be resumed from a checkpoint", field="status", value=run.status,
                       valid=list(RESUMABLE_STATUSES))
    folder = run_folder(run, root)
    found = checkpoint.newest(folder)
    if found is None:
        save_freq = ((run.spec.get("trainer") or {}).get("save_freq") if isinstance(run.spec, dict) else None)
        why = ("it saves none (trainer.save_freq is -1)" if save_freq in (None, -1, 0)
               else "it stopped before its first save")
        raise AppError(409, "no_checkpoint", f"run {run.id} has no complete checkpoint in {folder}: {why}; retry it "
                       f"instead, or resume a run that saved one", field="trainer.save_freq", value=save_freq,
                       valid="a run with trainer.save_freq > 0 that saved at least once")
    return found


def resume_run(session: Session, *, run: Run, root: Path, patch: dict[str, Any] | None = None,
               name: str | None = None, launcher: Launcher | None = None) -> Run:
    """A new run resuming ``run`` from its newest checkpoint, with ``patch`` (dotted keys) on top."""
    from app.services.runs import retry_run

    point = resume_point(run, root)
    assert run.id is not None
    full_patch = {**(patch or {}), "trainer.resume_mode": "resume_path", "trainer.resume_from_path": str(point.path)}
    return retry_run(session, run_id=run.id, patch=full_patch, launcher=launcher,
                     name=name or f"{run.name[:180]} (resumed)")
