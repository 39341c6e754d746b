"""The spec's cross-field rules (batch arithmetic, Ulysses sizes, strategy conflicts, what verl's engine and
attnboard's engine would refuse) and ``validate_spec``, parsing plus the rules.

Pure logic, no I/O."""

from __future__ import annotations

from typing import Any, Literal

from worker.core.vocabulary import ModelInfo
from worker.ppo import advantage
from worker.spec.engines import (
    RETIRED,
    ROLLOUT_MODE_SYNC_ERROR,
    VERL_CONFIG_ENGINES,
    ModelEngine,
    engine_keys,
    key_outside_engine,
    retired_message,
)
from worker.spec.keys import SPEC_KEYS, VERL_NAMES
from worker.spec.parse import parse_spec
from worker.spec.runspec import RunSpec, spec_to_flat
from worker.spec.schema import ENGINE_KL_TYPES, PASSTHROUGH, Issue, ResumeMode, SpecError, Strategy
from worker.spec.verl_defaults import VERL_DEFAULTS, VERL_VERSION

# --------------------------------------------------------------------------------------------
# Cross-field rules


SP_PADDING_MESSAGE = "When using sequence parallelism for actor/ref policy, you must enable use_remove_padding."
TURBO_CONFLICT_MESSAGE = (
    "Do not enable both FSDP-Turbo CP and verl Ulysses SP. FSDP-Turbo runs its own Ulysses/CP group "
    "(it forces eager attention); set actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size=1 "
    "or use strategy fsdp/fsdp2."
)


