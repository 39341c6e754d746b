"""One fallback chain and one availability check, for every part that chooses an attention implementation.

- ``candidates(requested, policy)``: the implementations tried, in order (the ``fallback`` policy walks
  ``FALLBACK_CHAIN``; ``strict`` tries the requested one only; a forced one is tried alone).
- ``unavailable(name, ctx)``: why ``name`` cannot run for a role on a node (``Unavailable``: the rule id, an
  explanation and the exact error text the library would raise, with its exception type), or None.
- ``walk(...)``: both together, as a loader walks them: every candidate up to the first available one.

The resolution preview (``worker.attention.resolution``), the engine's load plan and its load check
(``worker.engine.plan``, ``worker.engine.rank``), the classifier's remedies (``worker.troubleshoot.classify``) and the
attention trial (``worker.engine.trial``) all call these; nothing else decides a chain or an availability. Pure:
no I/O, no torch. The rule ids are those of ../shared/ATTENTION_RULES.md and the README's rule table.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple

from worker.attention import messages
from worker.attention.kernel_sources import FLASH_HEAD_DIM_ERROR, MAX_FLASH_HEAD_DIM, flash_kernel_source, kernels_usable
from worker.core.environment import Environment
from worker.core.implementations import FALLBACK_CHAIN, ULYSSES_BASES, Impl, base_impl, is_hub_kernel


class Rule(str, Enum):
    """Rule ids of the resolution preview, stable: the UI, the docs and the tests refer to them."""

    default = "default"
    override = "override"
    shared_section = "shared-section"
    rollout_engine = "rollout-engine"
    verl_critic_defect = "verl-critic-defect"
    forced_turbo_ulysses = "forced-eager-fsdp-turbo-ulysses"
    ulysses = "ulysses-sp"
    ulysses_kernel = "ulysses-kernel"
    output_attentions = "output-attentions-needs-eager"
    unknown_name = "unknown-implementation"
    fa_architecture = "flash-attn-architecture"
    fa_not_installed = "flash-attn-not-installed"
    fa_too_old = "flash-attn-too-old"
    fa_not_on_cpu = "flash-attn-not-on-cpu"
    fa_compute_capability = "flash-attn-compute-capability"
    fa_dtype = "flash-attn-dtype"
    fa_npu = "flash-attn-npu"
    sdpa_architecture = "sdpa-architecture"
    flex_architecture = "flex-architecture"
    flex_backward_cpu = "flex-backward-cpu"
    hub_kernel_missing = "hub-kernel-needs-kernels"
    hub_kernel = "hub-kernel"
    fallback_step = "fallback-step"
    strict = "strict"
    support_unknown = "architecture-support-unknown"
    # verl's training engines (worker.attention.verl_engines)
    verl_engine_key = "verl-engine-key"
    verl_engine_rewrite = "verl-engine-rewrite"
    verl_reference_inherits = "verl-reference-inherits"
    verl_critic_honoured = "verl-critic-honoured"
    verl_engine_refuses = "verl-engine-refuses"
    verl_engine_ignores = "verl-engine-ignores"
    attnboard_runs_dp = "attnboard-runs-dp"
    rollout_engine_kwargs = "rollout-engine-kwargs"
    # where a FlashAttention kernel comes from, and head-dim limits (worker.attention.kernel_sources)
    fa_kernel_source = "flash-attn-kernel-source"
    fa_hub_offline = "flash-attn-hub-offline"
    fa_head_dim = "flash-attn-head-dim"
    sdpa_head_dim = "sdpa-gqa-head-dim"
    remove_padding = "remove-padding-cost"


@dataclass(frozen=True)
class Reason:
    """One step of a resolution: a rule id (``Rule``) and one sentence."""

    rule: str
    text: str


@dataclass(frozen=True)
class ModelSupport:
    """What a model class supports, read from its transformers class flags (``_supports_sdpa`` ...)."""

    model_class: str
    flash_attn: bool = True
    sdpa: bool = True
    flex_attn: bool = True


FLASH_MIN_COMPUTE_CAPABILITY: dict[str, tuple[int, int]] = {
    Impl.flash_attention_2.value: (8, 0),  # Ampere
    Impl.flash_attention_3.value: (9, 0),  # Hopper
    Impl.flash_attention_4.value: (9, 0),
}
FLASH_VERSION: dict[str, int] = {name: int(name[-1]) for name in FLASH_MIN_COMPUTE_CAPABILITY}
HALF_DTYPES = ("float16", "bfloat16")
"""The compute dtypes FlashAttention's kernels accept (torch names, as ``RunSpec.precision`` gives them)."""


