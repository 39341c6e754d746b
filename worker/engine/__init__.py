"""The distributed PPO engine: a single controller driving one Ray actor per rank.

``run_spec`` runs a spec in this process; the engine host (``worker.engine.host``), a detached Ray actor
that outlives the app and keeps warm rank actors between runs, runs each of the app's runs in a
``RunController``.

The names below are imported on first use, so that the rank code (``worker.engine.rank``,
``compute``, ``observe``) imports without Ray or the spec: the device check drives a rank in-process
where only torch and transformers are installed.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RunController", "run_spec"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from worker.engine import controller

        return getattr(controller, name)
    raise AttributeError(f"module 'worker.engine' has no attribute {name!r}")
