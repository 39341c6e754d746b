"""Advantage estimators: the registry, ``compute_advantage``, and each estimator against hand-computed
tables or a plain-loop transcription of verl 0.9.1's formula (``verl/trainer/ppo/core_algos.py``)."""

from __future__ import annotations

import math
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.ppo import advantage
from worker.spec import AdvEstimator, check_spec, parse_spec

ROOT = Path(__file__).resolve().parents[3]


# --------------------------------------------------------------------------------------------
# Advantage estimators: hand-computed tables


def _gae_hand_case() -> None:
    # gamma 0.9, lam 0.8, r = [0, 0, 1], V = [0.2, 0.4, 0.6]; the 4th position is padding.
    #   t=2: delta = 1 + 0.9*0   - 0.6 = 0.4    A2 = 0.4
    #   t=1: delta = 0 + 0.9*0.6 - 0.4 = 0.14   A1 = 0.14 + 0.72*0.4   = 0.428
    #   t=0: delta = 0 + 0.9*0.4 - 0.2 = 0.16   A0 = 0.16 + 0.72*0.428 = 0.46816
    rewards = torch.tensor([[0.0, 0.0, 1.0, 5.0]])
    values = torch.tensor([[0.2, 0.4, 0.6, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    raw = [0.46816, 0.428, 0.4]
    adv, ret = advantage.compute_gae_advantage_return(rewards, values, mask, gamma=0.9, lam=0.8, whiten=False)
    assert torch.allclose(adv[0, :3], torch.tensor(raw), atol=1e-6)
    assert torch.allclose(ret[0, :3], torch.tensor([0.66816, 0.828, 1.0]), atol=1e-6)

    adv, ret = advantage.compute_gae_advantage_return(rewards, values, mask, gamma=0.9, lam=0.8)
    mean, std = statistics.mean(raw), statistics.stdev(raw)
    assert torch.allclose(adv[0, :3], torch.tensor([(a - mean) / std for a in raw]), atol=1e-5)
    assert torch.allclose(ret[0, :3], torch.tensor([0.66816, 0.828, 1.0]), atol=1e-6)  # returns never whitened


def _grpo_hand_case() -> None:
    # Group "a": scores 1, 0, 0 -> mean 1/3, unbiased std sqrt(1/3); group "b": 2, 4 -> mean 3, std sqrt(2).
    index = ["a", "b", "a", "b", "a"]
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0], [1, 0, 0]], dtype=torch.float32)
    rewards = torch.zeros(5, 3)
    for row, (last, score) in enumerate([(1, 1.0), (0, 2.0), (2, 0.0), (1, 4.0), (0, 0.0)]):
        rewards[row, last] = score  # the outcome reward sits on the last response token
    a_hi, a_lo = (2 / 3) / math.sqrt(1 / 3), (-1 / 3) / math.sqrt(1 / 3)
    b_lo, b_hi = -1 / math.sqrt(2), 1 / math.sqrt(2)
    expected_rows = [a_hi, b_lo, a_lo, b_hi, a_lo]

    adv, ret = advantage.compute_grpo_outcome_advantage(rewards, mask, index, epsilon=0.0)
    assert torch.allclose(adv, torch.tensor(expected_rows).unsqueeze(-1) * mask, atol=1e-6)
    assert torch.equal(adv, ret)

    adv, _ = advantage.compute_grpo_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=False)
    centred = [2 / 3, -1.0, -1 / 3, 1.0, -1 / 3]
    assert torch.allclose(adv, torch.tensor(centred).unsqueeze(-1) * mask, atol=1e-6)


HAND_CASES = {AdvEstimator.gae: _gae_hand_case, AdvEstimator.grpo: _grpo_hand_case}


@pytest.mark.parametrize("estimator", list(HAND_CASES))
def test_advantage_estimator_hand_table(estimator):
    assert advantage.get_adv_estimator_fn(estimator) is not None
    HAND_CASES[estimator]()