class Unavailable(NamedTuple):
    """Why an implementation cannot run: the rule, one explanatory sentence, and the exact error the library
    raises (``raises``: its exception type, so a refusal is recorded as ``Type: message`` like a real failure).
    ``attnboard_only``: the limit is attnboard's own engine, not transformers', the kernel's or verl's."""

    rule: Rule
    explanation: str
    error: str
    raises: str
    attnboard_only: bool = False

    @property
    def head(self) -> str:
        """``Type: message``, as the engine records a failed load."""
        return f"{self.raises}: {self.error}"


@dataclass(frozen=True)
class Context:
    """A role on a node. ``env`` None: the node is unknown, only the model's and the engine's limits count."""

    env: Environment | None
    support: ModelSupport | None = None  # None: the architecture was not read (assumed complete)
    trained: bool = True  # the role runs a backward pass
    sp: int = 1  # plain fsdp/fsdp2 Ulysses size (FSDP-Turbo's forced eager is decided before)
    output_attentions: bool = False  # the forward must return attention weights
    compute_dtype: str | None = None  # torch name of the forward's dtype; None: not known
    head_dim: int | None = None  # the model's largest attention head dimension; None: not read


# ---------------------------------------------------------------------------------------------
# The chain


def chain_position(name: str) -> int:
    """Where ``name`` stands in ``FALLBACK_CHAIN`` (0: the fastest); a name outside it ranks after it."""
    return FALLBACK_CHAIN.index(name) if name in FALLBACK_CHAIN else len(FALLBACK_CHAIN)


def candidates(requested: str, policy: str, *, forced: str | None = None) -> tuple[str, ...]:
    """The implementations tried for a role, in order.

    Forced (FSDP-Turbo with Ulysses): only the forced one. ``strict``: only the requested one. ``fallback``:
    the requested one, then the chain's names after its kernel family (``paged|sdpa`` -> eager;
    ``flash_attention_2`` -> sdpa -> eager); a name outside the chain (flash_attention_3/4, flex_attention,
    a Hub kernel) continues with the whole chain, fastest first.
    """
    if forced is not None:
        return (forced,)
    if policy != "fallback":
        return (requested,)
    base = base_impl(requested)
    after = chain_position(base) if base in FALLBACK_CHAIN else -1
    return (requested, *(name for name in FALLBACK_CHAIN if chain_position(name) > after and name != requested))


class Step(NamedTuple):
    name: str
    problem: Unavailable | None  # None: this one can run (the walk stops here)


def walk(requested: str, policy: str, ctx: Context, *, forced: str | None = None) -> tuple[Step, ...]:
    """The candidates in order, each with its verdict, up to and including the first that can run."""
    steps = []
    for name in candidates(requested, policy, forced=forced):
        problem = unavailable(name, ctx)
        steps.append(Step(name, problem))
        if problem is None:
            break
    return tuple(steps)


# ---------------------------------------------------------------------------------------------
# Availability: (implementation, role context) -> None if it can run, else Unavailable


def unavailable(name: str, ctx: Context) -> Unavailable | None:
    """Why ``name`` cannot run for this role on this node, or None. The kernel's own limits first, then
    attnboard's Ulysses wrapper, then the attention weights ``output_attentions`` asks for."""
    problem = _kernel(name, ctx)
    if problem is None and ctx.sp > 1 and name not in ULYSSES_BASES:
        problem = Unavailable(
            Rule.ulysses_kernel,
            f"attnboard's Ulysses wrapper (sequence parallel size {ctx.sp}) runs on {' and '.join(ULYSSES_BASES)} "
            f"only; verl itself runs Ulysses with flash_attention_2 (its patch wraps the flash-attention forward), "
            f"so this is a limit of attnboard's engine, not of verl.",
            messages.ulysses_kernel(name), "ValueError", attnboard_only=True)
    if problem is None and ctx.output_attentions and base_impl(name) != Impl.eager.value:
        problem = Unavailable(
            Rule.output_attentions,
            f"attnboard.debug.output_attentions needs eager: transformers 5.x {name} silently returns no attention "
            f"weights (it logs the warning and an empty tuple comes back).",
            messages.SDPA_OUTPUT_ATTENTIONS if base_impl(name) == Impl.sdpa.value
            else f"`{name}` attention does not support `output_attentions=True`.",
            "AttentionWeightsMissing")
    return problem


