"""One rank of a run: a Ray actor holding this rank's shard of every role (actor/rollout, reference,
critic), colocated as verl colocates them, inside one ``torch.distributed`` process group.

The controller calls the methods; ``@register`` says how each call fans out (``worker.engine.dispatch``).
Rank workers never number events: they return payloads and the controller emits them.
"""

from __future__ import annotations

import logging
import os
import resource
import socket
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from worker.attention.availability import Context, Unavailable, unavailable
from worker.core.attention_payload import AttentionPayload
from worker.core.environment import Environment
from worker.core.roles import Role
from worker.engine import compute, models, ulysses
from worker.engine.dispatch import Dispatch, Mesh, register
from worker.engine.observe import kernel_source, observe_attention
from worker.troubleshoot.classify import ErrorInfo, classify


@dataclass
class RolePlan:
    """How one role is loaded: the implementations to try in order and the context of that choice."""

    role: str
    loader: str  # "causal_lm" | "value"
    folder: str
    override_config: dict[str, Any]
    candidates: list[str]  # tried in order; under strict, one
    requested: str
    forced: bool
    reasons: list[dict[str, str]]
    strategy: str
    sp: int
    trained: bool
    lr: float = 1e-6
    weight_decay: float = 0.01
    gradient_checkpointing: bool = False  # model.enable_gradient_checkpointing; trained roles with sp == 1
    output_attentions: bool = False  # attnboard.debug.output_attentions: the first forward must return the weights
    compute_dtype: str = "float32"  # forward/backward dtype: verl's fsdp_config.dtype (FSDP's param_dtype)
    remove_padding: bool = False  # model.use_remove_padding at sp == 1: micro-batches packed in one row (compute.Packed)
    master_dtype: str = "float32"  # master weights and optimizer state: verl's fsdp_config.model_dtype

    @property
    def weights_dtype(self) -> str:
        """The dtype the role's weights are held in. A trained role keeps master weights in ``master_dtype``
        for its optimizer; a frozen one (the reference) holds them in its compute dtype, which FSDP would
        cast them to on every forward anyway: the same numbers, and in bf16 half the memory."""
        return self.master_dtype if self.trained else self.compute_dtype


@dataclass
class LoadPlan:
    roles: list[RolePlan]
    policy: str
    env: dict[str, Any]
    seed: int


class RoleLoadError(RuntimeError):
    """No implementation of the plan could be loaded; carries every attempt for the failure event."""

    def __init__(self, role: str, attempts: list[dict[str, Any]]):
        self.role, self.attempts = role, attempts
        last = attempts[-1]
        super().__init__(f"[{role}] could not load with {last['implementation']}: {last['error']}")

    def __reduce__(self):  # crosses the Ray boundary intact (the default pickles only the message)
        return (RoleLoadError, (self.role, self.attempts))


@dataclass
class _Loaded:
    module: torch.nn.Module
    optimizer: torch.optim.Optimizer | None
    sp: compute.SeqParallel
    mesh: Mesh
    plan: RolePlan
    report: dict[str, Any] = field(default_factory=dict)
    scaler: Any = None  # fp16 compute: the loss scaler of the role's updates (compute.grad_scaler)


def cuda_index() -> int:
    """The GPU this rank drives. Ray sets ``CUDA_VISIBLE_DEVICES`` to the one GPU it gave the rank's actor,
    so that GPU is device 0; with Ray told not to (``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES``) every
    GPU is visible and the rank's is the id Ray assigned. Outside Ray (the device check): device 0."""
    if os.environ.get("RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"):
        try:
            import ray

            ids = ray.get_gpu_ids()
        except Exception:
            ids = []
        return int(ids[0]) if ids else 0
    return 0


def load_refusal(impl: str, p: RolePlan, env: dict[str, Any]) -> Unavailable | None:
    """The preview's availability check (``worker.attention.availability.unavailable``) for ``impl`` in role ``p`` on the
    probed node ``env``, before a real load. The model's architecture is left to the real load: transformers'
    own error says it best."""
    ctx = Context(Environment.from_dict(env), support=None, trained=p.trained, sp=p.sp,
                  output_attentions=p.output_attentions, compute_dtype=p.compute_dtype)
    return unavailable(impl, ctx)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _probe_ids(vocab_size: int) -> torch.Tensor:
    return (torch.arange(8) % max(vocab_size - 1, 1) + 1)[None, :]  # (1, 8)


