"""PPO math: small pure tensor functions, in verl's vocabulary (``verl/trainer/ppo/core_algos.py``).

No I/O, no distributed calls, no module state other than the KL estimators' table. The advantage
estimators and their registry are in ``worker.ppo.advantage``. Shapes:

- ``B``  rows of the batch (prompt x sample), ``T`` response tokens (right-padded), ``V`` vocabulary.
- ``response_mask`` (B, T): 1 for a generated token up to and including EOS, 0 for padding.

Losses return ``(loss, metrics)``: ``loss`` a 0-d tensor that carries the gradient, ``metrics`` a dict of
Python floats namespaced by role (``actor/pg_clipfrac``, ``critic/vf_loss``). Loss aggregation is
token-mean: every unmasked token of the batch weighs the same (verl's ``loss_agg_mode="token-mean"``).

References: PPO (Schulman et al. 2017, arXiv:1707.06347), KL estimators http://joschu.net/blog/kl-approx.html.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from worker.core.vocabulary import KLType

# --------------------------------------------------------------------------------------------
# Masked statistics


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``x`` where ``mask`` is set. Masked entries may hold anything, NaN and inf included."""
    kept = torch.where(mask.bool(), x, torch.zeros_like(x))
    return kept.sum() if dim is None else kept.sum(dim=dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``x`` over the entries where ``mask`` is set; over all dims when ``dim`` is None.

    x, mask: same shape, e.g. (B, T). An all-zero mask gives 0 (the 1e-8 guard is verl's).
    """
    count = mask.sum() if dim is None else mask.sum(dim=dim)
    return masked_sum(x, mask, dim) / (count + 1e-8)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of the entries of ``x`` where ``mask`` is set (a 0-d tensor), Bessel-corrected by default."""
    mean = masked_mean(x, mask)
    variance = masked_mean((x - mean) ** 2, mask)
    if unbiased:
        count = mask.sum()
        if count == 0:
            raise ValueError("masked_var: the mask selects no element; at least one element must be 1")
        if count == 1:
            raise ValueError("masked_var: the mask selects a single element; the unbiased variance divides by zero")
        variance = variance * count / (count - 1)
    return variance


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """(x - mean) / std over the masked entries; with ``shift_mean=False`` the mean is added back.

    x, mask: (B, T) -> (B, T). Masked-out entries are whitened too (their values are meaningless).
    """
    mean, var = masked_mean(x, mask), masked_var(x, mask)
    whitened = (x - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        whitened = whitened + mean
    return whitened


def agg_loss(loss_mat: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Token-mean aggregation: the mean of ``loss_mat`` (B, T) over every unmasked token -> 0-d."""
    return masked_mean(loss_mat, response_mask)


# --------------------------------------------------------------------------------------------
# KL


def _kl_k1(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    return logprob - ref_logprob


def _kl_abs(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    return (logprob - ref_logprob).abs()


def _kl_mse(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    return 0.5 * (logprob - ref_logprob).square()


def _kl_low_var(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    # k3 = r - log r - 1 with r = p_ref / p, unbiased and always >= 0; clamped as verl does for stability
    log_ratio = (ref_logprob - logprob).clamp(min=-20, max=20)
    k3 = torch.exp(log_ratio) - log_ratio - 1
    return k3.clamp(min=-10, max=10)


KL_ESTIMATORS: dict[KLType, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    KLType.kl: _kl_k1,
    KLType.abs: _kl_abs,
    KLType.mse: _kl_mse,
    KLType.low_var_kl: _kl_low_var,
    # verl's other names for the same three estimators (its kl_penalty_forward)
    KLType.k1: _kl_k1,
    KLType.k2: _kl_mse,
    KLType.k3: _kl_low_var,
}


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kind: KLType | str) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from sampled tokens' log-probs (B, T) -> (B, T).

    approx KL, http://joschu.net/blog/kl-approx.html:
    ``kl`` k1 = log p - log p_ref; ``abs`` |k1|; ``mse`` k2 = 0.5 * k1^2;
    ``low_var_kl`` k3 = p_ref/p - log(p_ref/p) - 1, log ratio clamped to [-20, 20], result to [-10, 10];
    ``k1``, ``k2``, ``k3`` are verl's other names for kl, mse, low_var_kl.
    """
    estimator = KL_ESTIMATORS.get(kind)  # type: ignore[call-overload]  # str keys match: KLType is a str Enum
    if estimator is None:
        known = "is not implemented by attnboard's engine" if kind in KLType._value2member_map_ else "is unknown"
        raise ValueError(f"KL estimator {kind!r} {known}; valid: {', '.join(k.value for k in KL_ESTIMATORS)}")
    return estimator(logprob, ref_logprob)


def apply_kl_in_reward(
    token_level_scores: torch.Tensor,
    logprob: torch.Tensor,
    ref_logprob: torch.Tensor,
    response_mask: torch.Tensor,
    kl_coef: float,
    kind: KLType | str,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Reward shaping with a KL penalty: r_t = score_t - kl_coef * KL_t on response tokens.

    token_level_scores, logprob, ref_logprob, response_mask: (B, T) -> token_level_rewards (B, T).
    ``logprob`` is the behaviour policy's (the rollout's old log-probs), as in verl.
    """
    kld = kl_penalty(logprob, ref_logprob, kind) * response_mask  # (B, T)
    token_level_rewards = token_level_scores - kl_coef * kld  # (B, T)
    current_kl = masked_mean(kld, response_mask, dim=-1).mean()  # per-row mean, then batch mean
    return token_level_rewards, {
        "actor/reward_kl_penalty": float(current_kl),
        "actor/reward_kl_penalty_coeff": float(kl_coef),
    }


def compute_kl_loss(
    logprob: torch.Tensor,
    ref_logprob: torch.Tensor,
    response_mask: torch.Tensor,
    kind: KLType | str,
) -> tuple[torch.Tensor, dict[str, float]]:
    """KL to the reference as a loss term (verl ``use_kl_loss``): token-mean of the estimator.

    logprob (B, T) carries the gradient, ref_logprob (B, T) does not. The caller scales by kl_loss_coef.
    """
    kl_loss = agg_loss(kl_penalty(logprob, ref_logprob, kind), response_mask)
    return kl_loss, {"actor/kl_loss": float(kl_loss.detach())}


# --------------------------------------------------------------------------------------------
# Losses


def compute_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio: float,
    *,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped surrogate objective of PPO (Schulman et al. 2017, eq. 7), as a loss to minimise.

    old_log_prob, log_prob, advantages, response_mask: (B, T) -> 0-d loss.

        ratio    = exp(log_prob - old_log_prob)
        pg_loss1 = -A * ratio
        pg_loss2 = -A * clip(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)
        loss     = token-mean of max(pg_loss1, pg_loss2)

    ``clip_ratio_low``/``clip_ratio_high`` default to ``clip_ratio`` (asymmetric clipping as in DAPO).
    Metrics: ``actor/pg_loss``; ``actor/pg_clipfrac`` the fraction of tokens where the clipped term is
    the one used (it has no gradient); ``actor/ppo_kl`` the k1 estimate of KL(old || new).
    """
    low = clip_ratio if clip_ratio_low is None else clip_ratio_low
    high = clip_ratio if clip_ratio_high is None else clip_ratio_high
    negative_approx_kl = (log_prob - old_log_prob).clamp(min=-20.0, max=20.0)  # (B, T), clamped against overflow
    ratio = torch.exp(negative_approx_kl)  # (B, T)
    ppo_kl = masked_mean(-negative_approx_kl, response_mask)

    pg_loss1 = -advantages * ratio  # (B, T)
    pg_loss2 = -advantages * torch.clamp(ratio, 1.0 - low, 1.0 + high)  # (B, T)
    pg_losses = torch.maximum(pg_loss1, pg_loss2)  # (B, T), the pessimistic bound
    pg_clipfrac = masked_mean(torch.gt(pg_loss2, pg_loss1).to(log_prob.dtype), response_mask)
    pg_loss = agg_loss(pg_losses, response_mask)
    return pg_loss, {
        "actor/pg_loss": float(pg_loss.detach()),
        "actor/pg_clipfrac": float(pg_clipfrac),
        "actor/ppo_kl": float(ppo_kl.detach()),
    }


def compute_value_loss(
    vpreds: torch.Tensor,
    values: torch.Tensor,
    returns: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped value loss (PPO2 / verl): the new prediction may move at most ``cliprange_value`` from the
    old one before the clipped term takes over.

    vpreds (B, T) carries the gradient; values (B, T) are the old predictions; returns (B, T) the targets.

        vpred_clipped = clip(vpreds, values - c, values + c)
        loss          = 0.5 * token-mean of max((vpreds - R)^2, (vpred_clipped - R)^2)
    """
    vpred_clipped = torch.clamp(vpreds, values - cliprange_value, values + cliprange_value)  # (B, T)
    vf_losses1 = (vpreds - returns) ** 2  # (B, T)
    vf_losses2 = (vpred_clipped - returns) ** 2  # (B, T)
    vf_loss = 0.5 * agg_loss(torch.maximum(vf_losses1, vf_losses2), response_mask)
    vf_clipfrac = masked_mean(torch.gt(vf_losses2, vf_losses1).to(vpreds.dtype), response_mask)
    return vf_loss, {"critic/vf_loss": float(vf_loss.detach()), "critic/vf_clipfrac": float(vf_clipfrac)}


# --------------------------------------------------------------------------------------------
# From logits


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log p(label): logits (..., V), labels (...) -> (...).

    Gathers the label's logit and subtracts logsumexp, so no (..., V) log-softmax tensor is kept for
    the backward pass beyond what logsumexp needs.
    """
    label_logits = torch.gather(logits, dim=-1, index=labels.unsqueeze(-1)).squeeze(-1)  # (...)
    return label_logits - torch.logsumexp(logits, dim=-1)  # (...)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the categorical distribution: logits (..., V) -> (...).

    H = logsumexp(z) - sum_v softmax(z)_v * z_v (no log of a probability, so no log(0)).
    """
    pd = torch.softmax(logits, dim=-1)  # (..., V)
    return torch.logsumexp(logits, dim=-1) - (pd * logits).sum(dim=-1)
