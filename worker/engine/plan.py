"""From a resolution to a load plan, and from what loaded to the events that tell it (pure).

The resolution (``worker.attention.resolution.resolve``) predicts per role what will run; the plan says what each
rank tries, in order; the reports that come back say what really loaded and which kernel ran. The
events built here are the truth the dashboard shows, and every disagreement with the prediction is an
``attention_mismatch`` of its own.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict
from typing import Any

from pydantic import BaseModel

from worker.attention import availability
from worker.attention.resolution import Resolution, RoleResolution, Status
from worker.core.attention_payload import AttentionPayload, status_of
from worker.core.events import AttentionMismatchPayload, FallbackPayload
from worker.core.roles import Role
from worker.engine.rank import LoadPlan, RolePlan
from worker.engine.ulysses import base_of
from worker.spec import RunSpec


def candidates(role: RoleResolution, policy: str) -> list[str]:
    """The implementations a rank tries, in order: ``worker.attention.availability.candidates`` for the role's request
    (forced: the forced one only; strict: the requested one; fallback: the chain), the same chain the preview
    walked, so the real error of every step is recorded even when the preview already knows it will fail."""
    forced = role.effective if role.status == Status.forced.value and role.effective else None
    return list(availability.candidates(role.requested, policy, forced=forced))


def load_plan(spec: RunSpec, resolution: Resolution, *, actor_folder: str, critic_folder: str | None,
              env: dict[str, Any]) -> LoadPlan:
    arr = spec.actor_rollout_ref
    policy = spec.attnboard.fallback_policy

    def role_plan(role: Role, loader: str, folder: str, override: dict, strategy: str, sp: int,
                  lr: float, weight_decay: float, checkpointing: bool, remove_padding: bool) -> RolePlan:
        name = role.value
        r = resolution.roles[name]
        return RolePlan(role=name, loader=loader, folder=folder, override_config=dict(override),
                        candidates=candidates(r, policy), requested=r.requested,
                        forced=r.status == Status.forced.value, reasons=[asdict(x) for x in r.reasons],
                        strategy=strategy, sp=sp, trained=role.trains, lr=lr, weight_decay=weight_decay,
                        gradient_checkpointing=checkpointing_applies(checkpointing, sp),
                        output_attentions=spec.attnboard.debug.output_attentions,
                        compute_dtype=spec.precision(name)[0], master_dtype=spec.precision(name)[1],
                        # Ulysses (sp > 1) shards padded rows along the sequence: packing is the sp == 1 path
                        remove_padding=remove_padding and sp == 1)

    roles = [
        role_plan(Role.actor, "causal_lm", actor_folder, arr.model.override_config, arr.actor.strategy, spec.actor_sp,
                  arr.actor.optim.lr, arr.actor.optim.weight_decay, arr.model.enable_gradient_checkpointing,
                  arr.model.use_remove_padding),
        role_plan(Role.reference, "causal_lm", actor_folder, arr.model.override_config, arr.actor.strategy,
                  spec.actor_sp, arr.actor.optim.lr, 0.0, False, arr.model.use_remove_padding),
    ]
    if spec.has_critic:
        assert critic_folder is not None, "a gae run needs the critic's folder"
        roles.append(role_plan(Role.critic, "value", critic_folder, spec.critic.model.override_config,
                               spec.critic.strategy, spec.critic_sp, spec.critic.optim.lr,
                               spec.critic.optim.weight_decay, spec.critic.model.enable_gradient_checkpointing,
                               spec.critic.model.use_remove_padding))
    return LoadPlan(roles=roles, policy=policy, env=env, seed=spec.attnboard.seed)


def checkpointing_applies(enabled: bool, sp: int) -> bool:
    """Gradient checkpointing recomputes the forward inside backward, outside the Ulysses all-to-all
    context, so it is applied only without sequence parallelism (``checkpointing_note`` says so)."""
    return enabled and sp == 1


def checkpointing_note(spec: RunSpec) -> str | None:
    """A log line when ``enable_gradient_checkpointing`` is set but not applied (Ulysses SP > 1)."""
    skipped = [key for key, enabled, sp in (
        ("actor_rollout_ref.model.enable_gradient_checkpointing",
         spec.actor_rollout_ref.model.enable_gradient_checkpointing, spec.actor_sp),
        ("critic.model.enable_gradient_checkpointing",
         spec.critic.model.enable_gradient_checkpointing and spec.has_critic, spec.critic_sp),
    ) if enabled and not checkpointing_applies(enabled, sp)]
    if not skipped:
        return None
    return (f"{', '.join(skipped)}=true is not applied with Ulysses sequence parallelism (size > 1): the "
            f"recomputed forward would run outside the all-to-all; this run keeps activations instead")


def attention_payload(report: dict[str, Any], predicted: RoleResolution, **where: Any) -> dict[str, Any]:
    """One ``attention`` event (``worker.core.attention_payload.AttentionPayload``): a rank's report with the
    preview's prediction, the status, and ``where`` it ran (node, pid, attempt)."""
    return AttentionPayload.of(report, source=predicted.source, predicted=predicted.effective,
                               status=status_of(report["forced"], report["fallback"]), **where).as_dict()


def fallback_payloads(report: dict[str, Any]) -> list[dict[str, Any]]:
    """One ``fallback`` event (``FallbackPayload``) per failed attempt that a later implementation replaced
    (``refused_by``: the rule of the availability check that refused it before any load, when it did)."""
    out = []
    attempts = report["attempts"]
    for failed, nxt in itertools.pairwise(attempts):
        if failed["ok"]:
            continue
        refused = {"refused_by": failed["refused_by"]} if "refused_by" in failed else {}
        out.append(_dumped(FallbackPayload(role=report["role"], rank=report["rank"], from_=failed["implementation"],
                                           to=nxt["implementation"], error=failed["error"],
                                           diagnosis=failed["diagnosis"], **refused)))
    return out


def mismatches(payload: dict[str, Any]) -> list[dict[str, Any]]:
    """Disagreements between the preview, the loaded config and the observed kernel, one
    ``AttentionMismatchPayload`` each."""
    out = []
    role, rank, effective = payload["role"], payload["rank"], payload["effective"]
    if payload["predicted"] is not None and payload["predicted"] != effective:
        out.append(_dumped(AttentionMismatchPayload(
            role=role, rank=rank, what="resolution-vs-loaded", expected=payload["predicted"], actual=effective,
            message=f"[{role}] the preview predicted {payload['predicted']}, but rank {rank} loaded {effective}")))
    observed = payload["observed"]
    if observed is None or base_of(observed) != base_of(effective):
        out.append(_dumped(AttentionMismatchPayload(
            role=role, rank=rank, what="loaded-vs-observed", expected=effective, actual=observed, calls=payload["calls"],
            message=f"[{role}] rank {rank} loaded {effective}, but the first forward called "
                    f"{observed or 'no attention function'} ({payload['calls']})")))
    return out


def _dumped(model: BaseModel) -> dict[str, Any]:
    """A payload model as the event's JSON payload: the fields given, by their wire names (``from``)."""
    return model.model_dump(mode="json", by_alias=True, exclude_unset=True)