def _kernel(name: str, ctx: Context) -> Unavailable | None:
    if is_hub_kernel(name):
        if ctx.env is not None and not ctx.env.kernels_installed:
            return Unavailable(Rule.hub_kernel_missing,
                               f"{name} is a Hub kernel and the `kernels` package is not installed.",
                               messages.KERNELS_MISSING, "ImportError")
        return None
    check = _CHECKS.get(base_impl(name))
    if check is None:
        return Unavailable(Rule.unknown_name, f"{name!r} is not an attention implementation transformers knows.",
                           messages.unknown_implementation(name), "ValueError")
    return check(ctx)


def _flash(version: int) -> Callable[[Context], Unavailable | None]:
    name = f"flash_attention_{version}"
    minimum = FLASH_MIN_COMPUTE_CAPABILITY[name]

    def check(ctx: Context) -> Unavailable | None:
        if ctx.support is not None and not ctx.support.flash_attn:
            tmajor = ctx.env.transformers_major if ctx.env is not None else 5
            return Unavailable(Rule.fa_architecture, f"{ctx.support.model_class} has no FlashAttention {version} kernel.",
                               messages.architecture_without_flash_attn(ctx.support.model_class, version, tmajor),
                               "ValueError")
        env = ctx.env
        if env is None:
            return None
        if version == 2:  # the package is checked before the device
            return (_flash_package(env, version) or _compute_capability(env, version, minimum)
                    or _flash_dtype(ctx, version) or _flash_head_dim(ctx, version))
        # FA3/FA4: on a pre-Hopper GPU installing the package would not help, so the device speaks first.
        return ((_compute_capability(env, version, minimum) if env.device == "cuda" else None)
                or _flash_package(env, version) or _flash_dtype(ctx, version) or _flash_head_dim(ctx, version))

    return check


def _flash_package(env: Environment, version: int) -> Unavailable | None:
    tmajor = env.transformers_major
    if env.device == "npu" and version == 2:
        return None  # transformers 5.x short-circuits the check on Ascend NPU
    installed = {2: env.flash_attn_installed, 3: env.flash_attn_3_version is not None}.get(version, False)
    if not installed and env.device == "cuda" and kernels_usable(env):
        # transformers 5.24 loads the Hub kernel instead (kernel_sources); only an offline node fails.
        source = flash_kernel_source(f"flash_attention_{version}", env)
        if source is None or source.offline_error is None:
            return None
        return Unavailable(Rule.fa_hub_offline, f"{source.text} Remedy: {source.remedy}.", source.offline_error,
                           "ImportError")
    if not installed:
        where = ("the flash-attn package is not installed" if version == 2
                 else f"the FlashAttention{version} package is not installed")
        return Unavailable(Rule.fa_not_installed, f"{where} on {env.name}.",
                           messages.flash_attn_not_installed(version, tmajor), "ImportError")
    if version == 2 and version_tuple(env.flash_attn_version or "0") < (2, 3, 3):
        return Unavailable(Rule.fa_too_old, f"flash-attn {env.flash_attn_version} is older than 2.3.3.",
                           messages.flash_attn_too_old(env.flash_attn_version or "", tmajor), "ImportError")
    if env.device == "cpu":
        return Unavailable(Rule.fa_not_on_cpu, "FlashAttention needs a GPU; this environment is CPU only.",
                           messages.flash_attn_not_on_cpu(version, tmajor), "ImportError")
    return None


