"""The tensor work of one rank: sampling with a KV cache, log-probs and values over a batch (with or
without Ulysses sequence parallelism), and the PPO updates of the actor and the critic.

Batch layout (``N`` rows, prompt length ``P`` left-padded, response length ``R`` right-padded):

    input_ids, attention_mask, position_ids   (N, P + R)
    responses, response_mask                   (N, R)
    old_log_probs, ref_log_prob, values, advantages, returns, rollout_log_probs   (N, R)

The log-prob of response token ``j`` is read at position ``P - 1 + j`` (the logits there predict it).

Precision, as verl's FSDP engine runs it: the model's forward (and so its backward) runs in the role's
compute dtype (``compute_dtype``; FSDP's ``param_dtype`` casts the weights, ``autocast`` the forward,
as verl's ``forward_step`` and HF rollout do), and everything after the logits is fp32: logits are
upcast (``logits.float()``) before log-probs, entropy and values, so the PPO losses are fp32 too.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule

from worker.engine import ulysses
from worker.ppo import core_algos as ppo_math

# ---------------------------------------------------------------------------------------------
# Precision

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
"""The torch dtype names a role's precision is given in (``RunSpec.precision``) -> the dtypes."""


def dtype_of(name: str) -> torch.dtype:
    """``"bfloat16"`` -> ``torch.bfloat16``; ValueError naming the valid names otherwise."""
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"dtype {name!r} is not a compute or weight dtype; valid: {', '.join(DTYPES)}") from None


def autocast(device_type: str, compute_dtype: str) -> AbstractContextManager:
    """verl's ``forward_step``: ``torch.autocast`` to the compute dtype around a forward; nothing in fp32
    ("autocast is a no-op at best and a footgun at worst")."""
    dtype = dtype_of(compute_dtype)
    if dtype == torch.float32:
        return nullcontext()
    return torch.autocast(device_type=device_type, dtype=dtype)


def grad_scaler(compute_dtype: str, device_type: str):
    """fp16 training needs loss scaling against gradient underflow (verl: ``ShardedGradScaler`` for fp16
    only; bf16 and fp32 need none) -> a scaler, or None."""
    if dtype_of(compute_dtype) != torch.float16:
        return None
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    return ShardedGradScaler(device=device_type, growth_interval=400)


# ---------------------------------------------------------------------------------------------
# Sampling


def sample_next(logits: torch.Tensor, *, temperature: float, top_p: float, do_sample: bool,
                generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """logits (N, V) -> (token (N,), its log-prob (N,) under the temperature-scaled distribution)."""
    if not do_sample or temperature == 0:
        logp = torch.log_softmax(logits, dim=-1)  # (N, V)
        token = logits.argmax(dim=-1)  # (N,)
        return token, logp.gather(-1, token[:, None]).squeeze(-1)
    logits = logits / temperature  # (N, V)
    logp = torch.log_softmax(logits, dim=-1)  # (N, V)
    probs = logp.exp()
    if top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)  # (N, V)
        cumulative = sorted_probs.cumsum(dim=-1)  # (N, V)
        # keep the smallest prefix whose mass reaches top_p (the first token always stays)
        drop_sorted = (cumulative - sorted_probs) >= top_p  # (N, V)
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)  # (N, V) back in vocabulary order
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    token = torch.multinomial(probs, 1, generator=generator).squeeze(-1)  # (N,)
    return token, logp.gather(-1, token[:, None]).squeeze(-1)


def fsdp2_units(model: torch.nn.Module) -> list[FSDPModule]:
    """The FSDP2 units of a model (each decoder layer and the root, as ``RankWorker._shard`` wraps them)."""
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


@contextmanager
def unsharded(model: torch.nn.Module) -> Iterator[None]:
    """Keep an FSDP2 model's parameters gathered across many forwards (a rollout's decode loop): one
    all-gather per unit for the whole loop instead of one per unit per generated token.

    Inside, no unit reshards after its forward; on exit every unit reshards and gets back what it had
    (a layer its ``reshard_after_forward``, the root ``fully_shard``'s default: it keeps its parameters).
    FSDP1 and unwrapped models pass through: FSDP1 forbids forwards inside ``summon_full_params``.
    """
    units = fsdp2_units(model)
    before = [(unit, unit is not model and _reshards_after_forward(unit)) for unit in units]
    for unit in units:
        unit.set_reshard_after_forward(False, recurse=False)
        unit.unshard()
    try:
        yield
    finally:
        for unit, reshards in before:
            unit.set_reshard_after_forward(reshards, recurse=False)
            unit.reshard()