def test_every_registered_estimator_has_a_hand_table_or_a_plain_loop_reference():
    assert set(advantage.ESTIMATORS) == set(HAND_CASES) | set(REFERENCES), \
        "add a hand-computed case or a plain-loop reference (REFERENCES) for each new estimator"


def test_grpo_singleton_group_keeps_its_score_and_accepts_tensor_index():
    rewards = torch.tensor([[0.0, 3.0], [1.0, 0.0], [0.0, 2.0]])
    mask = torch.ones(3, 2)
    adv, _ = advantage.compute_grpo_outcome_advantage(rewards, mask, torch.tensor([7, 8, 8]), epsilon=0.0)
    assert torch.allclose(adv[0], torch.tensor([3.0, 3.0]))  # a group of one: mean 0, std 1
    assert torch.allclose(adv[1:, 0], torch.tensor([-1 / math.sqrt(2), 1 / math.sqrt(2)]), atol=1e-6)


def test_grpo_refuses_an_index_of_the_wrong_length():
    with pytest.raises(ValueError, match="index has 2 group ids for 3 rows"):
        advantage.compute_grpo_outcome_advantage(torch.zeros(3, 2), torch.ones(3, 2), [0, 1])


def test_registry_refuses_a_second_registration_and_lists_valid_names():
    with pytest.raises(ValueError, match="'gae' is already registered"):
        advantage.register_adv_est(AdvEstimator.gae)(lambda *a: a)
    assert advantage.get_adv_estimator_fn("gae") is advantage.compute_gae_advantage_return
    # gdpo is one of verl's estimators (a spec may hold it); the engine has no implementation of it
    with pytest.raises(ValueError, match=rf"'gdpo' has no implementation; valid: {re.escape(', '.join(advantage.names()))}$"):
        advantage.get_adv_estimator_fn("gdpo")
    with pytest.raises(ValueError, match=r"'nope' is unknown; valid: gae, grpo, reinforce_plus_plus"):
        advantage.get_adv_estimator_fn("nope")


# --------------------------------------------------------------------------------------------
# GAE against a plain loop


def _gae_plain_loop(rewards, values, mask, gamma, lam):
    """Reference: per row, keep only the response tokens, run textbook GAE over them, and give each
    padding position the advantage of the next response token (0 after the last)."""
    advantages = []
    for r_row, v_row, m_row in zip(rewards, values, mask, strict=True):
        kept = [t for t, m in enumerate(m_row) if m]
        adv_kept = [0.0] * len(kept)
        running = 0.0
        for j in reversed(range(len(kept))):
            t = kept[j]
            next_v = v_row[kept[j + 1]] if j + 1 < len(kept) else 0.0
            running = r_row[t] + gamma * next_v - v_row[t] + gamma * lam * running
            adv_kept[j] = running
        row = []
        for t in range(len(m_row)):
            later = [j for j, k in enumerate(kept) if k >= t]
            row.append(adv_kept[later[0]] if later else 0.0)
        advantages.append(row)
    return advantages


@settings(max_examples=40, deadline=None)
@given(
    B=st.integers(1, 4),
    T=st.integers(1, 7),
    gamma=st.floats(0.0, 1.0),
    lam=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**16),
)
def test_gae_matches_plain_loop(B, T, gamma, lam, seed):
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(B, T, generator=g, dtype=torch.float64)
    values = torch.randn(B, T, generator=g, dtype=torch.float64)
    mask = (torch.rand(B, T, generator=g) < 0.7).to(torch.float64)  # holes anywhere, not just padding
    adv, ret = advantage.compute_gae_advantage_return(rewards, values, mask, gamma, lam, whiten=False)
    expected = torch.tensor(_gae_plain_loop(rewards.tolist(), values.tolist(), mask.tolist(), gamma, lam),
                            dtype=torch.float64)
    assert torch.allclose(adv, expected, atol=1e-9)
    assert torch.allclose(ret, expected + values, atol=1e-9)



