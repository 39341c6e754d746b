"""The trial's numerical parity check: every implementation loaded from the SAME weights in the same
dtype (eager included) runs the same mixed-length batch left-padded and packed into one row (verl's
``use_remove_padding``); the largest absolute logit difference from eager's padded logits over the real
positions, with the tolerance that dtype allows, and the tokens/s of a forward in each layout.

A module of its own because it runs where the models can be loaded: on a rank of the engine
(``RankWorker.parity_check``, on the device Ray gave that rank), never in the app's process; ``run_trial``
calls it in-process only for the CLI and the tests. torch is imported inside the functions.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
    """Per implementation the max absolute logit difference from eager over both cases (padded and packed),
    or ``"Type: message"`` when it could not load; in ``dtype``, with the tolerance that applies there.
    ``packed``: the packed case's difference alone; ``speed``: tokens/s of a forward per case."""

    differences: dict[str, float | str]
    dtype: str
    tolerance: float
    packed: dict[str, float] = field(default_factory=dict)
    speed: dict[str, dict[str, float]] = field(default_factory=dict)  # impl -> {"padded": t/s, "packed": t/s}


def packed_inputs(ids, mask):
    """A left-padded (B, T) batch -> (input_ids (1, K), position_ids (1, K)) of its K real tokens packed in
    one row, positions restarting at 0 per row: what ``use_remove_padding`` gives the model."""
    import torch

    valid = mask.bool()
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # (B, T)
    return ids[valid][None], positions[valid][None].to(torch.long)


def _timed(forward: Callable[[], Any], repeats: int = 3) -> tuple[Any, float]:
    """(the last result, the median seconds of ``repeats`` calls after one warm-up)."""
    import time

    out = forward()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = forward()
        times.append(time.perf_counter() - start)
    return out, statistics.median(times)


def parity_check(folder: Path | str, implementations: Sequence[str], *, device: str = "cpu", dtype: str = "float32",
                 batch: int = 4, length: int = 32, seed: int = 0) -> Parity:
    """Max absolute logit difference from eager's padded logits on the same weights and mixed-length batch,
    padded and packed (``packed_inputs``), every model (eager too) loaded in ``dtype`` (a torch dtype name),
    over the real positions; and the tokens/s of a forward in each case."""
    import torch

    from worker.engine import models

    def logits(impl: str) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        config = models.build_config(folder, {}, impl)  # fresh per attempt: a failed load mutates its config
        model = models.load_causal_lm(folder, config, dtype=getattr(torch, dtype)).to(device).eval()
        ids, mask = (t.to(device) for t in parity_batch(config.vocab_size, batch=batch, length=length, seed=seed))
        packed_ids, positions = packed_inputs(ids, mask)
        tokens = int(mask.sum())
        with torch.no_grad():
            padded, padded_s = _timed(lambda: model(input_ids=ids, attention_mask=mask, use_cache=False).logits)  # (B, T, V)
            # use_cache=False as the engine trains: with a cache transformers skips the packed-sequence mask
            packed, packed_s = _timed(lambda: model(input_ids=packed_ids, position_ids=positions,
                                                    use_cache=False).logits)  # (1, K, V)
        speed = {"padded": tokens / padded_s, "packed": tokens / packed_s}
        return padded.float()[mask.bool()].cpu(), packed.float()[0].cpu(), speed  # (real tokens, V) each

    reference, reference_packed, reference_speed = logits(PARITY_REFERENCE)
    out: dict[str, float | str] = {}
    packed: dict[str, float] = {}
    speed: dict[str, dict[str, float]] = {}
    for impl in dict.fromkeys(implementations):
        try:
            padded_logits, packed_logits, speed[impl] = ((reference, reference_packed, reference_speed)
                                                         if impl == PARITY_REFERENCE else logits(impl))
        except Exception as exc:
            out[impl] = f"{type(exc).__name__}: {exc}"
            continue
        packed[impl] = float((packed_logits - reference).abs().max())
        out[impl] = max(float((padded_logits - reference).abs().max()), packed[impl])
    return Parity(out, dtype, parity_tolerance(dtype, float(reference.abs().max())), packed, speed)