def _reshards_after_forward(unit: FSDPModule) -> bool:
    """Whether an FSDP2 unit frees its gathered parameters after its forward (its ``reshard_after_forward``)."""
    return any(group.post_forward_mesh_info is not None for group in unit._get_fsdp_state()._fsdp_param_groups)


@torch.no_grad()
def generate(model: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, *,
             max_new_tokens: int, eos_token_id: int | None, pad_token_id: int, temperature: float,
             top_p: float, do_sample: bool, generator: torch.Generator | None,
             sync_group: dist.ProcessGroup | None = None, compute_dtype: str = "float32") -> dict[str, torch.Tensor]:
    """Sample responses with the model's KV cache, the forwards in ``compute_dtype`` (verl's HF rollout
    autocasts), the sampling distribution in fp32.

    prompt_ids, prompt_mask: (N, P) left-padded -> responses, response_mask, rollout_log_probs: (N, R),
    R = max_new_tokens; the EOS token is part of the response; after it the row is padding.

    An FSDP2 model is gathered once around the whole loop (``unsharded``): its decode forwards run no
    collective, so each rank stops when its own rows are finished. Under FSDP1 every forward gathers
    parameters, so every rank must run the same number of them: the loop stops only when the rows of
    every rank in ``sync_group`` are finished (one all-reduce per token, ``decodes_in_lockstep``).

    The n samples of a prompt (consecutive identical rows, ``prompt_groups``) share its prefill: the
    prompt runs once and its KV cache and last logits are copied to its n rows before the first sample.
    """
    n = prompt_ids.shape[0]
    device = prompt_ids.device
    mask = prompt_mask.clone()  # (N, P + t)
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)  # (N, P)
    world = dist.get_world_size(sync_group) if sync_group is not None else 1
    lockstep = decodes_in_lockstep(model, world)
    unique, expand = prompt_groups(prompt_ids, prompt_mask)  # (U,), (N,)
    shared = len(unique) < n
    inputs, prefill_mask, prefill_pos = ((prompt_ids[unique], mask[unique], position_ids[unique]) if shared
                                         else (prompt_ids, mask, position_ids))  # (U or N, P)
    cache: dict[str, object] = {}  # the KV cache under the name this transformers uses (see ``_cache_of``)
    tokens, logps, alive_steps = [], [], []
    alive = torch.ones(n, dtype=torch.bool, device=device)  # (N,)
    with unsharded(model):
        for step in range(max_new_tokens):
            with autocast(device.type, compute_dtype):
                out = model(input_ids=inputs, attention_mask=prefill_mask if step == 0 else mask,
                            position_ids=prefill_pos if step == 0 else position_ids, use_cache=True, **cache)
            cache = _cache_of(out)
            last = out.logits[:, -1, :]  # (U or N, V)
            if step == 0 and shared:
                next(iter(cache.values())).reorder_cache(expand)  # (U, ...) -> (N, ...): each prompt's n rows
                last = last[expand]  # (N, V)
            token, logp = sample_next(last.float(), temperature=temperature, top_p=top_p,
                                      do_sample=do_sample, generator=generator)  # (N,), (N,)
            token = torch.where(alive, token, torch.full_like(token, pad_token_id))
            tokens.append(token)
            logps.append(torch.where(alive, logp, torch.zeros_like(logp)))
            alive_steps.append(alive.clone())
            if eos_token_id is not None:
                alive = alive & (token != eos_token_id)
            remaining = torch.tensor([int(alive.any())], dtype=torch.long, device=device)  # nccl reduces on the GPU
            if lockstep:
                dist.all_reduce(remaining, group=sync_group)
            if int(remaining) == 0:
                break
            inputs = token[:, None]  # (N, 1)
            mask = torch.cat([mask, torch.ones(n, 1, dtype=mask.dtype, device=device)], dim=1)  # (N, P + t + 1)
            position_ids = position_ids[:, -1:] + 1  # (N, 1)
    steps = len(tokens)
    responses = torch.full((n, max_new_tokens), pad_token_id, dtype=prompt_ids.dtype, device=device)  # (N, R)
    response_mask = torch.zeros(n, max_new_tokens, dtype=torch.long, device=device)  # (N, R)
    rollout_log_probs = torch.zeros(n, max_new_tokens, dtype=torch.float32, device=device)  # (N, R)
    responses[:, :steps] = torch.stack(tokens, dim=1)  # (N, steps)
    response_mask[:, :steps] = torch.stack(alive_steps, dim=1).long()  # (N, steps)
    rollout_log_probs[:, :steps] = torch.stack(logps, dim=1)  # (N, steps)
    return {"responses": responses, "response_mask": response_mask, "rollout_log_probs": rollout_log_probs}