PACKED_PROBE_POSITIONS = torch.tensor([[0, 1, 2, 3, 0, 1, 2]])
"""The first forward of a role that removes padding: two sequences (4 and 3 tokens) packed in one row with
no attention mask, as its micro-batches run, so the kernel observed is the packed path's."""


class AttentionWeightsMissing(RuntimeError):
    """``output_attentions=True`` was asked for and the implementation returned no attention weights."""


@contextmanager
def _transformers_warnings() -> Iterator[list[str]]:
    """The messages transformers logs meanwhile (it warns, rather than raises, about output_attentions)."""
    said: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            said.append(record.getMessage())

    handler = Collect(logging.WARNING)
    logger = logging.getLogger("transformers")
    logger.addHandler(handler)
    try:
        yield said
    finally:
        logger.removeHandler(handler)


def _first_forward(model: torch.nn.Module, vocab_size: int, trained: bool, output_attentions: bool = False,
                   implementation: str = "", compute_dtype: str = "float32", packed: bool = False) -> dict[str, Any]:
    """A 1x8 forward (with ``packed``, two sequences packed in a 1x7 row) and a backward for trained roles,
    under observation, in the role's compute dtype -> what ran (the implementation called, the SDPA backend
    and why it was math, see ``observe_attention``).

    It runs before the model is wrapped, so it does what FSDP's ``param_dtype`` will do on every forward:
    each weight cast to the compute dtype (a differentiable cast, so the backward reaches the weights as
    held), under verl's autocast. The dtype decides the kernel: fused kernels refuse fp32 on CUDA.

    With ``output_attentions``, the forward asks for the attention weights and raises
    ``AttentionWeightsMissing`` when none come back: transformers 5.x does not fall back to eager for
    them, it logs "`sdpa` attention does not support `output_attentions=True`" and returns an empty tuple
    (ATTENTION_RULES.md), so the loss of the debugging output would otherwise go unnoticed."""
    device = next(model.parameters()).device
    kwargs = {"input_ids": _probe_ids(vocab_size).to(device)}
    if packed:
        kwargs = {"input_ids": kwargs["input_ids"][:, :PACKED_PROBE_POSITIONS.shape[1]],
                  "position_ids": PACKED_PROBE_POSITIONS.to(device),
                  "use_cache": False}  # with a cache transformers would not infer the packed mask
    if output_attentions:
        kwargs["output_attentions"] = True
    dtype = compute.dtype_of(compute_dtype)
    cast = any(p.is_floating_point() and p.dtype != dtype for p in model.parameters())

    def forward():
        with compute.autocast(device.type, compute_dtype):
            if not cast:
                return model(**kwargs)
            weights = {name: p.to(dtype) for name, p in model.named_parameters()}
            return torch.func.functional_call(model, weights, args=(), kwargs=kwargs)

    with observe_attention() as seen, _transformers_warnings() as said:
        if trained:
            out = forward()
            out.logits.float().sum().backward()
            model.zero_grad(set_to_none=True)
        else:
            with torch.no_grad():
                out = forward()
    if output_attentions and not (out.attentions and all(a is not None for a in out.attentions)):
        warning = next((text for text in said if "output_attentions" in text), None)
        raise AttentionWeightsMissing(warning or f"`{implementation}` attention does not support "
                                                 f"`output_attentions=True`: the forward returned no attention weights.")
    return seen.as_dict()