@settings(max_examples=40, deadline=None)
@given(
    groups=st.lists(st.integers(0, 3), min_size=2, max_size=12),
    seed=st.integers(0, 2**16),
)
def test_grpo_advantages_are_standardised_within_each_group(groups, seed):
    g = torch.Generator().manual_seed(seed)
    B, T = len(groups), 3
    rewards = torch.randn(B, T, generator=g, dtype=torch.float64)
    mask = torch.ones(B, T, dtype=torch.float64)
    adv, _ = advantage.compute_grpo_outcome_advantage(rewards, mask, groups, epsilon=0.0)
    scores = rewards.sum(-1)
    for label in set(groups):
        rows = [i for i, x in enumerate(groups) if x == label]
        group_adv = adv[rows, 0]
        if len(rows) == 1:
            assert group_adv.item() == pytest.approx(scores[rows[0]].item())
        else:
            assert group_adv.mean().item() == pytest.approx(0.0, abs=1e-9)
            assert group_adv.std().item() == pytest.approx(1.0, abs=1e-9)


# --------------------------------------------------------------------------------------------
# Every other estimator against a plain loop of verl's formula, over one table of batches
#
# A reference takes plain lists: rewards and mask (B, T), index (B,) the prompt of each row, baselines (B,)
# the greedy rollout's score, settings (gamma, lam, norm_adv_by_std_in_grpo) -> advantages, returns (B, T).

REFERENCES: dict[AdvEstimator, object] = {}


def reference(name: AdvEstimator):
    def register(fn):
        REFERENCES[name] = fn
        return fn

    return register


def _groups(values, index):
    """{prompt: [value of each of its rows, in row order]}"""
    groups: dict = {}
    for value, label in zip(values, index, strict=True):
        groups.setdefault(label, []).append(value)
    return groups

# (rewards, mask, index, baselines): groups of 1 to 3 rows, padding, rewards on the last token and inside.
TABLE = [
    ([[0.0, 1.0], [0.0, 0.0], [2.0, 0.0]], [[1, 1], [1, 0], [1, 0]], ["a", "a", "b"], [0.5, 0.5, 1.0]),
    ([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0], [3.0, 0.0, 0.0]],
     [[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 0, 0]], [7, 7, 7, 9], [0.0, 0.0, 0.0, 1.0]),
    ([[0.5, 0.0, -1.0, 0.0], [0.0, 0.0, 0.0, 2.0], [1.0, 1.0, 0.0, 0.0], [0.0, -0.5, 0.0, 0.0],
      [0.0, 0.0, 0.0, 0.0], [0.0, 4.0, 0.0, 0.0]],
     [[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0]],
     ["p", "q", "p", "q", "r", "q"], [0.0, 1.0, 0.0, 1.0, -1.0, 1.0]),
]
SETTINGS = [{"gamma": 1.0, "lam": 1.0, "norm_adv_by_std_in_grpo": True},
            {"gamma": 0.9, "lam": 0.95, "norm_adv_by_std_in_grpo": False}]


# ---- the references, one per estimator (verl 0.9.1's loops, transcribed)


@reference(AdvEstimator.rloo)
def _rloo_reference(rewards, mask, index, baselines, setting):
    scores = [sum(row) for row in rewards]
    groups = _groups(scores, index)
    out = []
    for i, label in enumerate(index):
        n, mean = len(groups[label]), sum(groups[label]) / len(groups[label])
        a = scores[i] * n / (n - 1) - mean * n / (n - 1) if n > 1 else scores[i]
        out.append([a * m for m in mask[i]])
    return out, out


