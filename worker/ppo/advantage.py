"""Advantage estimators: one registry keyed by verl's names (``algorithm.adv_estimator``), each entry the
estimator's function and what it reads; ``compute_advantage`` is the one call the trainer makes (the shape of
verl 0.9.1's ``ray_trainer.compute_advantage``).

An entry declares what the rest of attnboard needs to know about its estimator:
- ``critic``: it reads the critic's values, so the run trains a critic (verl's ``need_critic``);
- ``group``: it compares each sample with the other samples of its prompt (``index``, the prompt's uid),
  so a launch needs ``actor_rollout_ref.rollout.n >= 2``;
- ``baseline``: it subtracts the reward of a greedy rollout of the prompt (``reward_baselines``), which the
  engine generates.
The spec's checks (which estimators the engine runs, whether a critic runs, the group size) read these
entries, so adding an estimator is its registered function and its test.

torch is imported inside the estimators, not at the top: the spec and the web process read the registry
(the launch checks) without loading torch. Shapes as in ``worker.ppo.core_algos``: ``B`` rows (prompt x
sample), ``T`` response tokens; ``response_mask`` (B, T).

References: GAE (Schulman et al. 2015, arXiv:1506.02438), GRPO (Shao et al. 2024, arXiv:2402.03300).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from worker.core.vocabulary import AdvEstimator

if TYPE_CHECKING:
    import torch

AdvantageFn = Callable[..., tuple["torch.Tensor", "torch.Tensor"]]
SETTINGS = ("gamma", "lam", "norm_adv_by_std_in_grpo")
"""The ``algorithm.*`` settings an estimator may take, passed to those whose signature names them."""


@dataclass(frozen=True)
class Estimator:
    """A registry entry: the function, what it reads beyond rewards and mask, and the settings it takes."""

    name: AdvEstimator
    fn: AdvantageFn
    critic: bool = False
    group: bool = False
    baseline: bool = False
    settings: tuple[str, ...] = ()


ESTIMATORS: dict[AdvEstimator, Estimator] = {}


def register_adv_est(name: AdvEstimator | str, *, critic: bool = False, group: bool = False,
                     baseline: bool = False) -> Callable[[AdvantageFn], AdvantageFn]:
    """Register an advantage estimator under ``name`` with what it reads; registering a name twice raises."""
    key = _adv_key(name)

    def decorator(fn: AdvantageFn) -> AdvantageFn:
        if key in ESTIMATORS:
            raise ValueError(f"advantage estimator {key.value!r} is already registered "
                             f"({ESTIMATORS[key].fn.__qualname__})")
        settings = tuple(s for s in SETTINGS if s in inspect.signature(fn).parameters)
        ESTIMATORS[key] = Estimator(key, fn, critic=critic, group=group, baseline=baseline, settings=settings)
        return fn

    return decorator


def estimator(name: AdvEstimator | str) -> Estimator:
    """The entry registered under ``name``; an unknown or unimplemented name lists the registered ones."""
    key = _adv_key(name)
    if key not in ESTIMATORS:
        raise ValueError(f"algorithm.adv_estimator {key.value!r} has no implementation; valid: {', '.join(names())}")
    return ESTIMATORS[key]


def get_adv_estimator_fn(name: AdvEstimator | str) -> AdvantageFn:
    """The estimator function registered under ``name`` (verl's name for the lookup)."""
    return estimator(name).fn


def needs_critic(name: AdvEstimator | str) -> bool:
    """Whether a run with this ``algorithm.adv_estimator`` trains a critic (verl's ``need_critic``): its
    registered estimator reads values. An estimator the engine does not run needs none here."""
    entry = ESTIMATORS.get(name)  # type: ignore[call-overload]  # str keys match: AdvEstimator is a str Enum
    return entry is not None and entry.critic


def names() -> list[str]:
    """The estimators attnboard's engine runs, sorted."""
    return sorted(k.value for k in ESTIMATORS)


def _adv_key(name: AdvEstimator | str) -> AdvEstimator:
    try:
        return AdvEstimator(name)
    except ValueError:
        raise ValueError(f"algorithm.adv_estimator {name!r} is unknown; "
                         f"valid: {', '.join(e.value for e in AdvEstimator)}") from None


def compute_advantage(data: dict[str, Any], adv_estimator: AdvEstimator | str, *, gamma: float = 1.0, lam: float = 1.0,
                      norm_adv_by_std_in_grpo: bool = True) -> dict[str, Any]:
    """Add ``advantages`` and ``returns`` (B, T) to ``data`` with the registered estimator.

    ``data`` holds ``token_level_rewards`` and ``response_mask`` (B, T), and what the estimator reads:
    ``values`` (B, T) for a critic, ``uid`` (B,) the prompt of each row for a group, ``reward_baselines``
    (B,) for a greedy baseline. Returns ``data``."""
    entry = estimator(adv_estimator)
    rewards = data["token_level_rewards"]
    kwargs: dict[str, Any] = {"token_level_rewards": rewards, "response_mask": data["response_mask"].to(rewards.dtype)}
    for needed, key, arg in ((entry.critic, "values", "values"), (entry.group, "uid", "index"),
                             (entry.baseline, "reward_baselines", "reward_baselines")):
        if needed:
            if key not in data:
                raise ValueError(f"adv_estimator {entry.name.value} reads {key!r}, which the batch lacks")
            kwargs[arg] = data[key]
    given: Mapping[str, Any] = {"gamma": gamma, "lam": lam, "norm_adv_by_std_in_grpo": norm_adv_by_std_in_grpo}
    kwargs.update({s: given[s] for s in entry.settings})
    data["advantages"], data["returns"] = entry.fn(**kwargs)
    return data


# --------------------------------------------------------------------------------------------
# The estimators


@register_adv_est(AdvEstimator.gae, critic=True)
def compute_gae_advantage_return(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float,
    lam: float,
    *,
    whiten: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (GAE), verl's formulation.

    token_level_rewards, values, response_mask: (B, T) -> advantages, returns: (B, T).

        delta_t = r_t + gamma * V_{t+1} - V_t
        A_t     = delta_t + gamma * lam * A_{t+1}
        R_t     = A_t + V_t            (the critic's target, before whitening)

    Masked positions are skipped: the next value and the running advantage carry over them, so a
    position after the last response token bootstraps from 0. ``whiten`` (verl always does) whitens the
    advantages over the masked tokens of the whole batch; the returns are never whitened.
    """
    import torch

    from worker.ppo.core_algos import masked_whiten

    with torch.no_grad():
        B, T = token_level_rewards.shape
        mask = response_mask.to(values.dtype)
        next_values = torch.zeros(B, dtype=values.dtype, device=values.device)  # (B,)
        last_gae_lam = torch.zeros(B, dtype=values.dtype, device=values.device)  # (B,)
        advantages_reversed = []
        for t in reversed(range(T)):
            delta = token_level_rewards[:, t] + gamma * next_values - values[:, t]  # (B,)
            gae_t = delta + gamma * lam * last_gae_lam  # (B,)
            # skip values and TD errors on masked positions: carry the previous ones over them
            next_values = values[:, t] * mask[:, t] + (1 - mask[:, t]) * next_values
            last_gae_lam = gae_t * mask[:, t] + (1 - mask[:, t]) * last_gae_lam
            advantages_reversed.append(last_gae_lam)
        advantages = torch.stack(advantages_reversed[::-1], dim=1)  # (B, T)
        returns = advantages + values  # (B, T)
        if whiten:
            advantages = masked_whiten(advantages, response_mask)
    return advantages, returns


@register_adv_est(AdvEstimator.grpo, group=True)
def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Hashable] | torch.Tensor,
    norm_adv_by_std_in_grpo: bool = True,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO outcome advantage: each row's total reward normalised within its group.

    token_level_rewards, response_mask: (B, T); index: (B,) group id per row (the prompt's uid)
    -> advantages, returns: (B, T), equal, the row's scalar broadcast over its response tokens.

        s_i = sum_t r_{i,t};   A_i = (s_i - mean_g s) / (std_g s + epsilon)

    std is the unbiased standard deviation of the group. A group of one row has mean 0 and std 1
    (verl's convention), so its advantage is its own score. ``norm_adv_by_std_in_grpo=False`` gives
    Dr. GRPO's mean-centred score without the division.
    """
    import torch

    with torch.no_grad():
        B = token_level_rewards.shape[0]
        scores = token_level_rewards.sum(dim=-1)  # (B,)
        group, count = group_ids(index, B, device=scores.device)  # (B,) in [0, G), (G,)
        count = count.to(scores.dtype)
        G = count.shape[0]
        total = torch.zeros(G, dtype=scores.dtype, device=scores.device).scatter_add_(0, group, scores)  # (G,)
        mean = total / count  # (G,)
        sq_dev = torch.zeros(G, dtype=scores.dtype, device=scores.device).scatter_add_(0, group, (scores - mean[group]) ** 2)
        std = torch.sqrt(sq_dev / (count - 1).clamp(min=1))  # (G,) unbiased
        singleton = count == 1
        mean = torch.where(singleton, torch.zeros_like(mean), mean)
        std = torch.where(singleton, torch.ones_like(std), std)
        centred = scores - mean[group]  # (B,)
        normalised = centred / (std[group] + epsilon) if norm_adv_by_std_in_grpo else centred
        advantages = normalised.unsqueeze(-1) * response_mask  # (B, 1) * (B, T) -> (B, T)
    return advantages, advantages



@register_adv_est(AdvEstimator.rloo, group=True)
def compute_rloo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Hashable] | torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO (Ahmadian et al. 2024, arXiv:2402.14740): each sample's score less the mean score of the other
    samples of its prompt.

    token_level_rewards, response_mask: (B, T); index: (B,) -> advantages = returns: (B, T).

        A_i = s_i - (sum_g s - s_i) / (n_g - 1) = n_g / (n_g - 1) * (s_i - mean_g s)

    A group of one keeps its score (verl's convention).
    """
    import torch

    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)  # (B,)
        group, count = group_ids(index, scores.shape[0], device=scores.device)  # (B,), (G,)
        n = count.to(scores.dtype)[group]  # (B,) the size of each row's group
        total = torch.zeros(count.shape[0], dtype=scores.dtype, device=scores.device).scatter_add_(0, group, scores)
        loo = torch.where(n > 1, (n * scores - total[group]) / (n - 1).clamp(min=1), scores)  # (B,)
        advantages = loo.unsqueeze(-1) * response_mask  # (B, T)
    return advantages, advantages


@register_adv_est(AdvEstimator.reinforce_plus_plus)
def compute_reinforce_plus_plus_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ (Hu 2025, arXiv:2501.03262): the discounted return of each token, whitened over the batch.

    token_level_rewards, response_mask: (B, T) -> advantages, returns: (B, T).

        G_t = r_t + gamma * G_{t+1}   (over response tokens; a masked position passes G on unchanged)
        A   = whiten(G) over the masked tokens of the whole batch, 0 on padding
    """
    import torch

    from worker.ppo.core_algos import masked_whiten

    with torch.no_grad():
        mask = response_mask.to(token_level_rewards.dtype)
        returns = torch.zeros_like(token_level_rewards)  # (B, T)
        running = torch.zeros_like(token_level_rewards[:, 0])  # (B,)
        for t in reversed(range(token_level_rewards.shape[1])):
            new = token_level_rewards[:, t] + gamma * running  # (B,)
            returns[:, t] = new * mask[:, t]
            running = new * mask[:, t] + running * (1 - mask[:, t])
        advantages = masked_whiten(returns, mask) * mask  # (B, T)
    return advantages, returns


@register_adv_est(AdvEstimator.reinforce_plus_plus_baseline, group=True)
def compute_reinforce_plus_plus_baseline_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Hashable] | torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ with a baseline (Hu 2025, arXiv:2501.03262): each sample's score less its prompt's mean
    score, broadcast over its tokens and whitened over the batch.

    token_level_rewards, response_mask: (B, T); index: (B,) -> advantages = returns: (B, T).

        A_i = whiten(s_i - mean_g s) over the masked tokens of the whole batch, 0 on padding

    A group of one has mean 0 (verl's convention).
    """
    import torch

    from worker.ppo.core_algos import masked_whiten

    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)  # (B,)
        group, count = group_ids(index, scores.shape[0], device=scores.device)  # (B,), (G,)
        n = count.to(scores.dtype)
        mean = torch.zeros_like(n).scatter_add_(0, group, scores) / n  # (G,)
        mean = torch.where(n > 1, mean, torch.zeros_like(mean))
        mask = response_mask.to(scores.dtype)
        centred = (scores - mean[group]).unsqueeze(-1) * mask  # (B, T)
        advantages = masked_whiten(centred, mask) * mask  # (B, T)
    return advantages, advantages


@register_adv_est(AdvEstimator.opo, group=True)
def compute_opo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Hashable] | torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """OPO (Hao et al. 2025, arXiv:2505.23585): each sample's score less its prompt's length-weighted mean
    score, the optimal baseline of an on-policy sequence-level gradient.

    token_level_rewards, response_mask: (B, T); index: (B,) -> advantages = returns: (B, T).

        b_g = sum_{j in g} |y_j| s_j / sum_{j in g} |y_j|;   A_i = s_i - b_g   (|y| the response length)

    A group of one has baseline 0 (verl's convention).
    """
    import torch

    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)  # (B,)
        lengths = response_mask.to(scores.dtype).sum(dim=-1)  # (B,)
        group, count = group_ids(index, scores.shape[0], device=scores.device)  # (B,), (G,)
        G = count.shape[0]
        weighted = torch.zeros(G, dtype=scores.dtype, device=scores.device).scatter_add_(0, group, lengths * scores)
        total_length = torch.zeros(G, dtype=scores.dtype, device=scores.device).scatter_add_(0, group, lengths)
        baseline = torch.where(count > 1, weighted / total_length, torch.zeros_like(weighted))  # (G,)
        advantages = (scores - baseline[group]).unsqueeze(-1) * response_mask  # (B, T)
    return advantages, advantages


@register_adv_est(AdvEstimator.gpg, group=True)
def compute_gpg_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Hashable] | torch.Tensor,
    f_norm: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GPG (Chu et al. 2025, arXiv:2504.02546): each sample's score less its prompt's mean, scaled up by the
    share of the batch whose score is non-zero (rows with a zero score carry no gradient).

    token_level_rewards, response_mask: (B, T); index: (B,) -> advantages = returns: (B, T).

        alpha = B / max(#{i: s_i != 0}, 1);   A_i = alpha * (s_i - mean_g s) / f_norm

    A group of one has mean 0 (verl's convention); verl's ``f_norm`` is 1.
    """
    import torch

    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)  # (B,)
        alpha = scores.shape[0] / torch.count_nonzero(scores).clamp(min=1)  # 0-d
        group, count = group_ids(index, scores.shape[0], device=scores.device)  # (B,), (G,)
        n = count.to(scores.dtype)
        mean = torch.zeros_like(n).scatter_add_(0, group, scores) / n  # (G,)
        mean = torch.where(n > 1, mean, torch.zeros_like(mean))
        advantages = (alpha * (scores - mean[group]) / f_norm).unsqueeze(-1) * response_mask  # (B, T)
    return advantages, advantages


@register_adv_est(AdvEstimator.remax, baseline=True)
def compute_remax_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    reward_baselines: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax (Li et al. 2023, arXiv:2310.10505): the return-to-go of each token less the score of a greedy
    rollout of the same prompt (the engine generates it: ``worker.engine.step.PPOStep.greedy_baseline``).

    token_level_rewards, response_mask: (B, T); reward_baselines: (B,) -> advantages, returns: (B, T).

        G_t = sum_{t' >= t} r_{t'} m_{t'};   A_t = G_t - b m_t   (no discount, no whitening)
    """
    import torch

    with torch.no_grad():
        returns = (token_level_rewards * response_mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])  # (B, T)
        advantages = returns - reward_baselines.unsqueeze(-1) * response_mask  # (B, T)
    return advantages, returns

def group_ids(index: Sequence[Hashable] | torch.Tensor, rows: int, *, device: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Arbitrary hashable group labels (B,) -> dense integer ids (B,) in order of first appearance, and the
    size of each group (G,). ``rows`` is B: an index of another length is refused."""
    import torch

    if len(index) != rows:
        raise ValueError(f"index has {len(index)} group ids for {rows} rows; give one group id per row")
    labels = index.tolist() if isinstance(index, torch.Tensor) else list(index)
    dense: dict[Any, int] = {}
    ids = torch.tensor([dense.setdefault(label, len(dense)) for label in labels], dtype=torch.long, device=device)
    return ids, torch.bincount(ids, minlength=len(dense))
