"""Ulysses sequence parallelism (DeepSpeed-Ulysses, as verl runs it) for Hugging Face decoder models.

Each rank of a sequence-parallel (SP) group holds ``T / sp`` tokens of every sequence. Everything but
attention is per token, so it runs on the local shard as is. Around attention, an all-to-all turns the
sequence-sharded query/key/value ``(B, nh, T/sp, hd)`` into head-sharded ``(B, nh/sp, T, hd)``: each
rank then attends over the whole sequence for ``nh/sp`` heads, and a second all-to-all brings the output
back to sequence-sharded ``(B, T/sp, nh, hd)``.

How it plugs into transformers: ``register_ulysses(impl)`` registers ``ulysses_<impl>`` in the
``AttentionInterface`` (and ``<impl>``'s mask builder under the same name); a model loaded with that name calls it for every
layer. Outside a
``ulysses_context(...)`` block it passes straight through to ``<impl>`` (so rollout generation and
single-rank use are unaffected). Inside the block it does the all-to-alls and builds the attention mask
from the *global* padding mask, because the model only sees its local shard and would build a local
causal mask. RoPE needs global positions: callers slice global ``position_ids`` with ``shard_sequence``.
"""

from __future__ import annotations

import contextvars
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from worker.attention import messages
from worker.core.implementations import ULYSSES_BASES

PREFIX = "ulysses_"
"""``ulysses_<impl>``: the attention implementation name a Ulysses-wrapped model is loaded with."""


@dataclass(frozen=True)
class UlyssesState:
    """What the attention wrapper needs to know during one sharded forward."""

    group: dist.ProcessGroup
    sp: int
    attention_mask: torch.Tensor  # (B, T) global padding mask, 1 = real token, T a multiple of sp


_STATE: contextvars.ContextVar[UlyssesState | None] = contextvars.ContextVar("attnboard_ulysses", default=None)


@contextmanager
def ulysses_context(group: dist.ProcessGroup, attention_mask: torch.Tensor) -> Iterator[UlyssesState]:
    """Inside this block, ``ulysses_*`` attention does the all-to-alls over ``group``."""
    sp = dist.get_world_size(group)
    t = attention_mask.shape[1]
    assert t % sp == 0, f"global sequence length {t} must be a multiple of the sequence-parallel size {sp}"
    token = _STATE.set(UlyssesState(group, sp, attention_mask))
    try:
        yield _STATE.get()
    finally:
        _STATE.reset(token)


# ---------------------------------------------------------------------------------------------
# All-to-all with autograd


