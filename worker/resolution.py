"""The resolution preview: what attention implementation each role will run, and why.

``resolve(spec, env)`` is a pure function. For every role (actor, rollout, reference, and critic
when ``algorithm.adv_estimator == gae``) it reports the requested implementation, where the request
came from (verl's default or an override), what will effectively run, a status (ok / forced /
fallback / error) and the ordered reasons, each a rule id plus one sentence. The rules are those of
../shared/ATTENTION_RULES.md; each is one small function in ``_AVAILABILITY`` or a step of
``_resolve_role``, named by its rule id.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Callable

from worker import messages
from worker.attention import DEFAULT_IMPL, FALLBACK_CHAIN, ULYSSES_BASES, base_impl, is_hub_kernel, is_valid_name
from worker.environment import Environment
from worker.spec import RunSpec, Strategy

ROLES = ("actor", "rollout", "reference", "critic")


class Status(str, Enum):
    ok = "ok"
    forced = "forced"
    fallback = "fallback"
    error = "error"


class Rule(str, Enum):
    """Rule ids, stable: the UI, the docs and the tests refer to them."""

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
    fa_npu = "flash-attn-npu"
    sdpa_architecture = "sdpa-architecture"
    flex_architecture = "flex-architecture"
    flex_backward_cpu = "flex-backward-cpu"
    hub_kernel_missing = "hub-kernel-needs-kernels"
    hub_kernel = "hub-kernel"
    fallback_step = "fallback-step"
    strict = "strict"
    support_unknown = "architecture-support-unknown"


@dataclass(frozen=True)
class Reason:
    rule: str
    text: str


@dataclass(frozen=True)
class ModelSupport:
    """What a model class supports, read from its transformers class flags (``_supports_sdpa`` ...)."""

    model_class: str
    flash_attn: bool = True
    sdpa: bool = True
    flex_attn: bool = True


@dataclass(frozen=True)
class RoleResolution:
    role: str
    requested: str
    source: str  # "default" | "override"
    effective: str | None  # None when status is error
    status: str
    reasons: tuple[Reason, ...]
    error: str | None = None  # the exact message transformers / the kernel would raise
    attempts: tuple[str, ...] = ()  # implementations tried in order, the effective one last

    @property
    def badge(self) -> str:
        """default / override / forced / fallback / error: what the dashboard shows."""
        return self.status if self.status in (Status.forced.value, Status.fallback.value, Status.error.value) else self.source


@dataclass
class Resolution:
    environment: str
    policy: str
    roles: dict[str, RoleResolution] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(r.status != Status.error.value for r in self.roles.values())

    def to_dict(self) -> dict:
        return {
            "environment": self.environment,
            "policy": self.policy,
            "ok": self.ok,
            "roles": {
                name: {**asdict(r), "reasons": [asdict(x) for x in r.reasons], "attempts": list(r.attempts), "badge": r.badge}
                for name, r in self.roles.items()
            },
        }


# ---------------------------------------------------------------------------------------------
# Availability rules: (implementation, role context) -> None if it can load, else (rule, message).


@dataclass(frozen=True)
class _Ctx:
    env: Environment
    support: ModelSupport | None
    trained: bool  # the role runs a backward pass
    sp: int = 1  # plain fsdp/fsdp2 Ulysses size (FSDP-Turbo's forced eager is decided before)


Unavailable = tuple[Rule, str, str]  # rule, explanation, exact error text


def _flash_attn(ctx: _Ctx, version: int) -> Unavailable | None:
    env, tmajor = ctx.env, ctx.env.transformers_major
    if ctx.support is not None and not ctx.support.flash_attn:
        msg = messages.architecture_without_flash_attn(ctx.support.model_class, version, tmajor)
        return Rule.fa_architecture, f"{ctx.support.model_class} has no FlashAttention {version} kernel.", msg
    if env.device == "npu" and version == 2:
        return None  # transformers 5.x short-circuits the check on Ascend NPU
    installed = env.flash_attn_installed if version == 2 else False
    if not installed:
        where = "the flash-attn package is not installed" if version == 2 else f"the FlashAttention{version} package is not installed"
        return Rule.fa_not_installed, f"{where} on {env.name}.", messages.flash_attn_not_installed(version, tmajor)
    if version == 2 and _version_tuple(env.flash_attn_version) < (2, 3, 3):
        return (Rule.fa_too_old, f"flash-attn {env.flash_attn_version} is older than 2.3.3.",
                messages.flash_attn_too_old(env.flash_attn_version or "", tmajor))
    if env.device == "cpu":
        return Rule.fa_not_on_cpu, "FlashAttention needs a GPU; this environment is CPU only.", messages.flash_attn_not_on_cpu(version, tmajor)
    return None


def _flash_attn_cc(ctx: _Ctx, version: int, minimum: tuple[int, int]) -> Unavailable | None:
    cc = ctx.env.compute_capability
    if ctx.env.device == "cuda" and cc is not None and cc < minimum:
        gpu = ctx.env.gpu_name or "this GPU"
        if version == 2:
            return (Rule.fa_compute_capability,
                    f"{gpu} has compute capability {cc[0]}.{cc[1]}; FlashAttention 2 needs Ampere (8.0) or newer.",
                    messages.PRE_AMPERE)
        return (Rule.fa_compute_capability,
                f"{gpu} has compute capability {cc[0]}.{cc[1]}; FlashAttention {version} needs {minimum[0]}.{minimum[1]} or newer.",
                messages.flash_attn_compute_capability(version, minimum[0], cc))
    return None


def _fa2(ctx: _Ctx) -> Unavailable | None:
    return _flash_attn(ctx, 2) or _flash_attn_cc(ctx, 2, (8, 0))


def _fa_hopper(version: int) -> Callable[[_Ctx], Unavailable | None]:
    # The compute-capability rule comes first: on a pre-Hopper GPU installing the package would not help.
    return lambda ctx: (_flash_attn_cc(ctx, version, (9, 0)) if ctx.env.device == "cuda" else None) or _flash_attn(ctx, version)


def _sdpa(ctx: _Ctx) -> Unavailable | None:
    if ctx.support is not None and not ctx.support.sdpa:
        return (Rule.sdpa_architecture, f"{ctx.support.model_class} has no sdpa attention path.",
                messages.architecture_without_sdpa(ctx.support.model_class))
    return None


def _flex(ctx: _Ctx) -> Unavailable | None:
    if ctx.support is not None and not ctx.support.flex_attn:
        return (Rule.flex_architecture, f"{ctx.support.model_class} has no flex_attention path.",
                f"{ctx.support.model_class} does not support flex_attention yet.")
    if ctx.trained and ctx.env.device == "cpu":
        return (Rule.flex_backward_cpu, "flex_attention cannot run a backward pass on CPU; this role is trained.",
                messages.FLEX_BACKWARD_CPU)
    return None


def _eager(ctx: _Ctx) -> Unavailable | None:
    return None


_AVAILABILITY: dict[str, Callable[[_Ctx], Unavailable | None]] = {
    "eager": _eager,
    "sdpa": _sdpa,
    "flash_attention_2": _fa2,
    "flash_attention_3": _fa_hopper(3),
    "flash_attention_4": _fa_hopper(4),
    "flex_attention": _flex,
}


def _unavailable(name: str, ctx: _Ctx) -> Unavailable | None:
    problem = _unavailable_kernel(name, ctx)
    if problem is None and ctx.sp > 1 and base_impl(name) not in ULYSSES_BASES:
        return (Rule.ulysses_kernel,
                f"attnboard's Ulysses wrapper (sequence parallel size {ctx.sp}) runs on {' and '.join(ULYSSES_BASES)} only.",
                messages.ulysses_kernel(base_impl(name)))
    return problem


def _unavailable_kernel(name: str, ctx: _Ctx) -> Unavailable | None:
    if is_hub_kernel(name):
        if not ctx.env.kernels_installed:
            return (Rule.hub_kernel_missing, f"{name} is a Hub kernel and the `kernels` package is not installed.",
                    messages.KERNELS_MISSING)
        return None
    check = _AVAILABILITY.get(base_impl(name))
    if check is None:
        return Rule.unknown_name, f"{name!r} is not an attention implementation transformers knows.", messages.unknown_implementation(name)
    return check(ctx)


def _version_tuple(version: str | None) -> tuple[int, ...]:
    parts = []
    for piece in (version or "0").split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def _candidates(requested: str) -> list[str]:
    """The fallback chain from the requested implementation down to eager."""
    base = base_impl(requested)
    if base in FALLBACK_CHAIN:
        return list(FALLBACK_CHAIN[FALLBACK_CHAIN.index(base):]) if base == requested else [requested, *FALLBACK_CHAIN[FALLBACK_CHAIN.index(base) + 1:]]
    return [requested, *FALLBACK_CHAIN]


# ---------------------------------------------------------------------------------------------
# One role


@dataclass(frozen=True)
class _RoleInput:
    role: str
    section: str  # the override_config section, dotted
    override_config: dict
    strategy: str
    sp: int
    trained: bool
    support: ModelSupport | None


def _resolve_role(spec: RunSpec, env: Environment, inp: _RoleInput) -> RoleResolution:
    policy = spec.attnboard.fallback_policy
    key = f"{inp.section}.attn_implementation"
    reasons: list[Reason] = []
    if "attn_implementation" in inp.override_config:
        requested, source = str(inp.override_config["attn_implementation"]), "override"
        reasons.append(Reason(Rule.override.value, f"{requested} set by {key}."))
    else:
        requested, source = DEFAULT_IMPL, "default"
        reasons.append(Reason(Rule.default.value, f"{key} is absent: verl's default {DEFAULT_IMPL} applies."))

    def done(effective, status, error=None, attempts=()):
        return RoleResolution(inp.role, requested, source, effective, status, tuple(reasons), error,
                              tuple(attempts) or ((effective,) if effective else ()))

    if not is_valid_name(requested):
        reasons.append(Reason(Rule.unknown_name.value, f"{requested!r} is not a valid attn_implementation."))
        return done(None, Status.error.value, messages.unknown_implementation(requested))

    # Forced eager: FSDP-Turbo's Ulysses path sets hf_config._attn_implementation = "eager" unconditionally.
    if inp.strategy == Strategy.fsdp_turbo.value and inp.sp > 1:
        reasons.append(Reason(Rule.forced_turbo_ulysses.value,
                              f"strategy fsdp_turbo with Ulysses sequence parallel size {inp.sp}: the engine sets "
                              f"_attn_implementation='eager' unconditionally (all-to-all around attention splits the "
                              f"sequence; the fused kernels are not wired for it)."))
        return done("eager", Status.forced.value if requested != "eager" else Status.ok.value)
    if inp.sp > 1:
        reasons.append(Reason(Rule.ulysses.value,
                              f"Ulysses sequence parallel size {inp.sp}: attention runs between two all-to-alls "
                              f"(sequence-sharded -> head-sharded -> back)."))
    if inp.support is None:
        reasons.append(Reason(Rule.support_unknown.value,
                              "the model's architecture support was not read (no local model or probe): assumed complete."))

    ctx = _Ctx(env, inp.support, inp.trained, inp.sp)
    wants_weights = spec.attnboard.debug.output_attentions
    attempts: list[str] = []
    first_error: str | None = None
    for candidate in _candidates(requested):
        attempts.append(candidate)
        problem = _unavailable(candidate, ctx)
        if problem is None and wants_weights and base_impl(candidate) != "eager":
            problem = (Rule.output_attentions,
                       f"attnboard.debug.output_attentions needs eager: transformers 5.x {candidate} silently "
                       f"returns no attention weights (it logs the warning and an empty tuple comes back).",
                       messages.SDPA_OUTPUT_ATTENTIONS if base_impl(candidate) == "sdpa"
                       else f"`{candidate}` attention does not return attention weights (output_attentions=True).")
        if problem is None:
            if is_hub_kernel(candidate):
                reasons.append(Reason(Rule.hub_kernel.value, f"{candidate} is fetched from the Hub by `kernels` at load time."))
            if env.device == "npu" and base_impl(candidate) == "flash_attention_2":
                reasons.append(Reason(Rule.fa_npu.value, "on Ascend NPU transformers 5.x skips the FlashAttention 2 "
                                                         "package check and uses the NPU's own kernel."))
            if candidate != requested:
                return done(candidate, Status.fallback.value, first_error, attempts)
            return done(candidate, Status.ok.value, attempts=attempts)
        rule, text, error = problem
        first_error = first_error or error
        reasons.append(Reason(rule.value, f"{candidate} unavailable: {text}"))
        if policy != "fallback":
            reasons.append(Reason(Rule.strict.value,
                                  "fallback_policy is strict: the run fails as verl would; set "
                                  "attnboard.fallback_policy=fallback or choose another implementation."))
            return done(None, Status.error.value, error, attempts)
        nxt = _candidates(requested)[len(attempts)] if len(attempts) < len(_candidates(requested)) else None
        if nxt:
            reasons.append(Reason(Rule.fallback_step.value, f"fallback policy: trying {nxt} next."))
    return done(None, Status.error.value, first_error, attempts)


def resolve(
    spec: RunSpec,
    env: Environment,
    *,
    actor_support: ModelSupport | None = None,
    critic_support: ModelSupport | None = None,
) -> Resolution:
    """Per role: requested, source, effective, status and ordered reasons (pure)."""
    arr = spec.actor_rollout_ref
    section = "actor_rollout_ref.model.override_config"
    out = Resolution(environment=env.name, policy=spec.attnboard.fallback_policy)
    actor_strategy = arr.actor.strategy
    shared = dict(override_config=arr.model.override_config, strategy=actor_strategy, sp=spec.actor_sp, support=actor_support)

    actor = _resolve_role(spec, env, _RoleInput("actor", section, trained=True, **shared))
    out.roles["actor"] = actor

    # Rollout generates with the actor's model object: whatever the actor loaded is what rollout runs.
    rollout_reasons = [*actor.reasons,
                       Reason(Rule.shared_section.value, "rollout generates with the actor's HF model and weights: same implementation.")]
    if arr.rollout.name != "hf":
        rollout_reasons.append(Reason(Rule.rollout_engine.value,
                                      f"rollout.name={arr.rollout.name}: under verl, {arr.rollout.name} picks its own attention "
                                      f"backend; attnboard generates with the actor's HF model instead."))
    out.roles["rollout"] = RoleResolution("rollout", actor.requested, actor.source, actor.effective, actor.status,
                                          tuple(rollout_reasons), actor.error, actor.attempts)

    reference = _resolve_role(spec, env, _RoleInput("reference", section, trained=False, **shared))
    out.roles["reference"] = RoleResolution(
        "reference", reference.requested, reference.source, reference.effective, reference.status,
        (*reference.reasons, Reason(Rule.shared_section.value,
                                    "reference shares actor_rollout_ref.model.override_config (frozen initial weights).")),
        reference.error, reference.attempts)

    if spec.has_critic:
        critic_section = "critic.model.override_config"
        critic = _resolve_role(spec, env, _RoleInput(
            "critic", critic_section, spec.critic.model.override_config, spec.critic.strategy, spec.critic_sp,
            trained=True, support=critic_support))
        if critic.source == "override":
            critic = RoleResolution(
                critic.role, critic.requested, critic.source, critic.effective, critic.status,
                (*critic.reasons, Reason(Rule.verl_critic_defect.value,
                                         "verl <= 0.9.1 ignores critic.model.override_config.attn_implementation "
                                         "(verl issue #5210: load_valuehead_model passes flash_attention_2 explicitly); "
                                         "attnboard applies it.")),
                critic.error, critic.attempts)
        out.roles["critic"] = critic
    return out
