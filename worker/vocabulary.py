"""Names the spec and the PPO math share, free of pydantic so that the engine's rank code and the PPO math
import without it (the device check runs where only torch and transformers are installed).

``worker.spec`` re-exports them; the spec's sections validate against these enums.
"""

from __future__ import annotations

from enum import Enum


class AdvEstimator(str, Enum):
    gae = "gae"
    grpo = "grpo"


class KLType(str, Enum):
    """KL estimators (verl ``kl_penalty`` / ``kl_loss_type``); see http://joschu.net/blog/kl-approx.html."""

    kl = "kl"
    abs = "abs"
    mse = "mse"
    low_var_kl = "low_var_kl"
