"""Names the spec, the PPO math and the model readers share, free of pydantic so that the engine's rank
code and the PPO math import without it (the device check runs where only torch and transformers are
installed).

``worker.spec`` re-exports them; the spec's sections validate against these enums.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class AdvEstimator(str, Enum):
    """verl 0.9.1's advantage estimators (``verl.trainer.ppo.core_algos.AdvantageEstimator``), all accepted in
    a spec; attnboard's engine runs those registered in ``worker.ppo.advantage`` (``engine_issues`` refuses the rest)."""

    gae = "gae"
    grpo = "grpo"
    reinforce_plus_plus = "reinforce_plus_plus"
    reinforce_plus_plus_baseline = "reinforce_plus_plus_baseline"
    remax = "remax"
    rloo = "rloo"
    opo = "opo"
    grpo_passk = "grpo_passk"
    gpg = "gpg"
    rloo_vectorized = "rloo_vectorized"
    grpo_vectorized = "grpo_vectorized"
    optimal_token_baseline = "optimal_token_baseline"
    tir_optimal_token_baseline = "tir_optimal_token_baseline"
    gdpo = "gdpo"


class KLType(str, Enum):
    """KL estimators as verl 0.9.1's ``kl_penalty`` reads ``algorithm.kl_penalty`` / ``actor.kl_loss_type``;
    see http://joschu.net/blog/kl-approx.html. ``k1``/``k2``/``k3`` are other names of ``kl``/``mse``/
    ``low_var_kl``; a trailing ``+`` keeps the forward value and takes k2's gradient (straight through)."""

    kl = "kl"
    abs = "abs"
    mse = "mse"
    low_var_kl = "low_var_kl"
    full = "full"
    k1 = "k1"
    k2 = "k2"
    k3 = "k3"
    kl_st = "kl+"
    abs_st = "abs+"
    mse_st = "mse+"
    low_var_kl_st = "low_var_kl+"
    full_st = "full+"
    k1_st = "k1+"
    k2_st = "k2+"
    k3_st = "k3+"


@dataclass(frozen=True)
class ModelInfo:
    """What the validation needs to know about a model; read from its config by the caller (I/O edge)."""

    architecture: str
    num_attention_heads: int
    num_key_value_heads: int
    hidden_size: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def head_dim(self) -> int | None:
        """The largest attention head dimension: config.json's ``head_dim`` (and ``global_head_dim``, Gemma-4's
        global layers), else hidden_size / num_attention_heads; None when neither is known."""
        given = [int(v) for v in (self.extra.get("head_dim"), self.extra.get("global_head_dim")) if isinstance(v, int)]
        if given:
            return max(given)
        return self.hidden_size // self.num_attention_heads if self.hidden_size and self.num_attention_heads else None

    @property
    def gqa(self) -> bool:
        """Grouped-query attention: fewer key/value heads than query heads."""
        return self.num_key_value_heads < self.num_attention_heads