def decodes_in_lockstep(model: torch.nn.Module, world: int) -> bool:
    """Whether the ranks' decode loops must agree on every token: only for a model whose forwards are
    collectives during the rollout (FSDP1, which gathers in every forward) in a world of several ranks.
    An FSDP2 model is gathered once for the whole loop (``unsharded``) and an unwrapped one holds all
    its weights: their ranks decode on their own."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    return world > 1 and any(isinstance(m, FSDP) for m in model.modules())


def prompt_groups(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, P) prompts -> (the first row of each run of identical consecutive rows (U,), each row's run (N,)),
    so ``x[unique][expand]`` is ``x`` for any per-prompt ``x``: the n samples of a GRPO group share a prompt
    and sit next to each other (``repeat_interleave``)."""
    same = (prompt_ids[1:] == prompt_ids[:-1]).all(-1) & (prompt_mask[1:] == prompt_mask[:-1]).all(-1)  # (N - 1,)
    new = torch.cat([torch.ones(1, dtype=torch.bool, device=prompt_ids.device), ~same])  # (N,)
    return new.nonzero().squeeze(-1), new.cumsum(0) - 1


def _cache_of(out) -> dict[str, object]:
    """The KV cache a forward returned, as the keyword the next forward takes: ``cache`` in transformers
    >= 5.24 (``past_key_values`` is deprecated there), ``past_key_values`` before (5.17 on the device
    machine)."""
    name = "cache" if "cache" in out else "past_key_values"
    return {name: out[name]}


def assemble(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, responses: torch.Tensor,
             response_mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """Prompt (N, P) + response (N, R) -> input_ids, attention_mask, position_ids (N, P + R)."""
    input_ids = torch.cat([prompt_ids, responses], dim=1)  # (N, P + R)
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)  # (N, P + R)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # (N, P + R)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}


# ---------------------------------------------------------------------------------------------
# Forward over a batch


@dataclass
class SeqParallel:
    """This rank's place in its Ulysses group; ``group`` is None when sp == 1."""

    group: dist.ProcessGroup | None
    sp: int
    rank: int


NO_SP = SeqParallel(None, 1, 0)


def _forward_outputs(model: torch.nn.Module, batch: dict[str, torch.Tensor], sp: SeqParallel,
                     compute_dtype: str = "float32") -> tuple[torch.Tensor, torch.Tensor]:
    """Run the model over (N, L) padded sequences in ``compute_dtype`` -> (logits (N, L_loc, V or 1) in that
    dtype, labels (N, L_loc)), local to this SP rank when sp > 1, where L_loc = L_pad / sp and L_pad is L
    rounded up to a multiple of sp."""
    input_ids, attention_mask, position_ids = batch["input_ids"], batch["attention_mask"], batch["position_ids"]
    labels = torch.roll(input_ids, shifts=-1, dims=1)  # (N, L): the token each position predicts
    if sp.sp == 1:
        with autocast(input_ids.device.type, compute_dtype):
            out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
        return out.logits, labels
    ids = ulysses.pad_to_multiple(input_ids, sp.sp, 0)  # (N, L_pad)
    pad_mask = ulysses.pad_to_multiple(attention_mask, sp.sp, 0)  # (N, L_pad)
    pos = ulysses.pad_to_multiple(position_ids, sp.sp, 0)  # (N, L_pad)
    labels = ulysses.pad_to_multiple(labels, sp.sp, 0)  # (N, L_pad)
    ids_loc = ulysses.shard_sequence(ids, sp.rank, sp.sp)  # (N, L_pad / sp)
    pos_loc = ulysses.shard_sequence(pos, sp.rank, sp.sp)  # (N, L_pad / sp): global positions for RoPE
    with ulysses.ulysses_context(sp.group, pad_mask), autocast(input_ids.device.type, compute_dtype):
        out = model(input_ids=ids_loc, position_ids=pos_loc, use_cache=False)
    return out.logits, ulysses.shard_sequence(labels, sp.rank, sp.sp)


