"""PPO math against hand-computed tables and plain-loop references."""

from __future__ import annotations

import math
import re
import statistics

import pytest
import torch

from worker.ppo import core_algos as pm
from worker.spec import ENGINE_KL_TYPES, KLType

# --------------------------------------------------------------------------------------------
# Masked statistics


@pytest.mark.parametrize(
    "x,mask,dim,expected",
    [
        ([[1.0, 2.0, 3.0, 4.0]], [[1, 1, 0, 0]], None, 1.5),
        ([[1.0, 2.0], [3.0, 5.0]], [[1, 0], [1, 1]], None, 3.0),  # (1 + 3 + 5) / 3
        ([[1.0, 2.0], [3.0, 5.0]], [[1, 0], [1, 1]], -1, [1.0, 4.0]),
        ([[1.0, float("nan")], [float("inf"), 5.0]], [[1, 0], [0, 1]], None, 3.0),  # masked NaN/inf ignored
        ([[7.0, 8.0]], [[0, 0]], None, 0.0),  # empty mask -> 0, not NaN
    ],
)
def test_masked_mean(x, mask, dim, expected):
    got = pm.masked_mean(torch.tensor(x), torch.tensor(mask, dtype=torch.float32), dim=dim)
    assert torch.allclose(got, torch.tensor(expected), atol=1e-6)


