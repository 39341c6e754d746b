"""The trial's numerical parity check: every implementation loaded from the SAME weights in the same
dtype (eager included) runs the same left-padded batch; the largest absolute logit difference from eager
over the real positions, with the tolerance that dtype allows.

A module of its own because it runs where the models can be loaded: on a rank of the engine
(``RankWorker.parity_check``, on the device Ray gave that rank), never in the app's process; ``run_trial``
calls it in-process only for the CLI and the tests. torch is imported inside the functions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from worker.core.implementations import Impl

PARITY_REFERENCE = Impl.eager.value
TOLERANCE_FP32 = 1e-4
"""Max absolute logit difference from eager accepted in fp32 (observed on the tiny models: < 1e-6)."""
PARITY_ULPS = 32
"""In bf16/fp16, differences up to this many units of the dtype's precision at the logits' scale are
rounding (two kernels sum in another order; the tiny models differ by 1 ulp), while a broken kernel (a
mask ignored, heads mixed up) is off by the order of the logits themselves."""
EPSILON: dict[str, float] = {"float32": 2.0**-23, "bfloat16": 2.0**-7, "float16": 2.0**-10}
"""``torch.finfo(dtype).eps`` of the compute dtypes a spec can name."""


def parity_batch(vocab_size: int, *, batch: int = 4, length: int = 32, seed: int = 0):
    """A fixed batch: ``(input_ids, attention_mask)``, rows left-padded by 0, 3, 6, ... tokens as in rollout."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, max(vocab_size, 5), (batch, length), generator=gen)  # (B, T), no special ids
    mask = torch.ones(batch, length, dtype=torch.long)  # (B, T)
    for row in range(batch):
        pad = min(3 * row, length - 1)
        mask[row, :pad] = 0
        ids[row, :pad] = 0
    return ids, mask


def parity_tolerance(dtype: str, scale: float) -> float:
    """The largest logit difference from eager that counts as rounding: ``TOLERANCE_FP32`` in fp32, else
    ``PARITY_ULPS`` ulps of ``dtype`` at ``scale`` (the reference's largest absolute logit, at least 1)."""
    if dtype == "float32":
        return TOLERANCE_FP32
    return PARITY_ULPS * EPSILON[dtype] * max(1.0, scale)


@dataclass(frozen=True)
class Parity:
    """Per implementation the max absolute logit difference from eager, or ``"Type: message"`` when it
    could not load; in ``dtype``, with the tolerance that applies there."""

    differences: dict[str, float | str]
    dtype: str
    tolerance: float


def parity_check(folder: Path | str, implementations: Sequence[str], *, device: str = "cpu", dtype: str = "float32",
                 batch: int = 4, length: int = 32, seed: int = 0) -> Parity:
    """Max absolute logit difference from eager on the same weights and batch, every model (eager too)
    loaded in ``dtype`` (a torch dtype name), over the real (unpadded) positions."""
    import torch

    from worker.engine import models

    def logits(impl: str) -> torch.Tensor:
        config = models.build_config(folder, {}, impl)  # fresh per attempt: a failed load mutates its config
        model = models.load_causal_lm(folder, config, dtype=getattr(torch, dtype)).to(device).eval()
        ids, mask = parity_batch(config.vocab_size, batch=batch, length=length, seed=seed)
        with torch.no_grad():
            out = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits.float()  # (B, T, V)
        return out[mask.to(device).bool()].cpu()  # (real tokens, V)

    reference = logits(PARITY_REFERENCE)
    out: dict[str, float | str] = {}
    for impl in dict.fromkeys(implementations):
        if impl == PARITY_REFERENCE:
            out[impl] = 0.0
            continue
        try:
            out[impl] = float((logits(impl) - reference).abs().max())
        except Exception as exc:
            out[impl] = f"{type(exc).__name__}: {exc}"
    return Parity(out, dtype, parity_tolerance(dtype, float(reference.abs().max())))
