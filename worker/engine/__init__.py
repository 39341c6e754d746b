"""The distributed PPO engine: a single controller driving one Ray actor per rank.

``run_spec`` runs a spec in this process; ``launch_controller`` starts a run in the engine host, a
detached Ray actor that outlives the app and keeps warm rank actors between runs (``worker.engine.host``).
"""

from worker.engine.controller import RunController, get_controller, launch_controller, run_spec

__all__ = ["RunController", "get_controller", "launch_controller", "run_spec"]