def check_spec(
    spec: RunSpec,
    *,
    actor_model: ModelInfo | None = None,
    critic_model: ModelInfo | None = None,
    launch: bool = False,
) -> list[Issue]:
    """Cross-field rules verl enforces (and a few it should). Returns errors and warnings, errors first.
    ``engine_issues`` are warnings for a preview and errors for a launch (``launch=True``)."""
    issues: list[Issue] = []
    arr = spec.actor_rollout_ref
    actor = arr.actor
    world = spec.world_size
    n = arr.rollout.n

    # Ulysses sizes divide the world and the heads.
    for role, key, sp, info, remove_padding in (
        ("actor", "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size", spec.actor_sp, actor_model,
         arr.model.use_remove_padding),
        ("critic", "critic.ulysses_sequence_parallel_size", spec.critic_sp, critic_model,
         spec.critic.model.use_remove_padding),
    ):
        if role == "critic" and not spec.has_critic:
            continue
        if world % sp:
            issues.append(Issue(key, sp, f"[{role}] ulysses_sequence_parallel_size ({sp}) must divide the world size "
                                         f"({world} = trainer.nnodes {spec.trainer.nnodes} x trainer.n_gpus_per_node "
                                         f"{spec.trainer.n_gpus_per_node})", valid=_divisors(world)))
        if sp > 1 and not remove_padding and spec.actor_rollout_ref.actor.strategy != Strategy.fsdp_turbo.value:
            pad_key = ("actor_rollout_ref" if role == "actor" else "critic") + ".model.use_remove_padding"
            issues.append(Issue(pad_key, False, SP_PADDING_MESSAGE, valid=[True]))
        if sp > 1 and info is not None:
            for heads_name, heads in (("num_attention_heads", info.num_attention_heads),
                                      ("num_key_value_heads", info.num_key_value_heads)):
                if heads % sp:
                    issues.append(Issue(key, sp, f"[{role}] ulysses_sequence_parallel_size ({sp}) must divide the "
                                                 f"model's {heads_name} ({heads}, {info.architecture})",
                                        valid=_divisors(heads)))

    for prefix, strategy, verl_sp, turbo_cp, active in (
        ("actor_rollout_ref.actor", actor.strategy, actor.fsdp_config.ulysses_sequence_parallel_size,
         actor.fsdp_config.turbo_cp_size, True),
        ("critic", spec.critic.strategy, spec.critic.ulysses_sequence_parallel_size, spec.critic.turbo_cp_size,
         spec.has_critic),
    ):
        cp_key = f"{prefix}.fsdp_config.turbo_cp_size" if prefix != "critic" else "critic.turbo_cp_size"
        if not active:
            continue
        if strategy == Strategy.fsdp_turbo.value and turbo_cp > 1 and verl_sp > 1:
            issues.append(Issue(f"{prefix}.strategy", strategy, TURBO_CONFLICT_MESSAGE))
        elif strategy != Strategy.fsdp_turbo.value and turbo_cp > 1:
            issues.append(Issue(cp_key, turbo_cp, f"turbo_cp_size ({turbo_cp}) only applies to strategy fsdp_turbo, "
                                                  f"not {strategy}", valid=[1]))

    # Batch arithmetic, verl's: mini batches count prompts and are multiplied by rollout.n, then split
    # across data-parallel ranks, then into micro batches.
    tbs, mini = spec.data.train_batch_size, actor.ppo_mini_batch_size
    if tbs % mini:
        issues.append(Issue("actor_rollout_ref.actor.ppo_mini_batch_size", mini,
                            f"[actor] data.train_batch_size ({tbs}) must be divisible by ppo_mini_batch_size ({mini})",
                            valid=_divisors(tbs)))
    for role, sp, micro, micro_key in (
        ("actor", spec.actor_sp, actor.ppo_micro_batch_size_per_gpu, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"),
        ("critic", spec.critic_sp, spec.critic.ppo_micro_batch_size_per_gpu, "critic.ppo_micro_batch_size_per_gpu"),
    ):
        if role == "critic" and not spec.has_critic:
            continue
        if world % sp:
            continue  # reported above
        dp = world // sp
        samples = mini * n
        if samples % dp:
            issues.append(Issue("actor_rollout_ref.actor.ppo_mini_batch_size", mini,
                                f"[{role}] ppo_mini_batch_size x rollout.n ({mini} x {n} = {samples}) must be divisible "
                                f"by the data-parallel size ({dp} = world {world} / ulysses {sp})"))
            continue
        per_rank = samples // dp
        if micro is not None and per_rank % micro:
            issues.append(Issue(micro_key, micro,
                                f"[{role}] ppo_mini_batch_size per data-parallel rank ({per_rank} = {mini} x {n} / {dp}) "
                                f"must be divisible by ppo_micro_batch_size_per_gpu ({micro})",
                                valid=_divisors(per_rank)))

    # Critic override without a critic: verl would silently ignore it.
    if not spec.has_critic and spec.critic.model.override_config:
        issues.append(Issue("critic.model.override_config", spec.critic.model.override_config,
                            f"no critic runs with algorithm.adv_estimator={spec.algorithm.adv_estimator} "
                            f"(only gae uses one): critic.model.override_config has no effect",
                            severity="warning"))
    entry = advantage.ESTIMATORS.get(spec.algorithm.adv_estimator)
    if entry is not None and entry.group and n < 2:
        issues.append(Issue("actor_rollout_ref.rollout.n", n,
                            f"{entry.name.value} compares each sample with the other samples of its prompt: "
                            f"rollout.n must be >= 2", valid=">= 2"))
    if spec.algorithm.use_kl_in_reward and actor.use_kl_loss:
        issues.append(Issue("actor_rollout_ref.actor.use_kl_loss", True,
                            "KL is applied twice: algorithm.use_kl_in_reward and actor.use_kl_loss are both true",
                            severity="warning"))

    trainer = spec.trainer
    if trainer.resume_mode == ResumeMode.resume_path.value and not trainer.resume_from_path:
        issues.append(Issue("trainer.resume_from_path", trainer.resume_from_path,
                            "trainer.resume_mode=resume_path needs trainer.resume_from_path: a global_step_N checkpoint "
                            "folder, or a folder holding them", valid="a folder path"))

    issues.extend(verl_engine_issues(spec))
    issues.extend(engine_issues(spec, severity="error" if launch else "warning"))
    issues.sort(key=lambda i: i.severity != "error")
    return issues


MEGATRON_LAUNCH_MESSAGE = (
    "attnboard's engine cannot run model_engine=megatron: it trains Hugging Face models under FSDP, while verl's "
    "Megatron engine builds Megatron-Core models whose attention is override_transformer_config.attention_backend "
    "(TransformerEngine flash, fused, unfused, local, auto), not a transformers attn_implementation; the spec is "
    "kept for import, preview and export"
)


def verl_engine_issues(spec: RunSpec) -> list[Issue]:
    """What verl 0.9.1 would say about the spec's keys under its ``model_engine``: keys another engine's config
    has (refused, or added and never read), modelled keys set away from their default that the engine's config
    lacks, an engine verl 0.9.1 has no config for, and retired keys with what replaced them."""
    issues: list[Issue] = []
    engine = spec.model_engine
    if engine not in VERL_CONFIG_ENGINES:
        issues.append(Issue("model_engine", engine, f"verl {VERL_VERSION}'s ppo_trainer has no model_engine/{engine} "
                                                    f"config (Hydra refuses model_engine={engine}); newer verl has "
                                                    f"it", severity="warning", valid=list(VERL_CONFIG_ENGINES)))
    for key, value in spec.verl_passthrough.items():
        bare = key.lstrip("+")
        outside = key_outside_engine(bare, engine)
        if outside:
            issues.append(Issue(f"{PASSTHROUGH}.{key}", value, outside, severity="warning"))
        retired = retired_message(bare)
        if retired and not (bare == "actor_rollout_ref.rollout.mode" and value == "sync"):
            issues.append(Issue(f"{PASSTHROUGH}.{key}", value, retired, severity="warning",
                                valid=RETIRED[bare].replaced_by))
        if bare == "actor_rollout_ref.rollout.mode" and value == "sync":
            issues.append(Issue(f"{PASSTHROUGH}.{key}", value, f"verl {VERL_VERSION} raises: {ROLLOUT_MODE_SYNC_ERROR}",
                                valid=["async"]))
    if engine != ModelEngine.dp.value:
        flat, defaults = spec_to_flat(spec), _DEFAULT_FLAT
        for key in SPEC_KEYS:
            verl_key = VERL_NAMES.get(key, key)
            if verl_key in VERL_DEFAULTS and verl_key not in engine_keys(engine) and flat.get(key) != defaults.get(key):
                issues.append(Issue(key, flat.get(key), f"model_engine={engine}'s config has no {verl_key} (dp's "
                                                        f"config has it): verl refuses it", severity="warning"))
    return issues


def engine_issues(spec: RunSpec, *, severity: Literal["error", "warning"] = "error") -> list[Issue]:
    """What verl would run and attnboard's engine does not implement: an advantage estimator other than
    those registered in ``worker.ppo.advantage``, a KL estimator in use other than ``ENGINE_KL_TYPES``. A spec
    holds them (import, preview and export accept them); a launch refuses them."""
    issues: list[Issue] = []
    if spec.model_engine == ModelEngine.megatron.value:
        issues.append(Issue("model_engine", spec.model_engine, MEGATRON_LAUNCH_MESSAGE, severity=severity,
                            valid=[e.value for e in ModelEngine if e is not ModelEngine.megatron]))
    estimator = spec.algorithm.adv_estimator
    if estimator not in advantage.ESTIMATORS:
        issues.append(Issue("algorithm.adv_estimator", estimator,
                            f"attnboard's engine does not run adv_estimator {estimator} (verl does); it runs "
                            f"{', '.join(advantage.names())}", severity=severity, valid=advantage.names()))
    for key, kind, used, why in (
        ("algorithm.kl_penalty", spec.algorithm.kl_penalty, spec.algorithm.use_kl_in_reward, "use_kl_in_reward"),
        ("actor_rollout_ref.actor.kl_loss_type", spec.actor_rollout_ref.actor.kl_loss_type,
         spec.actor_rollout_ref.actor.use_kl_loss, "use_kl_loss"),
    ):
        if used and kind not in ENGINE_KL_TYPES:
            issues.append(Issue(key, kind, f"attnboard's engine does not run the KL estimator {kind} (verl does; "
                                           f"used because {why} is true); it runs "
                                           f"{', '.join(sorted(ENGINE_KL_TYPES))}", severity=severity,
                                valid=sorted(ENGINE_KL_TYPES)))
    return issues


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0][:32]


def validate_spec(data: Any, *, launch: bool = False, **model_info: Any) -> tuple[RunSpec, list[Issue]]:
    """parse_spec + check_spec: raises SpecError on any error, returns the spec and its warnings."""
    spec = parse_spec(data)
    issues = check_spec(spec, launch=launch, **model_info)
    errors = [i for i in issues if i.severity == "error"]
    if errors:
        raise SpecError(issues)
    return spec, issues


_DEFAULT_FLAT = spec_to_flat(RunSpec())
