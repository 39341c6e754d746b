"""The newest probe of a worker node: the ``env_probe`` event a run's rank 0 sent (``worker.engine.probe``), offered
by the new-run form as the ``probe`` environment, so the preview resolves for a node of this cluster
rather than for a profile.

Only the ``RECENT_RUNS`` newest runs are looked at (by their ``(run_id, seq)`` index), so the lookup costs
the same with a million events stored; a probe that no longer parses as an environment is skipped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlmodel import Session, col, select

from app.models import Event, EventKind, Run
from app.services.troubleshooting import environment_label
from worker.core.environment import Environment
from worker.engine.probe import environment_fields

RECENT_RUNS = 20


@dataclass(frozen=True)
class NodeProbe:
    run_id: int
    payload: dict[str, Any]
    environment: Environment

    @property
    def label(self) -> str:
        """``run #12: cpu, no flash-attn``."""
        return f"run #{self.run_id}: {environment_label(self.payload) or self.environment.device}"


def node_probe(run_id: int, payload: Any) -> NodeProbe | None:
    """A stored ``env_probe`` payload as a ``NodeProbe``; None when it does not describe an environment."""
    if not isinstance(payload, dict):
        return None
    try:
        environment = Environment.from_dict(environment_fields(payload, name=f"probe of run #{run_id}"))
    except (ValueError, TypeError):
        return None
    return NodeProbe(run_id, dict(payload), environment)


def latest_node_probe(session: Session) -> NodeProbe | None:
    """The newest usable probe among the newest runs, or None."""
    run_ids = session.exec(select(Run.id).order_by(col(Run.id).desc()).limit(RECENT_RUNS)).all()
    if not run_ids:
        return None
    rows = session.exec(select(Event.run_id, Event.payload)
                        .where(col(Event.run_id).in_(run_ids), Event.kind == EventKind.env_probe.value)
                        .order_by(col(Event.run_id).desc(), col(Event.seq).desc())).all()
    return next((probe for run_id, payload in rows if (probe := node_probe(run_id, payload)) is not None), None)
