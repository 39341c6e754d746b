"""The stable contracts of PRODUCT.md shared by the worker (which emits) and the app (which stores):
event kinds and run states. Pure: the app imports this without pulling in torch or Ray."""

from __future__ import annotations

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


class RunState(str, Enum):
    """``queued -> starting -> running -> succeeded | failed | cancelled``."""

    queued = "queued"
    starting = "starting"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"


TERMINAL = frozenset({RunState.succeeded.value, RunState.failed.value, RunState.cancelled.value})

NAMESPACE = "attnboard"  # the Ray namespace of the engine host and of the rank actors named after a run