def _gather(x: torch.Tensor, sp: SeqParallel, length: int) -> torch.Tensor:
    """(N, L_loc) -> (N, L): whole sequences on every SP rank (differentiable), padding dropped."""
    if sp.sp == 1:
        return x
    return ulysses.gather_sequence(x, sp.group)[:, :length]  # (N, L_pad) -> (N, L)


def response_slice(x: torch.Tensor, response_length: int) -> torch.Tensor:
    """(N, P + R) per-position values -> (N, R) for the response tokens (read one position earlier)."""
    total = x.shape[1]
    return x[:, total - response_length - 1: total - 1]  # (N, R)


# ---- remove padding (verl's use_remove_padding) and the output layer over response positions only


@dataclass(frozen=True)
class Packed:
    """A micro-batch of (N, L) padded rows as one (1, T) row of its T real tokens, as verl's
    ``use_remove_padding`` runs it: ``position_ids`` restart at 0 with every sequence and there is no
    attention mask. FlashAttention runs such a row as varlen (one sequence per run of positions);
    transformers gives sdpa and eager a block-diagonal causal mask it infers from ``position_ids``
    (``masking_utils.find_packed_sequence_indices``), a (T, T) mask, so their cost grows with T^2 where
    varlen's grows with the sum of each sequence's length squared. transformers infers that mask only
    without a KV cache: every packed forward passes ``use_cache=False`` (with a cache the sequences
    would attend across each other, silently)."""

    input_ids: torch.Tensor  # (1, T)
    position_ids: torch.Tensor  # (1, T)
    index: torch.Tensor  # (N, L): each real token's place in the packed row, -1 for padding

    @classmethod
    def of(cls, batch: dict[str, torch.Tensor]) -> Packed:
        valid = batch["attention_mask"].bool()  # (N, L)
        index = torch.where(valid, valid.flatten().cumsum(0).view_as(valid) - 1, -1)  # (N, L)
        return cls(batch["input_ids"][valid][None], batch["position_ids"][valid][None], index)


def response_reads(attention_mask: torch.Tensor, response_length: int) -> torch.Tensor:
    """(N, P + R) attention mask -> (N, R) bool: response token j is read at position P - 1 + j, a real
    token whenever token j is (the response mask is a prefix of ones)."""
    return response_slice(attention_mask, response_length).bool()


def _takes_logits_to_keep(model: torch.nn.Module) -> bool:
    """Whether the (FSDP1-unwrapped) model's forward takes ``logits_to_keep`` (transformers' causal LMs do):
    the output layer then runs over the kept positions only."""
    import inspect

    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    inner = model.module if isinstance(model, FSDP) else model
    return "logits_to_keep" in inspect.signature(inner.forward).parameters


