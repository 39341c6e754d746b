"""Reward functions: a table per registered function, the registry's rules, and bounds."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from worker.ppo import rewards

CASES = {
    "count": [
        ("34567", "34567", 1.0),
        (" 34567\n", "34567", 1.0),  # surrounding whitespace ignored
        ("34568", "34567", 0.9),  # 4 right + 0.5 for a wrong digit, over 5
        ("3456", "34567", 0.8),  # one missing: 4 / 5
        ("345678", "34567", 5 / 6),  # one extra: 5 / 6
        ("99999", "34567", 0.5),  # all digits, none right
        ("abcde", "34567", 0.0),
        ("3a5b7", "34567", 0.6),
        ("", "34567", 0.0),
    ],
    "copy": [
        ("cat", "cat", 1.0),
        ("cot", "cat", 2 / 3),
        ("cats", "cat", 0.75),
        ("ca", "cat", 2 / 3),
        ("dog", "cat", 0.0),
        ("", "cat", 0.0),
    ],
    "gsm8k": [
        ("#### 7", "7", 1.0),
        ("3 and 4 make 7\n#### 7", "7", 1.0),
        ("#### 8", "7", 0.0),
        ("7", "7", 0.0),  # strict: the answer must follow '#### '
        ("####7", "7", 0.0),
        ("#### 1,234", "1234", 1.0),
        ("#### 5 then #### 7", "7", 1.0),  # the last answer counts
        ("#### 7", "#### 7", 1.0),  # a ground truth in GSM8K's answer form
        ("#### -3", "-3", 1.0),
    ],
}


@pytest.mark.parametrize("name,solution,truth,expected",
                         [(name, *case) for name, cases in CASES.items() for case in cases])
def test_reward_table(name, solution, truth, expected):
    fn = rewards.get_reward_fn(name, "ignored-when-named")
    assert fn(name, solution, truth) == pytest.approx(expected)


def test_every_registered_reward_has_cases():
    assert set(rewards.REWARDS) == set(CASES), "add a table of cases for each new reward function"


@pytest.mark.parametrize(
    "data_source,fn",
    [("count", rewards.count_score), ("copy", rewards.copy_score), ("arith", rewards.gsm8k_score),
     ("openai/gsm8k", rewards.gsm8k_score), ("gsm8k", rewards.gsm8k_score)],
)
def test_reward_picked_by_data_source(data_source, fn):
    assert rewards.get_reward_fn(None, data_source) is fn


def test_name_beats_data_source():
    assert rewards.get_reward_fn("copy", "count") is rewards.copy_score


def test_unknown_name_and_data_source_list_the_valid_ones():
    with pytest.raises(ValueError, match=r"custom_reward_function.name 'f1' is not a registered reward function; "
                                         r"valid: copy, count, gsm8k"):
        rewards.get_reward_fn("f1", "count")
    with pytest.raises(ValueError, match=r"no reward function serves data_source 'lighteval/MATH'; "
                                         r"set custom_reward_function.name to one of: copy, count, gsm8k"):
        rewards.get_reward_fn(None, "lighteval/MATH")


def test_registering_twice_raises_and_changes_nothing():
    with pytest.raises(ValueError, match="'count' is already registered"):
        rewards.register_reward("count")(lambda s, r, t: 0.0)
    with pytest.raises(ValueError, match="data_source 'openai/gsm8k' is already served by reward function 'gsm8k'"):
        rewards.register_reward("math2", data_sources=("openai/gsm8k",))(lambda s, r, t: 0.0)
    assert "math2" not in rewards.REWARDS
    assert rewards.get_reward_fn(None, "count") is rewards.count_score


@given(solution=st.text(max_size=12), truth=st.text(min_size=1, max_size=8))
def test_positional_scores_stay_in_unit_interval_and_reward_the_exact_answer(solution, truth):
    for name in ("count", "copy"):
        fn = rewards.get_reward_fn(name, name)
        assert 0.0 <= fn(name, solution, truth) <= 1.0
        if truth == truth.strip():
            assert fn(name, truth, truth) == 1.0
