"""Run states and the engine's actor names, each derived in one place."""

from __future__ import annotations

from worker.core.contract import ACTIVE, TERMINAL, RunState, host_name, rank_name, run_name, trial_name
from worker.engine.controller import controller_name as engine_controller_name


def test_terminal_and_active_states_partition_the_states():
    assert sorted(TERMINAL) == ["cancelled", "failed", "succeeded"] and ACTIVE == ("queued", "starting", "running")
    assert RunState.failed in TERMINAL and "running" not in TERMINAL  # members and values alike


def test_names_of_runs_ranks_and_the_host():
    assert run_name(7) == run_name("7") == "attnboard-run-7" == engine_controller_name("7")
    assert rank_name("7", 1) == "attnboard-run-7-rank1" and trial_name(3) == "attnboard-trial-3"
    assert host_name() == "attnboard-engine" and host_name("x").startswith("attnboard-engine-")