def _whiten(rows, mask):
    """verl_F.masked_whiten: (x - mean) / sqrt(var + 1e-8) over the masked entries, var unbiased; its masked
    means divide by (count + 1e-8)."""
    kept = [x for row, m_row in zip(rows, mask, strict=True) for x, m in zip(row, m_row, strict=True) if m]
    n = len(kept)
    mean = sum(kept) / (n + 1e-8)
    var = sum((x - mean) ** 2 for x in kept) / (n + 1e-8) * n / (n - 1)
    return [[(x - mean) / math.sqrt(var + 1e-8) for x in row] for row in rows]


@reference(AdvEstimator.reinforce_plus_plus)
def _reinforce_plus_plus_reference(rewards, mask, index, baselines, setting):
    returns = []
    for r_row, m_row in zip(rewards, mask, strict=True):
        row, running = [0.0] * len(r_row), 0.0
        for t in reversed(range(len(r_row))):
            new = r_row[t] + setting["gamma"] * running
            row[t] = new * m_row[t]
            running = new * m_row[t] + running * (1 - m_row[t])
        returns.append(row)
    whitened = _whiten(returns, mask)
    return [[a * m for a, m in zip(a_row, m_row, strict=True)] for a_row, m_row in zip(whitened, mask, strict=True)], returns


@reference(AdvEstimator.reinforce_plus_plus_baseline)
def _reinforce_plus_plus_baseline_reference(rewards, mask, index, baselines, setting):
    scores = [sum(row) for row in rewards]
    groups = _groups(scores, index)
    centred = []
    for i, label in enumerate(index):
        mean = sum(groups[label]) / len(groups[label]) if len(groups[label]) > 1 else 0.0
        centred.append([(scores[i] - mean) * m for m in mask[i]])
    whitened = _whiten(centred, mask)
    out = [[a * m for a, m in zip(a_row, m_row, strict=True)] for a_row, m_row in zip(whitened, mask, strict=True)]
    return out, out


@reference(AdvEstimator.opo)
def _opo_reference(rewards, mask, index, baselines, setting):
    scores, lengths = [sum(row) for row in rewards], [sum(row) for row in mask]
    groups, group_lengths = _groups(scores, index), _groups(lengths, index)
    out = []
    for i, label in enumerate(index):
        s, n = groups[label], group_lengths[label]
        baseline = sum(a * b for a, b in zip(n, s, strict=True)) / sum(n) if len(s) > 1 else 0.0
        out.append([(scores[i] - baseline) * m for m in mask[i]])
    return out, out


@reference(AdvEstimator.gpg)
def _gpg_reference(rewards, mask, index, baselines, setting):
    scores = [sum(row) for row in rewards]
    alpha = len(scores) / max(sum(1 for s in scores if s != 0), 1)
    groups = _groups(scores, index)
    out = []
    for i, label in enumerate(index):
        mean = sum(groups[label]) / len(groups[label]) if len(groups[label]) > 1 else 0.0
        out.append([alpha * (scores[i] - mean) / 1.0 * m for m in mask[i]])
    return out, out


@reference(AdvEstimator.grpo)
def _grpo_reference(rewards, mask, index, baselines, setting):
    """With ``algorithm.norm_adv_by_std_in_grpo=False`` (the second setting of the table) only the mean is
    subtracted: Dr. GRPO's advantage."""
    scores = [sum(row) for row in rewards]
    groups = _groups(scores, index)
    out = []
    for i, label in enumerate(index):
        group = groups[label]
        mean = sum(group) / len(group) if len(group) > 1 else 0.0
        std = math.sqrt(sum((x - mean) ** 2 for x in group) / (len(group) - 1)) if len(group) > 1 else 1.0
        a = (scores[i] - mean) / (std + 1e-6) if setting["norm_adv_by_std_in_grpo"] else scores[i] - mean
        out.append([a * m for m in mask[i]])
    return out, out