class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` on dim 0 split evenly; its gradient is the same exchange in reverse."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        return _all_to_all(x, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _all_to_all(grad, ctx.group), None


def _all_to_all(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    # Both buffers must be dense row-major: the collective reads and writes raw memory, and
    # empty_like of a permuted gradient would keep its permuted strides.
    x = x.contiguous()
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    dist.all_to_all_single(out, x, group=group)
    return out


def seq_to_head(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """(B, n, T/sp, hd) sequence-sharded -> (B, n/sp, T, hd) head-sharded."""
    return qkv_seq_to_head([x], group)[0]


def qkv_seq_to_head(tensors: list[torch.Tensor], group: dist.ProcessGroup) -> list[torch.Tensor]:
    """Several (B, n_i, T/sp, hd) sequence-sharded tensors -> (B, n_i/sp, T, hd) each, in ONE all-to-all.

    One collective for query, key and value keeps the backward's collectives in the same order on
    every rank (separate exchanges of same-shaped key and value could pair up crosswise).
    """
    sp = dist.get_world_size(group)
    b, _, tl, hd = tensors[0].shape
    heads = [t.shape[1] for t in tensors]
    for n in heads:
        assert n % sp == 0, f"cannot shard {n} heads across a sequence-parallel group of {sp}"
    # (B, sp, n_i/sp, T/sp, hd) each: head chunk j goes to rank j; joined on the per-rank head dim
    # (B, sp, N/sp, T/sp, hd) per tensor, concatenated along the heads
    x = torch.cat([t.reshape(b, sp, n // sp, tl, hd) for t, n in zip(tensors, heads, strict=True)], dim=2)
    x = x.permute(1, 0, 2, 3, 4).contiguous()  # (sp, B, N/sp, T/sp, hd)
    x = _AllToAll.apply(x, group)  # (sp, B, N/sp, T/sp, hd): now chunk i holds sequence chunk i
    x = x.permute(1, 2, 0, 3, 4)  # (B, N/sp, sp, T/sp, hd)
    x = x.reshape(b, sum(heads) // sp, sp * tl, hd)  # (B, N/sp, T, hd)
    return list(torch.split(x, [n // sp for n in heads], dim=1))  # (B, n_i/sp, T, hd) each


def head_to_seq(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """(B, T, n/sp, hd) head-sharded attention output -> (B, T/sp, n, hd) sequence-sharded."""
    sp = dist.get_world_size(group)
    b, t, nl, hd = x.shape
    assert t % sp == 0, f"sequence length {t} is not a multiple of the sequence-parallel size {sp}"
    x = x.reshape(b, sp, t // sp, nl, hd)  # (B, sp, T/sp, n/sp, hd): sequence chunk i goes to rank i
    x = x.permute(1, 0, 2, 3, 4).contiguous()  # (sp, B, T/sp, n/sp, hd)
    x = _AllToAll.apply(x, group)  # (sp, B, T/sp, n/sp, hd): now chunk j holds head chunk j
    x = x.permute(1, 2, 0, 3, 4)  # (B, T/sp, sp, n/sp, hd)
    return x.reshape(b, t // sp, sp * nl, hd)  # (B, T/sp, n, hd)


class _GatherSeq(torch.autograd.Function):
    """All-gather along the last dim (sequence); the backward keeps this rank's slice, scaled by sp.

    Every rank of the SP group computes the same loss from the gathered tensor, and FSDP averages
    gradients over all world ranks, i.e. over sp copies of each data-parallel shard: scaling by sp
    restores the data-parallel mean (verl's ``gather_outputs_and_unpad(..., grad_scaler=True)``).
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        sp = dist.get_world_size(group)
        ctx.group, ctx.sp, ctx.rank, ctx.local = group, sp, dist.get_rank(group), x.shape[-1]
        parts = [torch.empty_like(x) for _ in range(sp)]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=-1)  # (..., T)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        start = ctx.rank * ctx.local
        return grad[..., start : start + ctx.local] * ctx.sp, None  # (..., T/sp)


def gather_sequence(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """(..., T/sp) per rank -> (..., T) on every rank of the SP group, differentiable."""
    return _GatherSeq.apply(x, group)


# ---------------------------------------------------------------------------------------------
# Padding and slicing


def pad_to_multiple(tensor: torch.Tensor, multiple: int, value: int | float) -> torch.Tensor:
    """(B, T) -> (B, ceil(T / multiple) * multiple), padded on the right with ``value``."""
    t = tensor.shape[1]
    extra = (-t) % multiple
    if not extra:
        return tensor
    pad = torch.full((tensor.shape[0], extra), value, dtype=tensor.dtype, device=tensor.device)
    return torch.cat([tensor, pad], dim=1)  # (B, T + extra)


def shard_sequence(tensor: torch.Tensor, sp_rank: int, sp: int) -> torch.Tensor:
    """(B, T, ...) -> (B, T/sp, ...): this rank's contiguous chunk of the sequence."""
    t = tensor.shape[1]
    assert t % sp == 0, f"sequence length {t} is not a multiple of the sequence-parallel size {sp}"
    chunk = t // sp
    return tensor[:, sp_rank * chunk : (sp_rank + 1) * chunk]


def global_attention_bias(attention_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(B, T) padding mask -> (B, 1, T, T) additive causal + key-padding bias.

    Masked entries get the dtype's minimum, not -inf, so a query with no visible key (a left-padding
    position) gets a uniform softmax instead of NaN; such positions are outside every loss mask.
    """
    b, t = attention_mask.shape
    causal = torch.ones(t, t, dtype=torch.bool, device=attention_mask.device).tril()  # (T, T)
    visible = causal[None, :, :] & attention_mask.bool()[:, None, :]  # (B, T, T): query row, key column
    bias = torch.zeros(b, 1, t, t, dtype=dtype, device=attention_mask.device)  # (B, 1, T, T)
    return bias.masked_fill(~visible[:, None, :, :], torch.finfo(dtype).min)


# ---------------------------------------------------------------------------------------------
# The attention function


def _base_function(impl: str, module: torch.nn.Module) -> Callable:
    """The kernel the wrapper calls, looked up at call time (so attention observation counts it)."""
    if impl == "eager":
        return sys.modules[type(module).__module__].eager_attention_forward
    return ALL_ATTENTION_FUNCTIONS[impl]


def _make_ulysses(impl: str) -> Callable:
    def ulysses_attention(module, query, key, value, attention_mask, **kwargs):
        state = _STATE.get()
        base = _base_function(impl, module)
        if state is None:
            return base(module, query, key, value, attention_mask, **kwargs)
        group = state.group
        q, k, v = qkv_seq_to_head([query, key, value], group)  # (B, nh/sp, T, hd), (B, nkv/sp, T, hd) x 2
        bias = global_attention_bias(state.attention_mask, q.dtype)  # (B, 1, T, T)
        kwargs.pop("is_causal", None)
        out, weights = base(module, q, k, v, bias, **kwargs)  # out: (B, T, nh/sp, hd)
        return head_to_seq(out, group), weights  # (B, T/sp, nh, hd)

    ulysses_attention.__name__ = f"{PREFIX}{impl}"
    return ulysses_attention




def register_ulysses(impl: str) -> str:
    """Register ``ulysses_<impl>`` in transformers' AttentionInterface (idempotent) and return the name."""
    if impl not in ULYSSES_BASES:
        raise ValueError(messages.ulysses_kernel(impl))
    name = f"{PREFIX}{impl}"
    if name not in AttentionInterface._global_mapping:
        AttentionInterface.register(name, _make_ulysses(impl))
        # Outside a ulysses_context the wrapper passes through, so the model must build <impl>'s mask.
        AttentionMaskInterface.register(name, AttentionMaskInterface._global_mapping[impl])
    return name


def base_of(name: str) -> str:
    """``ulysses_sdpa`` -> ``sdpa``; any other name is itself."""
    return name[len(PREFIX):] if name.startswith(PREFIX) else name
