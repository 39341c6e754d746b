"""The stable contracts of PRODUCT.md shared by the worker (which emits) and the app (which stores):
event kinds and run states, and the names of the engine's Ray actors. Pure: the app imports this
without pulling in torch or Ray."""

from __future__ import annotations

import hashlib
from enum import Enum


class Kind(str, Enum):
    """Event kinds: ``(run_id, seq, ts, kind, payload)`` with seq contiguous from 1 per run."""

    status = "status"
    env_probe = "env_probe"
    attention = "attention"
    fallback = "fallback"
    attention_mismatch = "attention_mismatch"
    metric = "metric"
    log = "log"
    error = "error"
    restart = "restart"


class RunState(str, Enum):
    """``queued -> starting -> running -> succeeded | failed | cancelled``."""

    queued = "queued"
    starting = "starting"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"


TERMINAL = frozenset({RunState.succeeded.value, RunState.failed.value, RunState.cancelled.value})
"""The final states (values; a ``RunState`` member is found in it too, being a str)."""
ACTIVE: tuple[str, ...] = tuple(s.value for s in RunState if s.value not in TERMINAL)
"""Every other state: queued, starting, running."""

NAMESPACE = "attnboard"  # the Ray namespace of the engine host and of the rank actors named after a run
HOST_NAME = "attnboard-engine"  # the engine host (worker.engine.host) of the standalone runner and tests


def run_name(run_id: str | int) -> str:
    """A run's name in the engine (its controller; the app's ``ray_job``): ``attnboard-run-<run_id>``."""
    return f"attnboard-run-{run_id}"


def rank_name(run_id: str | int, rank: int) -> str:
    """The name of a fresh rank actor of a run: ``attnboard-run-<run_id>-rank<rank>`` (pooled warm ranks are
    unnamed: they belong to no run while warm)."""
    return f"{run_name(run_id)}-rank{rank}"


def trial_name(trial_id: str | int) -> str:
    """A trial's name in the engine host (the app's ``engine_job``): ``attnboard-trial-<trial_id>``."""
    return f"attnboard-trial-{trial_id}"


def host_name(scope: str | None = None) -> str:
    """``attnboard-engine``, or ``attnboard-engine-<10 hex digits>`` for a scope (e.g. the app's database).

    >>> host_name(), host_name("sqlite:/srv/attnboard.db")
    ('attnboard-engine', 'attnboard-engine-540bdca2d7')
    """
    return HOST_NAME if scope is None else f"{HOST_NAME}-{hashlib.sha256(scope.encode()).hexdigest()[:10]}"
