"""The classifier costs bounded time whatever a worker reports: its input is truncated before matching and no
rule backtracks quadratically (issue 18: 20,000 spaces after Hydra's message froze the server 2.75 s)."""

from __future__ import annotations

import time

import pytest

from worker.troubleshoot.classify import MAX_HEAD_CHARS, Category, ErrorInfo, classify

HYDRA = "Could not override 'actor_rollout_ref.foo'."
ADVERSARIAL = {
    "spaces after Hydra's message": ErrorInfo("ValueError", HYDRA + " " * 200_000),
    "spaces in the traceback": ErrorInfo("ValueError", "x", HYDRA + " " * 200_000),
    "one long word": ErrorInfo("ValueError", "a" * 200_000),
    "many words": ErrorInfo("ValueError", "a " * 100_000),
    "Hydra's message repeated": ErrorInfo("ValueError", (HYDRA + " " * 50 + "\n") * 5_000),
    "an unclosed quote": ErrorInfo("ValueError", "Could not override '" + "x" * 200_000),
    "a list that never ends": ErrorInfo("ValueError", "Ulysses sequence parallelism runs on " + "a, " * 50_000),
    "a library path that never ends": ErrorInfo("ValueError", "flash_attn" + ".a" * 50_000),
}


@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
def test_adversarial_text_is_classified_quickly(name):
    t0 = time.perf_counter()
    diagnosis = classify(ADVERSARIAL[name])
    assert time.perf_counter() - t0 < 0.25, name
    assert diagnosis.category == Category.other


@pytest.mark.parametrize("message", [
    HYDRA + "\nTo append to your config use +actor_rollout_ref.foo=1",
    HYDRA + "\n   \n  To append to your config use +actor_rollout_ref.foo=1",
    HYDRA + " Key 'foo' is not in struct. To append to your config use +actor_rollout_ref.foo=1",
])
def test_the_linear_hydra_rule_still_reads_hydras_message(message):
    assert classify(ErrorInfo("ConfigCompositionException", message)).category == Category.hydra_plus_override


def test_only_the_heads_start_is_read():
    late = "x" * MAX_HEAD_CHARS + " " + HYDRA + "\nTo append to your config use +a.b=1"
    assert classify(ErrorInfo("ValueError", late)).category == Category.other