@reference(AdvEstimator.remax)
def _remax_reference(rewards, mask, index, baselines, setting):
    returns, advantages = [], []
    for r_row, m_row, b in zip(rewards, mask, baselines, strict=True):
        row = [sum(r_row[k] * m_row[k] for k in range(t, len(r_row))) for t in range(len(r_row))]
        returns.append(row)
        advantages.append([g - b * m for g, m in zip(row, m_row, strict=True)])
    return advantages, returns

def _run(name, rewards, mask, index, baselines, setting):
    data = {"token_level_rewards": torch.tensor(rewards, dtype=torch.float64),
            "response_mask": torch.tensor(mask, dtype=torch.long), "uid": index,
            "reward_baselines": torch.tensor(baselines, dtype=torch.float64)}
    out = advantage.compute_advantage(data, name, **setting)
    return out["advantages"], out["returns"]


@pytest.mark.parametrize("setting", SETTINGS, ids=["default", "gamma0.9-nostd"])
@pytest.mark.parametrize("batch", range(len(TABLE)))
@pytest.mark.parametrize("name", sorted(REFERENCES, key=lambda e: e.value))
def test_estimator_matches_verls_formula_as_a_plain_loop(name, batch, setting):
    rewards, mask, index, baselines = TABLE[batch]
    got_adv, got_ret = _run(name, rewards, mask, index, baselines, setting)
    want_adv, want_ret = REFERENCES[name](rewards, mask, index, baselines, setting)
    assert torch.allclose(got_adv, torch.tensor(want_adv, dtype=torch.float64), atol=1e-9), (got_adv, want_adv)
    assert torch.allclose(got_ret, torch.tensor(want_ret, dtype=torch.float64), atol=1e-9), (got_ret, want_ret)


# --------------------------------------------------------------------------------------------
# compute_advantage and the spec reading the registry


def test_compute_advantage_passes_what_the_entry_reads_and_names_a_missing_field():
    rewards = torch.tensor([[0.0, 1.0], [0.0, 3.0]])
    data = {"token_level_rewards": rewards, "response_mask": torch.ones(2, 2, dtype=torch.long), "uid": ["x", "x"]}
    out = advantage.compute_advantage(data, "grpo", norm_adv_by_std_in_grpo=False)
    assert out is data and torch.allclose(out["advantages"], torch.tensor([[-1.0, -1.0], [1.0, 1.0]]))
    with pytest.raises(ValueError, match="adv_estimator gae reads 'values', which the batch lacks"):
        advantage.compute_advantage({**data}, "gae")
    assert advantage.estimator("gae").settings == ("gamma", "lam") and advantage.estimator("gae").critic


def test_the_spec_refuses_at_launch_exactly_what_the_registry_lacks():
    for name in AdvEstimator:
        spec = parse_spec({"algorithm.adv_estimator": name.value, "actor_rollout_ref.rollout.n": 2})
        refused = [i for i in check_spec(spec, launch=True) if i.field == "algorithm.adv_estimator"]
        if name in advantage.ESTIMATORS:
            assert refused == [] and spec.has_critic == advantage.ESTIMATORS[name].critic
        else:
            assert refused[0].severity == "error" and refused[0].valid == advantage.names()
            assert f"it runs {', '.join(advantage.names())}" in refused[0].message and not spec.has_critic


@pytest.mark.parametrize("name", sorted((e for e in advantage.ESTIMATORS.values() if e.group), key=lambda e: e.name.value),
                         ids=lambda e: e.name.value)
def test_a_group_estimator_needs_two_samples_per_prompt(name):
    spec = parse_spec({"algorithm.adv_estimator": name.name.value, "actor_rollout_ref.rollout.n": 1})
    issues = [i for i in check_spec(spec) if i.field == "actor_rollout_ref.rollout.n"]
    assert issues and "rollout.n must be >= 2" in issues[0].message and issues[0].valid == ">= 2"


def test_the_registry_and_the_spec_import_without_torch():
    """The web process reads the registry through the spec's launch checks; it never loads torch."""
    code = "import sys, worker.spec, worker.ppo.advantage; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=120)
