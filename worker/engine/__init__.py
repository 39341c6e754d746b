"""The distributed PPO engine: a single controller driving one Ray actor per rank.

``run_spec`` runs a spec in this process; ``launch_controller`` starts a run as a detached Ray actor.
"""

from worker.engine.controller import RunController, get_controller, launch_controller, run_spec

__all__ = ["RunController", "get_controller", "launch_controller", "run_spec"]
