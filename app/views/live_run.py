"""What the live run page (``run.html``) and its stream compute beyond the run view: the whole view read
from the run's events, its checkpoints, the retry offers and the verl keys passed through."""

from __future__ import annotations

import functools
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlmodel import Session

from app.models import Run
from app.services import checkpoints as checkpoints_service
from app.services import events as events_service
from app.views.run_view import RunView, fold, spec_differences
from worker.core.roles import Role
from worker.ppo.advantage import needs_critic
from worker.spec import RunSpec, SpecError, parse_spec, spec_to_flat
from worker.troubleshoot.classify import eager_remedy


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


def eager_remedy_of(roles: list[str]) -> dict[str, Any] | None:
    """The run page's one "retry with eager" offer for ``roles`` (``eager_roles``): the patch and sentence of
    ``worker.troubleshoot.classify.eager_remedy``, the rule the preview's preflight applies too, over every
    setting those roles share, so one retry recovers them all; the button's words name the same settings."""
    if not roles:
        return None
    fix = eager_remedy(roles)
    who = " and ".join(f"the {role}" for role in roles)
    return {"roles": roles, "patch": fix.patch, "sentence": fix.sentence, "label": f"Retry with eager on {who}"}


def eager_roles(run: Run, view: RunView) -> list[str]:
    """The settings a "retry with eager on ..." button is offered for: those whose role fell back or did
    not load, the critic only when the run trains one."""
    has_critic = needs_critic((run.spec.get("algorithm") or {}).get("adv_estimator", "gae"))
    return [role for role in view.eager_retry_roles() if role != Role.critic.value or has_critic]


def trimmed(view: RunView) -> RunView:
    """A stream's view keeps the newest metric point and log line, not their history: the stream renders
    only those (the page it was opened from holds the rest), and 200 streams of a long run held 200 copies
    of it, which the garbage collector walked through on every full collection."""
    del view.metrics[:-1]
    del view.logs[:-1]
    return view


@functools.cache
def _default_flat() -> dict[str, Any]:
    return spec_to_flat(RunSpec())


def spec_overview(run: Run) -> dict[str, Any] | None:
    """The run's spec for its page: ``changed`` (key, value, verl's default) for every key that differs from
    verl's defaults, then ``same`` (key, value) for the rest; None when the stored spec no longer parses."""
    try:
        flat = spec_to_flat(parse_spec(run.spec))
    except SpecError:
        return None
    # An emptied mapping (override_config: {}) and its keys set (override_config.attn_implementation) are one
    # change, shown once: by the key.
    diffs = [(key, values) for key, values in spec_differences([_default_flat(), flat])
             if {repr(v) for v in values} != {"{}", "None"}]
    changed = {key for key, _ in diffs}
    return {"changed": [(key, values[1], values[0]) for key, values in diffs],
            "same": [(key, value) for key, value in sorted(flat.items()) if key not in changed]}


def duration_s(run: Run, now: datetime) -> float | None:
    """Seconds from the run's start to its end (or to ``now`` while it goes); None before it started."""
    if run.started_at is None:
        return None
    end = run.finished_at or now
    start = run.started_at if run.started_at.tzinfo else run.started_at.replace(tzinfo=UTC)
    end = end if end.tzinfo else end.replace(tzinfo=UTC)
    return max(0.0, (end - start).total_seconds())
