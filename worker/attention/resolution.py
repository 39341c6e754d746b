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
from worker.attention.availability import Context, ModelSupport, Rule, candidates, walk
from worker.attention.packing import remove_padding_cost
from worker.attention.rollout_engines import EngineChoice, engine_choice
from worker.core.environment import Environment
from worker.core.implementations import DEFAULT_IMPL, base_impl, is_hub_kernel, is_valid_name
from worker.spec import RunSpec, Strategy

__all__ = ["ROLES", "ModelSupport", "Reason", "Resolution", "RoleResolution", "Rule", "Status", "resolve"]

ROLES = ("actor", "rollout", "reference", "critic")


class Status(str, Enum):
    ok = "ok"
    forced = "forced"
    fallback = "fallback"
    error = "error"


@dataclass(frozen=True)
class Reason:
    rule: str
    text: str


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
                name: {**asdict(r), "reasons": [asdict(x) for x in r.reasons], "attempts": list(r.attempts),
                       "badge": r.badge,
                       "under_verl": {**asdict(r.under_verl), "effective": r.under_verl.effective} if r.under_verl else None}
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

    ctx = Context(env, inp.support, inp.trained, inp.sp, spec.attnboard.debug.output_attentions,
                  spec.precision(inp.role)[0])
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
) -> Resolution:
    """Per role: requested, source, effective, status and ordered reasons (pure)."""
    arr = spec.actor_rollout_ref
    section = "actor_rollout_ref.model.override_config"
    out = Resolution(environment=env.name, policy=spec.attnboard.fallback_policy)
    actor_strategy = arr.actor.strategy
    shared = {"override_config": arr.model.override_config, "strategy": actor_strategy, "sp": spec.actor_sp,
              "support": actor_support, "remove_padding": arr.model.use_remove_padding}

    actor = _resolve_role(spec, env, _RoleInput("actor", section, trained=True, **shared))
    out.roles["actor"] = actor
    out.roles["rollout"] = _rollout(spec, env, actor)

    reference = _resolve_role(spec, env, _RoleInput("reference", section, trained=False, **shared))
    out.roles["reference"] = replace(reference, reasons=(
        *reference.reasons, Reason(Rule.shared_section.value,
                                   "reference shares actor_rollout_ref.model.override_config (frozen initial weights).")))

    if spec.has_critic:
        critic_section = "critic.model.override_config"
        critic = _resolve_role(spec, env, _RoleInput(
            "critic", critic_section, spec.critic.model.override_config, spec.critic.strategy, spec.critic_sp,
            trained=True, support=critic_support, remove_padding=spec.critic.model.use_remove_padding))
        if critic.source == "override":
            critic = replace(critic, reasons=(
                *critic.reasons, Reason(Rule.verl_critic_defect.value,
                                        "verl <= 0.9.1 ignores critic.model.override_config.attn_implementation "
                                        "(verl issue #5210: load_valuehead_model passes flash_attention_2 explicitly); "
                                        "attnboard applies it.")))
        out.roles["critic"] = critic
    return out


def _rollout(spec: RunSpec, env: Environment, actor: RoleResolution) -> RoleResolution:
    """Under attnboard, rollout generates with the actor's HF model object: whatever the actor loaded is what
    rollout runs (requested, effective, status). Under verl, a vLLM/SGLang/TensorRT-LLM rollout runs its own
    backend, which override_config does not reach (``under_verl``)."""
    name = spec.actor_rollout_ref.rollout.name
    reasons = [*(r for r in actor.reasons if r.rule != Rule.remove_padding.value),  # generation does not pack
               Reason(Rule.shared_section.value, "under attnboard, rollout generates with the actor's HF model and "
                                                 "weights: the actor's implementation.")]
    choice = engine_choice(name, env, spec.precision("rollout")[0])
    if choice is not None:
        backend = (f"refuses to start ({choice.error})" if choice.error
                   else f"runs {choice.backend}" if choice.backend else "picks a backend attnboard cannot tell")
        reasons.append(Reason(Rule.rollout_engine.value,
                              f"under verl, rollout.name={name} {backend}: {choice.why} override_config does not reach "
                              f"it; {choice.setting} chooses it. attnboard's own engine does not run {name}."))
    return replace(actor, role="rollout", reasons=tuple(reasons), under_verl=choice)
