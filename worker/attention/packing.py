"""What verl's ``model.use_remove_padding`` does to the cost of each attention implementation (pure): one
sentence per (implementation, setting), the preview's ``remove-padding-cost`` reason and the trial's note.

With remove-padding, a micro-batch of N rows padded to L becomes one row of its T real tokens with
``position_ids`` restarting at every sequence and no attention mask (``worker.engine.compute.Packed``):

- FlashAttention (2/3/4, and hub FlashAttention kernels) runs the row as varlen, one causal block per
  sequence: attention work grows with the sum of each sequence's length squared, and no padding is
  computed anywhere (verl's point of the option).
- sdpa and eager see one long sequence; transformers (5.x ``masking_utils.find_packed_sequence_indices``)
  infers a block-diagonal causal mask from ``position_ids``, a (T, T) mask: every pair of the T tokens is
  scored and most are masked away, so attention work and mask memory grow with T squared, and on CUDA an
  explicit mask keeps sdpa off its flash backend (efficient or math run). Eager also materialises the
  (heads, T, T) scores.
- flex_attention builds a block mask from the same ``position_ids`` and skips the empty blocks: close
  to varlen's cost.

Padded rows instead cost N x L squared in attention and compute every padding token in every layer.
"""

from __future__ import annotations

from worker.core.implementations import base_impl

VARLEN = ("flash_attention_2", "flash_attention_3", "flash_attention_4")


def family(impl: str) -> str:
    """``varlen`` | ``flex`` | ``dense-mask`` (sdpa, eager) for an implementation name."""
    base = base_impl(impl)
    if base in VARLEN or "flash" in base.split("/")[-1]:
        return "varlen"
    if base == "flex_attention":
        return "flex"
    return "dense-mask"


def remove_padding_cost(impl: str, *, remove_padding: bool, sp: int = 1) -> str:
    """The cost sentence for ``impl`` under ``use_remove_padding=remove_padding`` at Ulysses size ``sp``.

    >>> remove_padding_cost("sdpa", remove_padding=False)[:60]
    'use_remove_padding=false: padded rows, attention work grows '
    """
    if not remove_padding:
        return ("use_remove_padding=false: padded rows, attention work grows with rows x padded length squared and "
                "every padding token runs through every layer.")
    if sp > 1:
        return (f"use_remove_padding=true with Ulysses size {sp}: attnboard shards the padded rows along the sequence "
                f"(packing is its sp = 1 path), so {impl} costs as on padded rows.")
    kind = family(impl)
    if kind == "varlen":
        return (f"use_remove_padding=true: each micro-batch runs as one row of its real tokens; {impl} runs it as "
                f"varlen, one causal block per sequence: attention work grows with the sum of each sequence's length "
                f"squared and no padding is computed (the cheapest path).")
    if kind == "flex":
        return (f"use_remove_padding=true: each micro-batch runs as one row of its real tokens; {impl} builds a block "
                f"mask from position_ids and skips the empty blocks: close to varlen's cost.")
    extra = " and materialises the (heads, T, T) scores" if base_impl(impl) == "eager" else (
        "; on CUDA the explicit mask keeps sdpa off its flash backend")
    return (f"use_remove_padding=true: each micro-batch runs as one row of its T real tokens; {impl} sees one long "
            f"sequence with a (T, T) block-diagonal mask transformers infers from position_ids: attention work and "
            f"mask memory grow with T squared (most pairs scored, then masked){extra}. It still skips the padding "
            f"in the MLPs and the output layer; whether it beats padded rows depends on how much padding there is.")