def _compute_capability(env: Environment, version: int, minimum: tuple[int, int]) -> Unavailable | None:
    cc = env.compute_capability
    if env.device != "cuda" or cc is None or cc >= minimum:
        return None
    gpu = env.gpu_name or "this GPU"
    if version == 2:  # transformers lets it load; the flash-attn kernel refuses at the first forward
        return Unavailable(Rule.fa_compute_capability,
                           f"{gpu} has compute capability {cc[0]}.{cc[1]}; FlashAttention 2 needs Ampere (8.0) or newer.",
                           messages.PRE_AMPERE, "RuntimeError")
    return Unavailable(Rule.fa_compute_capability,
                       f"{gpu} has compute capability {cc[0]}.{cc[1]}; FlashAttention {version} needs "
                       f"{minimum[0]}.{minimum[1]} or newer.",
                       messages.flash_attn_compute_capability(version, minimum[0], cc), "ImportError")


def _flash_dtype(ctx: Context, version: int) -> Unavailable | None:
    """FlashAttention's kernels take fp16/bf16 only. transformers 5.24 only warns at load, and keeps fp32 at the
    forward when no autocast is on (``integrations/flash_attention.py:get_target_dtype``), so the kernel
    refuses the first forward. Decided where the flash-attn kernels run (CUDA)."""
    dtype = ctx.compute_dtype
    if dtype is None or dtype in HALF_DTYPES or ctx.env is None or ctx.env.device != "cuda":
        return None
    raises, error = messages.FLASH_ATTN_DTYPE[version]
    model = ctx.support.model_class if ctx.support is not None else "the model's class"
    warning = messages.flash_attn_dtype_warning(version, model, f"torch.{dtype}").split(". You should")[0]
    return Unavailable(Rule.fa_dtype,
                       f"the compute dtype is {dtype}: transformers {ctx.env.transformers_version} only warns at load "
                       f"(\"{warning}.\") and the FlashAttention {version} kernel refuses the first forward; "
                       f"compute in bfloat16 (verl's default) or float16 to keep it.",
                       error, raises)


def _flash_head_dim(ctx: Context, version: int) -> Unavailable | None:
    """FlashAttention's kernels take head dims up to 256 (verl #7131: Gemma-4's global layers, head dim 512); the
    kernel refuses the first forward. Decided where they run (CUDA)."""
    if ctx.head_dim is None or ctx.head_dim <= MAX_FLASH_HEAD_DIM or (ctx.env is not None and ctx.env.device != "cuda"):
        return None
    return Unavailable(Rule.fa_head_dim,
                       f"the model's head dimension is {ctx.head_dim}: FlashAttention {version} runs head dims up to "
                       f"{MAX_FLASH_HEAD_DIM} and refuses the first forward (verl #7131, Gemma-4's global layers).",
                       FLASH_HEAD_DIM_ERROR, "RuntimeError")


def _sdpa(ctx: Context) -> Unavailable | None:
    if ctx.support is not None and not ctx.support.sdpa:
        return Unavailable(Rule.sdpa_architecture, f"{ctx.support.model_class} has no sdpa attention path.",
                           messages.architecture_without_sdpa(ctx.support.model_class), "ValueError")
    return None


def _flex(ctx: Context) -> Unavailable | None:
    if ctx.support is not None and not ctx.support.flex_attn:
        return Unavailable(Rule.flex_architecture, f"{ctx.support.model_class} has no flex_attention path.",
                           f"{ctx.support.model_class} does not support flex_attention yet.", "ValueError")
    if ctx.trained and ctx.env is not None and ctx.env.device == "cpu":
        return Unavailable(Rule.flex_backward_cpu,
                           "flex_attention cannot run a backward pass on CPU; this role is trained.",
                           messages.FLEX_BACKWARD_CPU, "NotImplementedError")
    return None


_CHECKS: dict[str, Callable[[Context], Unavailable | None]] = {
    Impl.eager.value: lambda ctx: None,
    Impl.sdpa.value: _sdpa,
    Impl.flash_attention_2.value: _flash(2),
    Impl.flash_attention_3.value: _flash(3),
    Impl.flash_attention_4.value: _flash(4),
    Impl.flex_attention.value: _flex,
}


def version_tuple(text: str) -> tuple[int, ...]:
    """Leading numeric parts of a version string: "2.8.3.post1" -> (2, 8, 3)."""
    parts: list[int] = []
    for piece in re.split(r"[.+-]", text):
        digits = re.match(r"\d+", piece)
        if not digits:
            break
        parts.append(int(digits.group()))
        if digits.group() != piece:
            break
    return tuple(parts)