def test_masked_var_is_unbiased_over_masked_entries():
    x = torch.tensor([[1.0, 2.0, 4.0, 100.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    assert pm.masked_var(x, mask).item() == pytest.approx(statistics.variance([1.0, 2.0, 4.0]))
    assert pm.masked_var(x, mask, unbiased=False).item() == pytest.approx(statistics.pvariance([1.0, 2.0, 4.0]))


@pytest.mark.parametrize("mask,message", [([[0.0, 0.0]], "selects no element"), ([[1.0, 0.0]], "single element")])
def test_masked_var_refuses_degenerate_masks(mask, message):
    with pytest.raises(ValueError, match=message):
        pm.masked_var(torch.tensor([[1.0, 2.0]]), torch.tensor(mask))


def test_masked_whiten():
    x = torch.tensor([[1.0, 2.0, 4.0, 100.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    mean, std = statistics.mean([1, 2, 4]), statistics.stdev([1, 2, 4])
    expected = [(v - mean) / std for v in (1.0, 2.0, 4.0)]
    assert torch.allclose(pm.masked_whiten(x, mask)[0, :3], torch.tensor(expected), atol=1e-5)
    assert torch.allclose(pm.masked_whiten(x, mask, shift_mean=False)[0, :3],
                          torch.tensor(expected) + mean, atol=1e-5)


def test_engine_kl_types_in_the_spec_are_the_registry():
    """The spec's launch check (engine_issues) refuses exactly the KL types this table lacks."""
    assert {k.value for k in pm.KL_ESTIMATORS} == ENGINE_KL_TYPES


@pytest.mark.parametrize("alias,name", [("k1", "kl"), ("k2", "mse"), ("k3", "low_var_kl")])
def test_kl_aliases_are_verls_other_names(alias, name):
    logprob, ref = torch.tensor([[-0.3, -2.0]]), torch.tensor([[-1.1, -0.5]])
    assert torch.equal(pm.kl_penalty(logprob, ref, alias), pm.kl_penalty(logprob, ref, name))


@pytest.mark.parametrize("kind", ["full", "k3+", "low_var_kl+"])
def test_kl_types_the_engine_does_not_run_are_named(kind):
    with pytest.raises(ValueError, match=rf"'{re.escape(kind)}' is not implemented by attnboard's engine; valid: kl"):
        pm.kl_penalty(torch.zeros(1, 1), torch.zeros(1, 1), kind)


# --------------------------------------------------------------------------------------------
# KL


@pytest.mark.parametrize(
    "kind,logprob,ref_logprob,expected",
    [
        (KLType.kl, math.log(0.5), math.log(0.25), math.log(2)),
        (KLType.kl, math.log(0.25), math.log(0.5), -math.log(2)),
        (KLType.abs, math.log(0.25), math.log(0.5), math.log(2)),
        (KLType.mse, math.log(0.5), math.log(0.25), 0.5 * math.log(2) ** 2),
        # k3 = r - log r - 1 with r = 0.25 / 0.5
        (KLType.low_var_kl, math.log(0.5), math.log(0.25), 0.5 - math.log(0.5) - 1),
        (KLType.low_var_kl, -1.0, -1.0, 0.0),
        # log ratio -100 is clamped to -20: exp(-20) + 20 - 1 = 19.0..., then clamped to 10
        (KLType.low_var_kl, 0.0, -100.0, 10.0),
        ("kl", -2.0, -3.0, 1.0),
    ],
)
def test_kl_penalty(kind, logprob, ref_logprob, expected):
    got = pm.kl_penalty(torch.tensor([[logprob]]), torch.tensor([[ref_logprob]]), kind)
    assert got.item() == pytest.approx(expected, abs=1e-6)


def test_kl_penalty_unknown_kind_lists_valid():
    with pytest.raises(ValueError, match="'k9' is unknown; valid: kl, abs, mse, low_var_kl"):
        pm.kl_penalty(torch.zeros(1, 1), torch.zeros(1, 1), "k9")


def test_apply_kl_in_reward_subtracts_on_response_tokens_only():
    scores = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    logprob = torch.tensor([[-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0]])
    ref = torch.tensor([[-2.0, -1.5, -1.0], [-1.0, -3.0, -9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    rewards, metrics = pm.apply_kl_in_reward(scores, logprob, ref, mask, kl_coef=0.1, kind="kl")
    # k1 = logprob - ref: row 0 [1, 0.5, 0], row 1 [0, 2, (masked)]
    assert torch.allclose(rewards, torch.tensor([[-0.1, -0.05, 1.0], [0.0, 1.8, 0.0]]))
    assert metrics["actor/reward_kl_penalty"] == pytest.approx((0.5 + 1.0) / 2)
    assert metrics["actor/reward_kl_penalty_coeff"] == 0.1


def test_kl_loss_is_token_mean_with_gradient():
    logprob = torch.tensor([[-1.0, -1.0, -5.0]], requires_grad=True)
    ref = torch.tensor([[-2.0, -1.0, 0.0]])
    loss, metrics = pm.compute_kl_loss(logprob, ref, torch.tensor([[1.0, 1.0, 0.0]]), "kl")
    assert loss.item() == pytest.approx(0.5) and metrics["actor/kl_loss"] == pytest.approx(0.5)
    loss.backward()
    assert torch.allclose(logprob.grad, torch.tensor([[0.5, 0.5, 0.0]]))


# --------------------------------------------------------------------------------------------
# Clipped losses


@pytest.mark.parametrize(
    "advantage,ratio,expected_loss,clipped",
    [
        (1.0, 1.5, -1.2, True),  # A > 0, ratio above 1 + eps: gain capped at 1.2, no gradient
        (1.0, 1.1, -1.1, False),  # inside the trust region
        (1.0, 0.5, -0.5, False),  # A > 0, ratio below 1 - eps: unclipped (pessimistic) term kept
        (-1.0, 1.5, 1.5, False),  # A < 0, ratio above: unclipped term kept, gradient pushes back
        (-1.0, 0.5, 0.8, True),  # A < 0, ratio below 1 - eps: capped at 0.8, no gradient
        (0.0, 3.0, 0.0, False),  # no advantage, no loss
    ],
)
def test_policy_loss_clipping(advantage, ratio, expected_loss, clipped):
    old = torch.tensor([[-1.0]])
    new = (old + math.log(ratio)).clone().requires_grad_(True)
    loss, metrics = pm.compute_policy_loss(old, new, torch.tensor([[advantage]]), torch.ones(1, 1), clip_ratio=0.2)
    assert loss.item() == pytest.approx(expected_loss, abs=1e-6)
    assert metrics["actor/pg_clipfrac"] == (1.0 if clipped else 0.0)
    assert metrics["actor/pg_loss"] == pytest.approx(expected_loss, abs=1e-6)
    assert metrics["actor/ppo_kl"] == pytest.approx(-math.log(ratio), abs=1e-6)
    loss.backward()
    expected_grad = 0.0 if clipped else -advantage * ratio  # d(-A * exp(new - old)) / d new
    assert new.grad.item() == pytest.approx(expected_grad, abs=1e-6)


def test_policy_loss_token_mean_ignores_padding_and_asymmetric_clip():
    old = torch.zeros(1, 3)
    new = torch.log(torch.tensor([[1.5, 1.5, 9.0]]))
    adv = torch.ones(1, 3)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, metrics = pm.compute_policy_loss(old, new, adv, mask, clip_ratio=0.2, clip_ratio_high=0.28)
    assert loss.item() == pytest.approx(-1.28)
    assert metrics["actor/pg_clipfrac"] == 1.0


@pytest.mark.parametrize(
    "vpred,value,ret,expected_loss,clipped",
    [
        (2.0, 1.0, 3.0, 0.5 * (1.5 - 3.0) ** 2, True),  # moved past value + 0.5 toward the target: clipped term larger
        (1.2, 1.0, 3.0, 0.5 * (1.2 - 3.0) ** 2, False),  # inside the range
        (0.0, 1.0, 3.0, 0.5 * (0.0 - 3.0) ** 2, False),  # moved away from the target: unclipped term larger
        (4.0, 1.0, 3.0, 0.5 * (1.5 - 3.0) ** 2, True),  # overshot the target beyond the range
    ],
)
def test_value_loss_clipping(vpred, value, ret, expected_loss, clipped):
    vpreds = torch.tensor([[vpred]], requires_grad=True)
    loss, metrics = pm.compute_value_loss(vpreds, torch.tensor([[value]]), torch.tensor([[ret]]), torch.ones(1, 1),
                                          cliprange_value=0.5)
    assert loss.item() == pytest.approx(expected_loss)
    assert metrics == {"critic/vf_loss": pytest.approx(expected_loss), "critic/vf_clipfrac": 1.0 if clipped else 0.0}
    loss.backward()
    assert vpreds.grad.item() == pytest.approx(0.0 if clipped else vpred - ret)


# --------------------------------------------------------------------------------------------
# From logits


def test_logprobs_and_entropy_from_logits_match_references():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 11, generator=g, dtype=torch.float64)
    labels = torch.randint(0, 11, (2, 5), generator=g)
    expected = torch.log_softmax(logits, dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(pm.logprobs_from_logits(logits, labels), expected, atol=1e-12)
    assert torch.allclose(pm.entropy_from_logits(logits), torch.distributions.Categorical(logits=logits).entropy(),
                          atol=1e-12)


def test_entropy_of_uniform_and_peaked_logits():
    assert pm.entropy_from_logits(torch.zeros(7)).item() == pytest.approx(math.log(7))
    assert pm.entropy_from_logits(torch.tensor([0.0, -1e4, -1e4])).item() == pytest.approx(0.0, abs=1e-6)
