"""What the live run page (``run.html``) and its stream compute beyond the run view: the whole view read
from the run's events, its checkpoints, the retry offers and the verl keys passed through."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlmodel import Session

from app.models import Run
from app.services import checkpoints as checkpoints_service
from app.services import events as events_service
from app.views.run_view import RunView, fold
from worker.ppo.advantage import needs_critic


def load_view(session: Session, run: Run) -> RunView:
    """Every event of ``run`` folded into its view (read in pages of 1000)."""
    events: list[Any] = []
    after = 0
    while True:
        batch, _ = events_service.events_since(session, run_id=run.id, after_seq=after, limit=1000)
        events.extend(batch)
        if len(batch) < 1000:
            break
        after = batch[-1].seq
    return fold(events, total_steps=run.total_steps, status=run.status)


def checkpoint_context(checkpoint_root: Path, run: Run, view: RunView) -> dict[str, Any]:
    """The run's checkpoints (read from its folder) and, for a failed or cancelled run, the one a "Resume
    from checkpoint" button resumes from."""
    listed = checkpoints_service.run_checkpoints(run, checkpoint_root)
    resumable = [c for c in listed.data if c.resumable]
    offer = view.status in checkpoints_service.RESUMABLE_STATUSES and resumable
    return {"checkpoints": listed, "resume_from": resumable[-1] if offer else None}


def passthrough_of(run: Run) -> dict[str, Any]:
    """The run's verl keys that attnboard does not run (its stored spec's ``verl_passthrough``)."""
    value = run.spec.get("verl_passthrough") if isinstance(run.spec, dict) else None
    return value if isinstance(value, dict) else {}


def eager_roles(run: Run, view: RunView) -> list[str]:
    """The settings a "retry with eager on ..." button is offered for: those whose role fell back or did
    not load, the critic only when the run trains one."""
    has_critic = needs_critic((run.spec.get("algorithm") or {}).get("adv_estimator", "gae"))
    return [role for role in view.eager_retry_roles() if role != "critic" or has_critic]


def trimmed(view: RunView) -> RunView:
    """A stream's view keeps the newest metric point and log line, not their history: the stream renders
    only those (the page it was opened from holds the rest), and 200 streams of a long run held 200 copies
    of it, which the garbage collector walked through on every full collection."""
    del view.metrics[:-1]
    del view.logs[:-1]
    return view