def _full_gradients(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter's whole gradient, on every rank (a collective: all ranks must call it).

    FSDP2 keeps gradients as DTensors (``full_tensor`` gathers them); FSDP1 keeps shards of a flat
    buffer, gathered by ``summon_full_params(with_grads=True)``.
    """
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    def clean(name: str) -> str:
        return name.replace("_fsdp_wrapped_module.", "").replace("_checkpoint_wrapped_module.", "")

    if isinstance(module, FSDP):
        with FSDP.summon_full_params(module, with_grads=True):
            return {clean(n): p.grad.detach().clone().cpu() for n, p in module.named_parameters() if p.grad is not None}
    return {clean(n): (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).detach().cpu()
            for n, p in module.named_parameters() if p.grad is not None}


class RankWorker:
    """A rank. Created by the controller with ``ray.remote(RankWorker).options(...)``."""

    def __init__(self, rank: int, world: int, run_id: str, device: str = "cpu", threads: int = 1):
        self.rank, self.world, self.run_id, self.device = rank, world, run_id, device
        torch.set_num_threads(threads)  # the CPUs it asked Ray for (``worker.core.devices.rank_cpus``)
        self.roles: dict[str, _Loaded] = {}
        self.sp_groups: dict[int, compute.SeqParallel] = {}
        self.tokenizer_folder: str | None = None
        self.rollout_report: dict[str, Any] | None = None
        self.rollout_copy: torch.nn.Module | None = None  # the rollout's model when rollout.dtype differs
        self.generations = 0

    # ---- plumbing

    def address(self) -> tuple[str, int]:
        """Rank 0's rendezvous address: this node's IP (127.0.0.1 on a local cluster) and a free port."""
        import ray

        node_id = ray.get_runtime_context().get_node_id()
        ip = next((n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == node_id), "127.0.0.1")
        return ip, free_port(ip)

    def pid(self) -> int:
        return os.getpid()

    def assign(self, rank: int, world: int, run_id: str) -> int:
        """Take part in a run as ``rank`` of ``world`` (a warm rank from the pool gets its run here) -> pid."""
        self.rank, self.world, self.run_id = rank, world, run_id
        if self.device == "cuda" and torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()  # a warm rank's peak is this run's, not an earlier run's
        return os.getpid()

    def reset(self) -> int:
        """Forget the finished run (roles, optimizers, process group) so the next run starts clean -> pid.

        The pool only reuses a rank after a run that succeeded; a failed or cancelled run's ranks are
        killed, since a collective may still be pending in them."""
        import gc

        self.roles.clear()
        self.sp_groups.clear()
        self.tokenizer_folder, self.rollout_report, self.rollout_copy, self.generations = None, None, None, 0
        if dist.is_initialized():
            dist.destroy_process_group()
        self.rank, self.world, self.run_id = 0, 1, ""
        gc.collect()
        return os.getpid()

    @register(Dispatch.ONE_TO_ALL)
    def init_process_group(self, master_addr: str, master_port: int, sp_sizes: list[int]) -> int:
        """Join the run's process group (gloo on CPU, nccl on GPU) and build the SP subgroups."""
        backend = "gloo" if self.device == "cpu" else "nccl"
        if self.device == "cuda":
            torch.cuda.set_device(cuda_index())
        dist.init_process_group(backend, init_method=f"tcp://{master_addr}:{master_port}", rank=self.rank,
                                world_size=self.world, timeout=timedelta(seconds=120))
        for sp in sorted(set(sp_sizes)):
            mesh = Mesh(self.world, sp)
            mine = None
            for ranks in mesh.sp_groups():
                group = dist.new_group(ranks) if sp > 1 else None  # every rank creates every group, same order
                if self.rank in ranks:
                    mine = group
            self.sp_groups[sp] = compute.SeqParallel(mine, sp, mesh.sp_rank(self.rank)) if sp > 1 else compute.NO_SP
        return self.rank

    @register(Dispatch.ONE_TO_ALL)
    def probe(self, model_folder: str | None = None) -> dict[str, Any]:
        from worker.engine.probe import probe_environment

        return probe_environment(model_folder)

    def parity_check(self, folder: str, implementations: list[str], dtype: str) -> Any:
        """The trial's logit parity (``worker.engine.parity.parity_check``) on this rank's device -> ``Parity``."""
        from worker.engine.parity import parity_check

        return parity_check(folder, implementations, device=self.device, dtype=dtype)

    # ---- loading

    @register(Dispatch.ONE_TO_ALL)
    def load(self, plan: LoadPlan) -> list[dict[str, Any]]:
        """Load every role with its planned implementation chain -> one report per role."""
        torch.manual_seed(plan.seed)
        reports = []
        for role_plan in plan.roles:
            loaded = self._load_role(role_plan, plan)
            self.roles[role_plan.role] = loaded
            reports.append(loaded.report)
            if role_plan.role == "actor":
                self.tokenizer_folder = role_plan.folder
        return reports

    def _load_role(self, p: RolePlan, plan: LoadPlan) -> _Loaded:
        attempts: list[dict[str, Any]] = []
        facts = Environment.from_dict(plan.env)
        for impl in p.candidates:
            refused = load_refusal(impl, p, plan.env)
            if refused is not None:  # recorded and classified exactly as the real failure would be
                error = ErrorInfo(refused.raises, refused.error)
                attempts.append({"implementation": impl, "ok": False, "error": refused.head, "traceback": "",
                                 "diagnosis": classify(error, facts, role=p.role).as_dict(),
                                 "refused_by": refused.rule.value})
                continue
            try:
                config = models.build_config(p.folder, p.override_config, impl)  # always fresh
                if p.forced:
                    config._attn_implementation = impl  # FSDP-Turbo's Ulysses path: eager, unconditionally
                loader = models.load_causal_lm if p.loader == "causal_lm" else models.load_value_model
                module = loader(p.folder, config, dtype=compute.dtype_of(p.weights_dtype))
                if self.device == "cuda":
                    module = module.to("cuda")  # fused kernels only run on the device
                if p.sp > 1:
                    module.config._attn_implementation = ulysses.register_ulysses(impl)
                seen = _first_forward(module, module.config.vocab_size, p.trained, p.output_attentions, impl,
                                      compute_dtype=p.compute_dtype, packed=p.remove_padding)
            except Exception as exc:
                diagnosis = classify(ErrorInfo.from_exception(exc), facts, role=p.role)
                attempts.append({"implementation": impl, "ok": False,
                                 "error": f"{type(exc).__name__}: {exc}",
                                 "traceback": traceback.format_exc(limit=8),
                                 "diagnosis": diagnosis.as_dict()})
                continue
            attempts.append({"implementation": impl, "ok": True})
            if p.trained and p.gradient_checkpointing:
                module.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            wrapped, optimizer = self._shard(module, p)
            group = self.sp_groups.get(p.sp, compute.NO_SP)
            attention = AttentionPayload(
                role=p.role, rank=self.rank, requested=p.requested, effective=impl,
                config_attn_implementation=module.config._attn_implementation,
                kernel_source=kernel_source(impl, module.config._attn_implementation, str(self.device)),
                **seen, compute_dtype=p.compute_dtype, weights_dtype=p.weights_dtype,
                forced=p.forced, fallback=impl != p.candidates[0], reasons=p.reasons, strategy=p.strategy, sp=p.sp,
                gradient_checkpointing=bool(p.trained and p.gradient_checkpointing), output_attentions=p.output_attentions,
                remove_padding=p.remove_padding,
            )
            report = {**attention.as_dict(), "attempts": attempts}  # what the controller turns into events
            scaler = compute.grad_scaler(p.compute_dtype, self.device) if p.trained else None
            return _Loaded(wrapped, optimizer, group, Mesh(self.world, p.sp), p, report, scaler)
        raise RoleLoadError(p.role, attempts)

    def _shard(self, module: torch.nn.Module, p: RolePlan) -> tuple[torch.nn.Module, torch.optim.Optimizer | None]:
        """Wrap with the role's FSDP flavour and precision; trained roles get an AdamW over the sharded
        (master) parameters, so the optimizer state is in the master dtype.

        Mixed precision is FSDP's, as verl configures it: weights held in ``master_dtype``, cast to the
        compute dtype for forward and backward, gradients reduced and kept in fp32.

        A world of one rank (so no sequence parallelism either) holding its weights in the compute dtype
        (every fp32 role, the frozen reference) is left unwrapped: there is nothing to shard or cast, and
        FSDP's hooks on every forward, decode step and backward would only cost time. A world-1 role with
        master weights finer than its compute dtype is wrapped all the same, so that FSDP's own
        ``param_dtype`` cast gives it the numerics it has at any world size (as verl, which wraps at every
        world size): bf16 weights in every op, the residual stream included, and gradients cast back to
        fp32. ``torch.autocast`` alone would not match that: it keeps fp32 weights outside matmuls (norms,
        the embedding, residual adds stay fp32). Everything downstream (gradient clipping, full
        gradients, saving) handles plain and wrapped modules.
        """
        if not p.trained:
            module.requires_grad_(False)
            module.eval()
        mixed = p.weights_dtype != p.compute_dtype
        if (self.world > 1 or mixed) and not self.replicated(p):
            module = self._wrap(module, p.strategy, p.compute_dtype if mixed else None)
        optimizer = None
        if p.trained:
            optimizer = torch.optim.AdamW(module.parameters(), lr=p.lr, weight_decay=p.weight_decay)
        return module, optimizer

    def replicated(self, p: RolePlan) -> bool:
        """A frozen role (the reference) on CPU without sequence parallelism is held whole on every rank instead
        of sharded: its weights never change, every rank loads the same ones, and over gloo the all-gather of
        every layer on every forward costs more than the memory of a copy. (On a GPU, nccl is fast and memory
        dear: it is sharded as verl shards it.)"""
        return not p.trained and p.sp == 1 and self.device == "cpu"

    def _wrap(self, module: torch.nn.Module, strategy: str, param_dtype: str | None = None) -> torch.nn.Module:
        """FSDP1 or FSDP2 (also under fsdp_turbo) over the whole world, one unit per decoder layer plus the
        root; with ``param_dtype``, verl's mixed precision: FSDP1 ``MixedPrecision(param_dtype,
        reduce_dtype=fp32, buffer_dtype=fp32)``, FSDP2 ``MixedPrecisionPolicy(param_dtype, reduce_dtype=fp32)``."""
        layers = list(getattr(getattr(module, "model", module), "layers", []))
        if strategy == "fsdp":
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            from torch.distributed.fsdp import MixedPrecision
            from torch.distributed.fsdp.wrap import ModuleWrapPolicy

            device_id = torch.device("cpu") if self.device == "cpu" else torch.device("cuda", torch.cuda.current_device())
            policy = ModuleWrapPolicy({type(layers[0])}) if layers else None
            precision = None
            if param_dtype is not None:
                precision = MixedPrecision(param_dtype=compute.dtype_of(param_dtype), reduce_dtype=torch.float32,
                                           buffer_dtype=torch.float32)
            return FSDP(module, device_id=device_id, auto_wrap_policy=policy, use_orig_params=True,
                        mixed_precision=precision)
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh(self.device, (self.world,))
        policy = MixedPrecisionPolicy()
        if param_dtype is not None:
            policy = MixedPrecisionPolicy(param_dtype=compute.dtype_of(param_dtype), reduce_dtype=torch.float32)
        # On CPU (gloo) a layer keeps its gathered parameters from its forward to its backward: one all-gather
        # per micro-batch instead of two, for the memory of one layer's full weights at a time per micro-batch
        # in flight. On a GPU, verl's default: reshard after forward.
        keep = self.device == "cpu"
        for layer in layers:
            fully_shard(layer, mesh=mesh, mp_policy=policy, reshard_after_forward=not keep)
        return fully_shard(module, mesh=mesh, mp_policy=policy)

    # ---- compute (batches already split by data-parallel rank)

    def _to_device(self, batch: dict[str, Any]) -> dict[str, Any]:
        if self.device == "cpu":
            return batch
        return {k: v.to(self.device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}

    @staticmethod
    def _to_cpu(out: dict[str, Any]) -> dict[str, Any]:
        return {k: v.detach().cpu() if isinstance(v, torch.Tensor) else v for k, v in out.items()}

    def _synchronize(self) -> None:
        """Wait for this rank's queued GPU work, so the controller's clock measures the work, not its launch."""
        if self.device == "cuda":
            torch.cuda.synchronize()

    def _rollout_model(self, dtype: str) -> torch.nn.Module:
        """The model the rollout generates with: the actor's own when ``rollout.dtype`` is the actor's
        compute dtype (verl's defaults: both bf16); otherwise a copy held in the rollout dtype and loaded
        with the actor's current full weights before every rollout, as verl syncs the actor's weights
        into its rollout engine, which runs in ``rollout.dtype``. Gathering the weights is a collective:
        every rank calls this."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        actor = self.roles["actor"]
        if dtype == actor.plan.compute_dtype:
            return actor.module
        state = get_model_state_dict(actor.module, options=StateDictOptions(full_state_dict=True))
        if self.rollout_copy is None:
            plan = actor.plan
            config = models.build_config(plan.folder, plan.override_config, actor.report["effective"])
            rollout = models.load_causal_lm(plan.folder, config, dtype=compute.dtype_of(dtype))
            self.rollout_copy = rollout.to(next(actor.module.parameters()).device).requires_grad_(False)
        self.rollout_copy.load_state_dict(state)
        return self.rollout_copy

    @register(Dispatch.DP_COMPUTE, mesh="actor")
    def generate(self, batch: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
        """Rollout with the actor's current (sharded) weights in ``settings["dtype"]`` (``rollout.dtype``; the
        actor's compute dtype when absent); the first call is observed per rank."""
        actor = self.roles["actor"]
        dtype = settings.get("dtype") or actor.plan.compute_dtype
        model = self._rollout_model(dtype)
        model.eval()
        batch = self._to_device(batch)
        generator = torch.Generator(device=batch["prompt_ids"].device)
        generator.manual_seed(int(settings["seed"]) * 1000 + self.generations * 17 + self.rank)
        self.generations += 1
        kwargs = {"max_new_tokens": settings["max_new_tokens"], "eos_token_id": settings["eos_token_id"],
                      "pad_token_id": settings["pad_token_id"], "temperature": settings["temperature"],
                      "top_p": settings["top_p"], "do_sample": settings["do_sample"], "generator": generator,
                      "sync_group": dist.group.WORLD, "compute_dtype": dtype}
        if self.rollout_report is None:
            with observe_attention() as seen:
                out = compute.generate(model, batch["prompt_ids"], batch["prompt_mask"], **kwargs)
            attention = AttentionPayload.of(actor.report, role=Role.rollout.value, **seen.as_dict(), compute_dtype=dtype,
                                            remove_padding=False,  # generation runs padded rows with a KV cache
                                            weights_dtype=dtype if model is self.rollout_copy else actor.plan.weights_dtype)
            self.rollout_report = {**attention.as_dict(), "attempts": actor.report["attempts"]}
        else:
            out = compute.generate(model, batch["prompt_ids"], batch["prompt_mask"], **kwargs)
        return self._to_cpu(out)

    @register(Dispatch.ONE_TO_ALL)
    def rollout_attention(self) -> dict[str, Any] | None:
        """What the first generate on this rank called (None before any generate)."""
        return self.rollout_report

    @register(Dispatch.DP_COMPUTE, mesh="actor")
    def compute_log_prob(self, batch: dict[str, Any], temperature: float) -> dict[str, Any]:
        actor = self.roles["actor"]
        actor.module.eval()
        with torch.no_grad():
            log_probs, entropy = compute.policy_forward(actor.module, self._to_device(batch), actor.sp,
                                                        temperature=temperature, with_entropy=True,
                                                        compute_dtype=actor.plan.compute_dtype,
                                                        remove_padding=actor.plan.remove_padding)
        return self._to_cpu({"old_log_probs": log_probs, "entropy": entropy})

    @register(Dispatch.DP_COMPUTE, mesh="actor")
    def compute_ref_log_prob(self, batch: dict[str, Any], temperature: float) -> dict[str, Any]:
        ref = self.roles["reference"]
        with torch.no_grad():
            log_probs, _ = compute.policy_forward(ref.module, self._to_device(batch), ref.sp,
                                                  temperature=temperature, with_entropy=False,
                                                  compute_dtype=ref.plan.compute_dtype,
                                                  remove_padding=ref.plan.remove_padding)
        return self._to_cpu({"ref_log_prob": log_probs})

    @register(Dispatch.DP_COMPUTE, mesh="critic")
    def compute_values(self, batch: dict[str, Any]) -> dict[str, Any]:
        critic = self.roles["critic"]
        critic.module.eval()
        with torch.no_grad():
            values = compute.value_forward(critic.module, self._to_device(batch), critic.sp,
                                           compute_dtype=critic.plan.compute_dtype,
                                           remove_padding=critic.plan.remove_padding)
        return self._to_cpu({"values": values})

    @register(Dispatch.DP_COMPUTE, mesh="actor")
    def update_actor(self, batch: dict[str, Any], settings: compute.ActorSettings) -> dict[str, float]:
        actor = self.roles["actor"]
        metrics = compute.update_actor(actor.module, actor.optimizer, self._to_device(batch), actor.sp, settings,
                                       compute_dtype=actor.plan.compute_dtype, scaler=actor.scaler,
                                       remove_padding=actor.plan.remove_padding)
        self._synchronize()
        return metrics

    @register(Dispatch.DP_COMPUTE, mesh="actor")
    def update_actor_on_policy(self, batch: dict[str, Any], settings: compute.ActorSettings) -> dict[str, Any]:
        """``update_actor`` without a separate old-log-prob forward (``settings.on_policy``, verl's one-epoch,
        one-mini-batch condition) -> its metrics and this rank's rows' ``old_log_probs`` and ``entropy`` (N, R):
        what the update's own forwards saw, every one of them before its one optimizer step."""
        actor = self.roles["actor"]
        seen: list[tuple[torch.Tensor, torch.Tensor]] = []
        metrics = compute.update_actor(actor.module, actor.optimizer, self._to_device(batch), actor.sp, settings,
                                       compute_dtype=actor.plan.compute_dtype, scaler=actor.scaler,
                                       remove_padding=actor.plan.remove_padding, seen=seen)
        self._synchronize()
        return {"metrics": metrics, **self._to_cpu({"old_log_probs": torch.cat([lp for lp, _ in seen]),
                                                     "entropy": torch.cat([e for _, e in seen])})}

    @register(Dispatch.DP_COMPUTE, mesh="critic")
    def update_critic(self, batch: dict[str, Any], settings: compute.CriticSettings) -> dict[str, float]:
        critic = self.roles["critic"]
        metrics = compute.update_critic(critic.module, critic.optimizer, self._to_device(batch), critic.sp, settings,
                                        compute_dtype=critic.plan.compute_dtype, scaler=critic.scaler,
                                        remove_padding=critic.plan.remove_padding)
        self._synchronize()
        return metrics

    @register(Dispatch.DP_COMPUTE, mesh="actor")
    def policy_loss_and_grads(self, batch: dict[str, Any], settings: compute.ActorSettings) -> dict[str, Any]:
        """One forward/backward of the actor loss, no step: the loss and the full (unsharded) gradients.

        For parity checks (Ulysses SP vs no SP, one implementation vs another) on the same weights.
        """
        actor = self.roles["actor"]
        actor.module.train()
        actor.module.zero_grad(set_to_none=True)
        loss, _ = compute.actor_loss(actor.module, self._to_device(batch), actor.sp, settings,
                                     compute_dtype=actor.plan.compute_dtype, remove_padding=actor.plan.remove_padding)
        loss.backward()
        grads = _full_gradients(actor.module)
        actor.module.zero_grad(set_to_none=True)
        return {"loss": float(loss.detach()), "grads": grads}

    @register(Dispatch.ONE_TO_ALL)
    def peak_memory_mb(self) -> float:
        if self.device == "cuda":
            return torch.cuda.max_memory_allocated() / 2**20
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB

    @register(Dispatch.ONE_TO_ALL)
    def save_actor(self, target: str) -> str | None:
        """Gather the actor's full weights; rank 0 writes an HF folder (config, safetensors, tokenizer)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        actor = self.roles["actor"]
        state = get_model_state_dict(actor.module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if self.rank != 0:
            return None
        plan = actor.plan
        config = models.build_config(plan.folder, plan.override_config, actor.report["effective"])
        model = models.load_causal_lm(plan.folder, config)
        model.load_state_dict(state)
        out = Path(target)
        out.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(out)
        models.load_tokenizer(plan.folder).save_pretrained(out)
        return str(out)

    # ---- checkpoints (the layout is worker.engine.checkpoint's, the DCP part worker.engine.checkpointing's)

    @register(Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, folder: str) -> dict[str, Any]:
        """This rank's part of a checkpoint (a collective) -> the roles written and the rollout's
        ``generations`` (its sampling seed counter)."""
        from worker.engine import checkpointing

        roles = checkpointing.save(self.roles, Path(folder), rank=self.rank, device=self.device)
        return {"rank": self.rank, "roles": roles, "generations": self.generations}

    @register(Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, folder: str, generations: int, restore_rng: bool) -> dict[str, Any]:
        """Load the trained roles' states from a checkpoint (a collective) and continue the rollout's
        sampling seeds from ``generations``."""
        from worker.engine import checkpointing

        roles = checkpointing.load(self.roles, Path(folder), rank=self.rank, device=self.device,
                                   restore_rng=restore_rng)
        self.generations = int(generations)
        return {"rank": self.rank, "roles": roles}

    @register(Dispatch.ONE_TO_ALL)
    def placement(self) -> dict[str, Any]:
        """Where this rank runs: its node's address, its pid (a restarted rank may land elsewhere) and the torch
        threads it computes with."""
        return {"rank": self.rank, "node": self.address()[0], "pid": os.getpid(), "threads": torch.get_num_threads()}

    @register(Dispatch.ONE_TO_ALL)
    def shutdown(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
