"""The resolution preview: what attention implementation each role will run, and why.

``resolve(spec, env)`` is a pure function. For every role (actor, rollout, reference, and critic
when ``algorithm.adv_estimator == gae``) it reports the requested implementation, where the request
came from (verl's default or an override), what will effectively run, a status (ok / forced /
fallback / error) and the ordered reasons, each a rule id plus one sentence. The rules are those of
../shared/ATTENTION_RULES.md: the chain and the availability of an implementation are decided in
``worker.attention.availability`` (shared with the engine, the classifier and the trial), the rest is a step of
``_resolve_role``, named by its rule id. The rollout row tells attnboard's run (the actor's HF model) from
verl's (``under_verl``: the backend vLLM/SGLang/TensorRT-LLM picks, ``worker.attention.rollout_engines``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from enum import Enum

from worker.attention import messages
from worker.attention.availability import Context, ModelSupport, Reason, Rule, candidates, walk
from worker.attention.kernel_sources import MAX_FLASH_HEAD_DIM, SDPA_GQA_COMMENT, KernelSource, flash_kernel_source
from worker.attention.packing import remove_padding_cost
from worker.attention.rollout_engines import EngineChoice, engine_choice
from worker.attention.verl_engines import EngineAttention, verl_engine_view
from worker.core.environment import Environment
from worker.core.implementations import DEFAULT_IMPL, base_impl, is_hub_kernel, is_valid_name
from worker.core.roles import NAMES, Role
from worker.core.vocabulary import ModelInfo
from worker.spec import PASSTHROUGH, RunSpec, Strategy, spec_to_flat

__all__ = ["ROLES", "ModelSupport", "Reason", "Resolution", "RoleResolution", "Rule", "Status", "resolve"]

ROLES = NAMES  # the roles in order (worker.core.roles)


class Status(str, Enum):
    ok = "ok"
    forced = "forced"
    fallback = "fallback"
    error = "error"


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
    under_verl: EngineChoice | None = None  # rollout with vllm/sglang/trtllm: the backend that engine runs under verl
    verl_engine: EngineAttention | None = None  # actor/reference/critic: what verl's model_engine reads and runs
    kernel_source: KernelSource | None = None  # a FlashAttention effective: the package, Hub kernel or NPU mapping

    @property
    def badge(self) -> str:
        """default / override / forced / fallback / error: what the dashboard shows."""
        return self.status if self.status in (Status.forced.value, Status.fallback.value, Status.error.value) else self.source


@dataclass
class Resolution:
    environment: str
    policy: str
    roles: dict[str, RoleResolution] = field(default_factory=dict)
    model_engine: str = "dp"

    @property
    def ok(self) -> bool:
        return all(r.status != Status.error.value for r in self.roles.values())

    def to_dict(self) -> dict:
        return {
            "environment": self.environment,
            "policy": self.policy,
            "model_engine": self.model_engine,
            "ok": self.ok,
            "roles": {
                name: {**asdict(r), "reasons": [asdict(x) for x in r.reasons], "attempts": list(r.attempts),
                       "badge": r.badge,
                       "under_verl": {**asdict(r.under_verl), "effective": r.under_verl.effective} if r.under_verl else None,
                       "verl_engine": r.verl_engine.to_dict() if r.verl_engine else None,
                       "kernel_source": r.kernel_source.to_dict() if r.kernel_source else None}
                for name, r in self.roles.items()
            },
        }


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
    remove_padding: bool = True  # the role's model.use_remove_padding
    model: ModelInfo | None = None


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
        kernel = flash_kernel_source(base_impl(effective), env) if effective else None
        return RoleResolution(inp.role, requested, source, effective, status, tuple(reasons), error,
                              tuple(attempts) or ((effective,) if effective else ()), kernel_source=kernel)

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

    head_dim = inp.model.head_dim if inp.model else None
    ctx = Context(env, inp.support, inp.trained, inp.sp, spec.attnboard.debug.output_attentions,
                  spec.precision(inp.role)[0], head_dim)
    chain = candidates(requested, policy)
    steps = walk(requested, policy, ctx)
    attempts = [step.name for step in steps]
    first_error = next((step.problem.error for step in steps if step.problem is not None), None)
    for i, (candidate, problem) in enumerate(steps):
        if problem is None:
            if is_hub_kernel(candidate):
                reasons.append(Reason(Rule.hub_kernel.value, f"{candidate} is fetched from the Hub by `kernels` at load time."))
            if env.device == "npu" and base_impl(candidate) == "flash_attention_2":
                reasons.append(Reason(Rule.fa_npu.value, "on Ascend NPU transformers 5.x skips the FlashAttention 2 "
                                                         "package check and uses the NPU's own kernel."))
            kernel = flash_kernel_source(base_impl(candidate), env)
            if kernel is not None and kernel.origin in ("package", "hub"):
                reasons.append(Reason(Rule.fa_kernel_source.value, kernel.text))
            if (base_impl(candidate) == "sdpa" and head_dim and head_dim > MAX_FLASH_HEAD_DIM and inp.model is not None
                    and inp.model.gqa and env.device in ("cuda", "npu")):
                reasons.append(Reason(Rule.sdpa_head_dim.value,
                                      f"head dimension {head_dim} with grouped-query attention: transformers 5.24 "
                                      f"passes enable_gqa to SDPA only for head dims up to {MAX_FLASH_HEAD_DIM} "
                                      f"(\"{SDPA_GQA_COMMENT}\"), so it repeats the key/value heads and torch runs "
                                      f"the math kernel, O(S^2) memory (transformers #46960)."))
            reasons.append(Reason(Rule.remove_padding.value,
                                  remove_padding_cost(candidate, remove_padding=inp.remove_padding, sp=inp.sp)))
            if candidate != requested:
                return done(candidate, Status.fallback.value, first_error, attempts)
            return done(candidate, Status.ok.value, attempts=attempts)
        reasons.append(Reason(problem.rule.value, f"{candidate} unavailable: {problem.explanation}"))
        if policy != "fallback":
            fails = ("attnboard's run fails here, though verl would run it (the limit is attnboard's engine)"
                     if problem.attnboard_only else "the run fails as verl would")
            reasons.append(Reason(Rule.strict.value,
                                  f"fallback_policy is strict: {fails}; set "
                                  f"attnboard.fallback_policy=fallback or choose another implementation."))
            return done(None, Status.error.value, problem.error, attempts)
        if i + 1 < len(chain):
            reasons.append(Reason(Rule.fallback_step.value, f"fallback policy: trying {chain[i + 1]} next."))
    return done(None, Status.error.value, first_error, attempts)


def resolve(
    spec: RunSpec,
    env: Environment,
    *,
    actor_support: ModelSupport | None = None,
    critic_support: ModelSupport | None = None,
    architecture: str | None = None,
    actor_model: ModelInfo | None = None,
    critic_model: ModelInfo | None = None,
) -> Resolution:
    """Per role: requested, source, effective, status and ordered reasons (pure), and what verl's training engine
    (``model_engine``) reads and runs for it (``verl_engine``; ``architecture``: the actor's model class, for
    Automodel's Qwen/Llama rule)."""
    arr = spec.actor_rollout_ref
    section = f"{Role.actor.model_section}.override_config"
    out = Resolution(environment=env.name, policy=spec.attnboard.fallback_policy, model_engine=spec.model_engine)
    actor_strategy = arr.actor.strategy
    shared = {"override_config": arr.model.override_config, "strategy": actor_strategy, "sp": spec.actor_sp,
              "support": actor_support, "model": actor_model, "remove_padding": arr.model.use_remove_padding}

    actor = _resolve_role(spec, env, _RoleInput(Role.actor.value, section, trained=Role.actor.trains, **shared))
    out.roles["actor"] = actor
    out.roles["rollout"] = _rollout(spec, env, actor)

    reference = _resolve_role(spec, env, _RoleInput(Role.reference.value, section, trained=Role.reference.trains, **shared))
    out.roles["reference"] = replace(reference, reasons=(
        *reference.reasons, Reason(Rule.shared_section.value,
                                   "reference shares actor_rollout_ref.model.override_config (frozen initial weights).")))

    if spec.has_critic:
        critic_section = f"{Role.critic.model_section}.override_config"
        critic = _resolve_role(spec, env, _RoleInput(
            Role.critic.value, critic_section, spec.critic.model.override_config, spec.critic.strategy, spec.critic_sp,
            trained=Role.critic.trains, support=critic_support, model=critic_model,
            remove_padding=spec.critic.model.use_remove_padding))
        if critic.source == "override":
            critic = replace(critic, reasons=(
                *critic.reasons, Reason(Rule.verl_critic_defect.value,
                                        "verl <= 0.9.1 ignores critic.model.override_config.attn_implementation "
                                        "(verl issue #5210: load_valuehead_model passes flash_attention_2 explicitly); "
                                        "attnboard applies it.")))
        out.roles[Role.critic.value] = critic
    view = verl_engine_view(spec.model_engine, verl_keys(spec), device=env.device, has_critic=spec.has_critic,
                            architecture=architecture or (actor_model.architecture if actor_model else None)
                            or (actor_support.model_class if actor_support else None))
    for role, engine in view.items():
        out.roles[role] = replace(out.roles[role], verl_engine=engine)
    return out


def verl_keys(spec: RunSpec) -> dict[str, object]:
    """Every dotted key the spec sets, as verl reads it: modelled keys, override_config sub-keys and the
    pass-through keys (without their ``+``)."""
    flat = {k: v for k, v in spec_to_flat(spec).items() if not k.startswith(PASSTHROUGH + ".")}
    return {**flat, **{k.lstrip("+"): v for k, v in spec.verl_passthrough.items()}}


def _rollout(spec: RunSpec, env: Environment, actor: RoleResolution) -> RoleResolution:
    """Under attnboard, rollout generates with the actor's HF model object: whatever the actor loaded is what
    rollout runs (requested, effective, status). Under verl, a vLLM/SGLang/TensorRT-LLM rollout runs its own
    backend, which override_config does not reach (``under_verl``)."""
    name = spec.actor_rollout_ref.rollout.name
    reasons = [*(r for r in actor.reasons if r.rule != Rule.remove_padding.value),  # generation does not pack
               Reason(Rule.shared_section.value, "under attnboard, rollout generates with the actor's HF model and "
                                                 "weights: the actor's implementation.")]
    given = verl_keys(spec)
    explicit = next((str(given[k]) for k in (f"actor_rollout_ref.rollout.engine_kwargs.{name}.{leaf}"
                                             for leaf in ("attention_backend", "attn_backend")) if k in given), None)
    choice = engine_choice(name, env, spec.precision("rollout")[0], explicit)
    if choice is not None and explicit is not None:
        reasons.append(Reason(Rule.rollout_engine_kwargs.value,
                              f"{choice.setting}={explicit} is set: verl hands it to {name} as given."))
    if choice is not None:
        backend = (f"refuses to start ({choice.error})" if choice.error
                   else f"runs {choice.backend}" if choice.backend else "picks a backend attnboard cannot tell")
        reasons.append(Reason(Rule.rollout_engine.value,
                              f"under verl, rollout.name={name} {backend}: {choice.why} override_config does not reach "
                              f"it; {choice.setting} chooses it. attnboard's own engine does not run {name}."))
    return replace(actor, role="rollout", reasons=tuple(reasons), under_verl=choice)
