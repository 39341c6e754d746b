"""The distributed PPO engine: a single controller driving one Ray actor per rank.

``run_spec`` runs a spec in this process; ``launch_controller`` starts a run in the engine host
(``worker.engine.host``), a detached Ray actor that outlives the app and keeps warm rank actors between
runs, where each run is a ``RunController``.

The names below are imported on first use, so that the rank code (``worker.engine.rank``,
``compute``, ``observe``) imports without Ray or the spec: the device check drives a rank in-process
where only torch and transformers are installed.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RunController", "get_controller", "launch_controller", "run_spec"]
_HOME = {"RunController": "controller", "run_spec": "controller", "get_controller": "host", "launch_controller": "host"}


def __getattr__(name: str) -> Any:
    if name in _HOME:
        import importlib

        return getattr(importlib.import_module(f"worker.engine.{_HOME[name]}"), name)
    raise AttributeError(f"module 'worker.engine' has no attribute {name!r}")