def _model_outputs(model: torch.nn.Module, batch: dict[str, torch.Tensor], compute_dtype: str, *,
                   remove_padding: bool, keep: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """sp == 1: the model's outputs at the positions that read the response tokens -> (outputs (N, R, C)
    padded, or (K, C) packed: one row per True of ``response_reads`` in row order; the reads (N, R)).

    With ``keep`` (a causal LM's output layer, C = V) only those positions go through the output layer
    (``logits_to_keep``): the prompt's positions never reach it. Otherwise (the critic's one-column head)
    every position's output is computed and the response positions are picked."""
    input_ids = batch["input_ids"]
    length, r = input_ids.shape[1], batch["responses"].shape[1]
    reads = response_reads(batch["attention_mask"], r)  # (N, R)
    if remove_padding:
        packed = Packed.of(batch)
        at = response_slice(packed.index, r)[reads]  # (K,): where each read sits in the packed row
        inputs: dict = {"input_ids": packed.input_ids, "position_ids": packed.position_ids}
    else:
        at = torch.arange(length - r - 1, length - 1, device=input_ids.device)  # (R,)
        inputs = {"input_ids": input_ids, "attention_mask": batch["attention_mask"], "position_ids": batch["position_ids"]}
    if keep:
        inputs["logits_to_keep"] = at
    with autocast(input_ids.device.type, compute_dtype):
        out = model(**inputs, use_cache=False).logits  # (N or 1, R or K or T or L, C)
    if not keep:
        out = out[:, at]
    return (out[0] if remove_padding else out), reads


def _place(values: torch.Tensor, reads: torch.Tensor, remove_padding: bool) -> torch.Tensor:
    """Per-read values -> (N, R): packed (K,) values go to their reads, 0 where a row has no token."""
    if not remove_padding:
        return values  # (N, R) already
    out = values.new_zeros(reads.shape)  # (N, R)
    out[reads] = values
    return out


def policy_forward(model: torch.nn.Module, batch: dict[str, torch.Tensor], sp: SeqParallel, *, temperature: float,
                   with_entropy: bool, compute_dtype: str = "float32", remove_padding: bool = False,
                   entropy_grad: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """-> log-probs (N, R) of the response tokens and, if asked, the entropy (N, R) of each prediction, in
    fp32 whatever the compute dtype of the forward.

    Without sequence parallelism the output layer runs over the response positions only, on padded rows
    or, with ``remove_padding``, on the micro-batch packed into one row (``Packed``). ``entropy_grad=False``
    computes the entropy outside autograd (an entropy coefficient of 0: its value is a metric, its
    backward would be wasted)."""
    length, r = batch["input_ids"].shape[1], batch["responses"].shape[1]
    if sp.sp == 1:
        logits, reads = _model_outputs(model, batch, compute_dtype, remove_padding=remove_padding,
                                       keep=_takes_logits_to_keep(model))  # (N, R, V) or (K, V)
        labels = batch["responses"][reads] if remove_padding else batch["responses"]  # (K,) or (N, R)
        logits = logits.float() / temperature  # fp32 from here on, as verl computes log-probs
        log_probs = _place(ppo_math.logprobs_from_logits(logits, labels), reads, remove_padding)  # (N, R)
        entropy = None
        if with_entropy:
            with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
                entropy = _place(ppo_math.entropy_from_logits(logits), reads, remove_padding)  # (N, R)
        return log_probs, entropy
    logits, labels = _forward_outputs(model, batch, sp, compute_dtype)  # (N, L_loc, V), (N, L_loc)
    logits = logits.float() / temperature
    logp = ppo_math.logprobs_from_logits(logits, labels)  # (N, L_loc)
    log_probs = response_slice(_gather(logp, sp, length), r)  # (N, R)
    entropy = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            ent = ppo_math.entropy_from_logits(logits)  # (N, L_loc)
        entropy = response_slice(_gather(ent, sp, length), r)  # (N, R)
    return log_probs, entropy


def value_forward(model: torch.nn.Module, batch: dict[str, torch.Tensor], sp: SeqParallel, *,
                  compute_dtype: str = "float32", remove_padding: bool = False) -> torch.Tensor:
    """Critic (token classification, 1 label) -> values (N, R) in fp32: V of the state before each response token."""
    length, r = batch["input_ids"].shape[1], batch["responses"].shape[1]
    if sp.sp == 1:
        out, reads = _model_outputs(model, batch, compute_dtype, remove_padding=remove_padding, keep=False)
        return _place(out.float().squeeze(-1), reads, remove_padding)  # (N, R)
    logits, _ = _forward_outputs(model, batch, sp, compute_dtype)  # (N, L_loc, 1)
    values = logits.float().squeeze(-1)  # (N, L_loc)
    return response_slice(_gather(values, sp, length), r)  # (N, R)


# ---------------------------------------------------------------------------------------------
# Updates


@dataclass(frozen=True)
class ActorSettings:
    ppo_epochs: int
    mini_batch: int  # rows per mini-batch on this rank
    micro_batch: int  # rows per micro-batch on this rank
    clip_ratio: float
    entropy_coeff: float
    use_kl_loss: bool
    kl_loss_coef: float
    kl_loss_type: str
    grad_clip: float
    temperature: float
    on_policy: bool = False  # verl's condition (one epoch, one mini-batch): the old log-probs are this forward's


def on_policy(*, ppo_epochs: int, rows: int, mini_batch: int, kl_in_reward: bool) -> bool:
    """verl's ``dp_actor`` condition for skipping the old-log-prob forward: one epoch of one mini-batch, so the
    update's own forward (every micro-batch runs before the one optimizer step) sees the rollout's policy and
    its log-probs, detached, are the old ones. A KL penalty in the reward needs them before the update, so it
    keeps the separate forward.

    >>> on_policy(ppo_epochs=1, rows=8, mini_batch=8, kl_in_reward=False)
    True
    >>> on_policy(ppo_epochs=2, rows=8, mini_batch=8, kl_in_reward=False)
    False
    """
    return ppo_epochs == 1 and mini_batch >= rows and not kl_in_reward


def needs_reference(*, use_kl_loss: bool, use_kl_in_reward: bool) -> bool:
    """verl's ``need_reference_policy``: the reference's log-probs are read only by a KL term, in the actor's loss
    or in the reward; without either no step runs the reference forward (the role is still loaded, so its
    attention is resolved and reported like every role's).

    >>> needs_reference(use_kl_loss=False, use_kl_in_reward=False)
    False
    >>> needs_reference(use_kl_loss=True, use_kl_in_reward=False)
    True
    """
    return use_kl_loss or use_kl_in_reward


@dataclass(frozen=True)
class CriticSettings:
    ppo_epochs: int
    mini_batch: int
    micro_batch: int
    cliprange_value: float
    grad_clip: float


def iter_minibatches(batch: dict[str, torch.Tensor], size: int):
    n = len(batch["input_ids"])
    for start in range(0, n, size):
        yield {k: (v[start:start + size] if isinstance(v, torch.Tensor) else v) for k, v in batch.items()}


def actor_loss(model: torch.nn.Module, micro: dict[str, torch.Tensor], sp: SeqParallel,
               settings: ActorSettings, *, compute_dtype: str = "float32", remove_padding: bool = False,
               seen: list[tuple[torch.Tensor, torch.Tensor]] | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """The actor's loss on one micro-batch (fp32): clipped policy loss - entropy bonus (+ KL loss). At an
    entropy coefficient of 0 the entropy is a metric only: no backward runs through it. On policy
    (``settings.on_policy``) the old log-probs are this forward's, detached (the ratio is 1, its gradient
    the policy gradient); ``seen`` collects each forward's (log-probs, entropy)."""
    log_prob, entropy = policy_forward(model, micro, sp, temperature=settings.temperature,
                                       with_entropy=True, compute_dtype=compute_dtype, remove_padding=remove_padding,
                                       entropy_grad=settings.entropy_coeff != 0)
    mask = micro["response_mask"]
    old = log_prob.detach() if settings.on_policy else micro["old_log_probs"]
    pg_loss, metrics = ppo_math.compute_policy_loss(old, log_prob, micro["advantages"], mask, settings.clip_ratio)
    if seen is not None:  # this forward's log-probs and entropy, for the step's metrics
        seen.append((log_prob.detach(), entropy.detach()))
    entropy_loss = ppo_math.agg_loss(entropy, mask)
    loss = pg_loss - settings.entropy_coeff * entropy_loss if settings.entropy_coeff != 0 else pg_loss
    metrics["actor/entropy"] = float(entropy_loss.detach())
    if settings.use_kl_loss:
        kl_loss, kl_metrics = ppo_math.compute_kl_loss(log_prob, micro["ref_log_prob"], mask, settings.kl_loss_type)
        loss = loss + settings.kl_loss_coef * kl_loss
        metrics.update(kl_metrics)
    return loss, metrics


def clip_grad(model: torch.nn.Module, max_norm: float) -> float:
    """Clip the gradient norm (FSDP1 has its own method; FSDP2 grads are DTensors) -> the norm before clipping."""
    if hasattr(model, "clip_grad_norm_"):
        norm = model.clip_grad_norm_(max_norm)
    else:
        norm = torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.grad is not None], max_norm)
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    return float(norm)


@contextmanager
def gradient_sync(model: torch.nn.Module, sync: bool) -> Iterator[None]:
    """A micro-batch's forward and backward, reducing gradients across ranks only when ``sync``.

    Gradient accumulation syncs on the last micro-batch of a mini-batch only: the earlier ones
    accumulate locally (FSDP2 ``set_requires_gradient_sync``, FSDP1 ``no_sync``) and the last
    reduce-scatters the sum once. Unwrapped models have nothing to sync.
    """
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    if isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(sync)
    if isinstance(model, FSDP) and not sync:
        with model.no_sync():
            yield
    else:
        yield


def _accumulate(mini: dict[str, torch.Tensor], micro_batch: int) -> Iterator[tuple[dict[str, torch.Tensor], bool]]:
    """-> (micro-batch, is it the mini-batch's last)."""
    micros = list(iter_minibatches(mini, micro_batch))
    for i, micro in enumerate(micros):
        yield micro, i == len(micros) - 1


def _mean_metrics(rows: list[dict[str, float]]) -> dict[str, float]:
    keys = {k for row in rows for k in row}
    return {k: sum(row[k] for row in rows if k in row) / sum(1 for row in rows if k in row) for k in sorted(keys)}


def _ppo_update(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: dict[str, torch.Tensor], *,
                loss_fn: Callable[[dict[str, torch.Tensor]], tuple[torch.Tensor, dict[str, float]]],
                ppo_epochs: int, mini_batch: int, micro_batch: int, grad_clip: float, role: str,
                scaler=None) -> dict[str, float]:
    """ppo_epochs x mini-batches (one optimizer step each) x micro-batches (gradient accumulation, reduced
    across ranks once, on the last micro-batch). ``loss_fn(micro) -> (loss, metrics)``.

    With a ``scaler`` (fp16 compute, ``grad_scaler``) the loss is scaled before backward and the gradients
    unscaled before clipping; a step whose gradients overflowed is skipped and the scale lowered."""
    model.train()
    rows: list[dict[str, float]] = []
    for _ in range(ppo_epochs):
        for mini in iter_minibatches(batch, mini_batch):
            optimizer.zero_grad(set_to_none=True)
            n_mini = len(mini["input_ids"])
            for micro, last in _accumulate(mini, micro_batch):
                with gradient_sync(model, last):
                    loss, metrics = loss_fn(micro)
                    scaled = loss * (len(micro["input_ids"]) / n_mini)
                    (scaler.scale(scaled) if scaler is not None else scaled).backward()
                rows.append(metrics)
            if scaler is not None:
                scaler.unscale_(optimizer)
            grad_norm = clip_grad(model, grad_clip)
            if scaler is not None:
                scaler.step(optimizer)  # skips the step when the unscaled gradients hold inf/NaN
                scaler.update()
            elif math.isfinite(grad_norm):
                optimizer.step()
            rows.append({f"{role}/grad_norm": grad_norm})
    return _mean_metrics(rows)


def update_actor(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: dict[str, torch.Tensor],
                 sp: SeqParallel, settings: ActorSettings, *, compute_dtype: str = "float32",
                 scaler=None, remove_padding: bool = False,
                 seen: list[tuple[torch.Tensor, torch.Tensor]] | None = None) -> dict[str, float]:
    """The actor's PPO update: clipped policy loss (+ entropy bonus, + KL loss). ``seen`` collects each
    micro-batch forward's (log-probs, entropy) in row order (on policy: the step's old log-probs)."""
    return _ppo_update(model, optimizer, batch,
                       loss_fn=lambda micro: actor_loss(model, micro, sp, settings, compute_dtype=compute_dtype,
                                                        remove_padding=remove_padding, seen=seen),
                       ppo_epochs=settings.ppo_epochs, mini_batch=settings.mini_batch,
                       micro_batch=settings.micro_batch, grad_clip=settings.grad_clip, role="actor", scaler=scaler)


def update_critic(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: dict[str, torch.Tensor],
                  sp: SeqParallel, settings: CriticSettings, *, compute_dtype: str = "float32",
                  scaler=None, remove_padding: bool = False) -> dict[str, float]:
    """The critic's PPO update: clipped value loss."""

    def value_loss(micro: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        vpreds = value_forward(model, micro, sp, compute_dtype=compute_dtype, remove_padding=remove_padding)  # (n, R)
        return ppo_math.compute_value_loss(vpreds, micro["values"], micro["returns"], micro["response_mask"],
                                           settings.cliprange_value)

    return _ppo_update(model, optimizer, batch, loss_fn=value_loss, ppo_epochs=settings.ppo_epochs,
                       mini_batch=settings.mini_batch, micro_batch=settings.micro_batch,
                       grad_clip=settings.grad_clip, role="critic", scaler=scaler)
