"""The run state machine table (pure)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.errors import AppError
from app.models import Run, RunStatus
from app.services.runs import set_status
from app.services.states import TRANSITIONS, check_transition
from worker.core.contract import TERMINAL

S = RunStatus
ALLOWED = {
    (S.queued, S.starting), (S.queued, S.failed), (S.queued, S.cancelled),
    (S.starting, S.running), (S.starting, S.failed), (S.starting, S.cancelled),
    (S.running, S.succeeded), (S.running, S.failed), (S.running, S.cancelled),
}


@pytest.mark.parametrize("current,new", list(itertools.product(S, S)), ids=lambda s: s.value)
def test_every_pair_follows_the_table(current, new):
    if (current, new) in ALLOWED:
        assert check_transition(current, new) == new
    else:
        with pytest.raises(AppError) as info:
            check_transition(current, new, run_id=7)
        err = info.value
        assert err.status == 409 and err.code == "invalid_transition" and err.field == "status"
        assert err.message.startswith(f"run 7 cannot go from {current.value} to {new.value}")
        assert err.valid == sorted(s.value for s in TRANSITIONS[current])


@pytest.mark.parametrize("current,message", [
    (S.succeeded, "run 1 cannot go from succeeded to running: it has finished"),
    (S.queued, "run 1 cannot go from queued to running: valid next states: cancelled, failed, starting"),
])
def test_messages_are_exact(current, message):
    with pytest.raises(AppError, match="^" + message.replace("(", r"\(") + "$"):
        check_transition(current, S.running, run_id=1)


def test_unknown_status_names_the_valid_ones():
    with pytest.raises(AppError) as info:
        check_transition(S.running, "done")
    assert info.value.status == 422 and info.value.valid == [s.value for s in S]


def test_terminal_states_are_final_and_cancel_reaches_every_live_state():
    assert all(not TRANSITIONS[s] for s in TERMINAL)
    assert all(S.cancelled in TRANSITIONS[s] for s in S if s not in TERMINAL)


@given(st.lists(st.sampled_from(list(S)), max_size=12))
def test_random_walks_only_take_allowed_steps_and_stamp_times(walk):
    run = Run(id=1, name="r", spec={})
    path = [S.queued]
    for new in walk:
        before = S(run.status)
        try:
            set_status(run, new)
        except AppError:
            assert (before, new) not in ALLOWED
            assert run.status == before.value
            continue
        assert (before, new) in ALLOWED
        path.append(new)
    last = S(run.status)
    assert last == path[-1]
    assert (run.finished_at is not None) == (last in TERMINAL)
    if any(s in (S.starting, S.running) for s in path):
        assert run.started_at is not None
