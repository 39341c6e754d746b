"""Calls in child processes with a wall clock (``app.services.isolation``): a catastrophic regex is stopped at
the clock while this process keeps running Python, errors come back as they were raised, the pool recovers."""

from __future__ import annotations

import itertools
import threading
import time

import pytest

from app.errors import AppError
from app.services.interop import IMPORT_TIMEOUT_CODE, import_calls, import_isolated
from app.services.isolation import IsolatedCalls

EVIL = {"pattern": "^(a+)+$", "string": "a" * 40 + "!"}  # backtracks ~2**40 steps in Python's re


@pytest.fixture(scope="module")
def calls():
    pool = IsolatedCalls(timeout_s=1.0, preload=("re",))
    yield pool
    pool.close()


def test_a_call_returns_its_result(calls):
    assert calls.call("re", "escape", pattern="a.b") == "a\\.b"


def test_an_overrunning_call_is_stopped_at_the_clock_while_this_process_runs_on(calls):
    calls.call("re", "escape", pattern="warm")  # a ready child, so the clock measures the call alone
    ticks = []
    stop = threading.Event()

    def ticker():
        while not stop.is_set():
            ticks.append(time.monotonic())
            time.sleep(0.01)

    thread = threading.Thread(target=ticker)
    thread.start()
    t0 = time.monotonic()
    with pytest.raises(AppError) as caught:
        calls.call("re", "fullmatch", **EVIL)
    elapsed = time.monotonic() - t0
    stop.set()
    thread.join()
    assert caught.value.status == 422 and 1.0 <= elapsed < 2.0
    assert max(b - a for a, b in itertools.pairwise(ticks)) < 0.1  # the GIL stayed free here
    assert calls.call("re", "escape", pattern="again") == "again"  # a new child serves the next call


def test_errors_come_back_as_raised(calls):
    with pytest.raises(RuntimeError, match=r"error in an isolated call to re\.compile"):
        calls.call("re", "compile", pattern="(")


def test_an_import_error_and_an_import_timeout_answer_422_naming_the_text():
    pool = import_calls(1.0)
    try:
        with pytest.raises(AppError) as bad:
            import_isolated(pool, text="a: !!python/object/apply:os.system ['true']", format="yaml")
        assert (bad.value.status, bad.value.code, bad.value.field) == (422, "invalid_yaml", "text")
        ok = import_isolated(pool, text="python3 -m verl.trainer.main_ppo trainer.device=cpu")
        assert ok["spec"]["trainer"]["device"] == "cpu"
    finally:
        pool.close()
    assert import_calls(1.5).on_timeout(1.6).body()["error"]["code"] == IMPORT_TIMEOUT_CODE
