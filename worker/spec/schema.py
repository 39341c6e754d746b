"""The run spec: a PPO run in verl's vocabulary, plus the few keys attnboard adds.

The tree mirrors verl's Hydra config (``actor_rollout_ref.model.override_config`` and so on) and its
defaults are verl 0.9.1's (``verl/trainer/config/_generated_ppo_trainer.yaml``), so a spec means what
verl would run. Keys verl does not have live under ``attnboard.*``.

Pure logic: no I/O. ``parse_spec`` (``worker.spec.parse``) turns untrusted JSON/YAML data into a ``RunSpec``
or raises ``SpecError`` listing every problem with its dotted field, the bad value and what is valid;
``check_spec`` (``worker.spec.checks``) adds the cross-field rules (batch arithmetic, Ulysses sizes, strategy
conflicts). The dotted keys are ``worker.spec.keys``'s, the pass-through's checks ``worker.spec.passthrough``'s;
``RunSpec`` itself is ``worker.spec.runspec``'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from worker.core.implementations import VALID_DESCRIPTION, is_valid_name
from worker.core.vocabulary import AdvEstimator, KLType  # shared with the PPO math and the model readers
from worker.ppo import advantage
from worker.spec.engines import (
    ModelEngine,
)

# --------------------------------------------------------------------------------------------
# Errors


@dataclass(frozen=True)
class Issue:
    """One problem with a spec: the dotted field, the value found, and a sentence saying what is valid."""

    field: str
    value: Any
    message: str
    severity: Literal["error", "warning"] = "error"
    valid: Any = None

    def as_dict(self) -> dict[str, Any]:
        out = {"field": self.field, "value": _jsonable(self.value), "message": self.message, "severity": self.severity}
        if self.valid is not None:
            out["valid"] = self.valid
        return out


class SpecError(ValueError):
    """A spec that cannot be used; ``issues`` lists every problem found, errors first."""

    def __init__(self, issues: list[Issue]):
        self.issues = issues
        super().__init__("; ".join(f"{i.field}: {i.message}" for i in issues))


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        return value if len(value) <= 200 else value[:200] + f"... ({len(value)} characters)"
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in list(value)[:20]]
    if isinstance(value, dict):
        return {str(k)[:200]: _jsonable(v) for k, v in list(value.items())[:20]}
    return repr(value)[:200]


# --------------------------------------------------------------------------------------------
# Vocabulary


class Strategy(str, Enum):
    fsdp = "fsdp"
    fsdp2 = "fsdp2"
    fsdp_turbo = "fsdp_turbo"


ENGINE_KL_TYPES: frozenset[str] = frozenset(
    k.value for k in (KLType.kl, KLType.abs, KLType.mse, KLType.low_var_kl, KLType.k1, KLType.k2, KLType.k3))
"""The KL estimators attnboard's engine implements (``worker.ppo.core_algos.KL_ESTIMATORS``; a test keeps them equal)."""


class RolloutName(str, Enum):
    """verl's rollout engines. attnboard always generates with the actor's HF model (see resolution)."""

    hf = "hf"
    vllm = "vllm"
    sglang = "sglang"
    trtllm = "trtllm"


class FallbackPolicy(str, Enum):
    strict = "strict"
    fallback = "fallback"


class Device(str, Enum):
    cpu = "cpu"
    cuda = "cuda"
    npu = "npu"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, validate_default=True, use_enum_values=True)


PositiveInt = Field(gt=0)
MAX_TRAIN_FILES = 1000


def _check_override_config(value: dict[str, Any]) -> dict[str, Any]:
    attn = value.get("attn_implementation")
    if attn is not None and (not isinstance(attn, str) or not is_valid_name(attn)):
        raise ValueError(f"unknown attn_implementation {attn!r}; valid: {VALID_DESCRIPTION}")
    for key in value:
        if not isinstance(key, str) or not key.isidentifier():
            raise ValueError(f"override_config key {key!r} is not a Hugging Face config attribute name")
    return value


class ModelSection(_Section):
    path: str = Field(
        "~/models/deepseek-llm-7b-chat",
        min_length=1,
        max_length=4096,
        description="A built-in preset (builtin:tiny-llama, builtin:tiny-qwen2) or a local Hugging Face model folder.",
    )
    override_config: dict[str, Any] = Field(
        default_factory=dict,
        description="Written onto the HF config: attn_implementation and any other config key (recursively).",
    )
    use_remove_padding: bool = True
    enable_gradient_checkpointing: bool = True

    _v_override = field_validator("override_config")(classmethod(lambda cls, v: _check_override_config(v)))


class OptimSection(_Section):
    lr: float = Field(1e-6, gt=0, le=1.0)
    weight_decay: float = Field(0.01, ge=0)


class CriticOptimSection(OptimSection):
    """The critic's optimiser: verl's critic lr default is 1e-5, also when only other optim keys are given."""

    lr: float = Field(1e-5, gt=0, le=1.0)


class DType(str, Enum):
    """verl's spellings of a dtype (``PrecisionType``), kept as written so an export reads as the import did."""

    bf16 = "bf16"
    bfloat16 = "bfloat16"
    fp16 = "fp16"
    float16 = "float16"
    fp32 = "fp32"
    float32 = "float32"


DTYPE_NAMES: dict[str, str] = {
    "bf16": "bfloat16", "bfloat16": "bfloat16",
    "fp16": "float16", "float16": "float16",
    "fp32": "float32", "float32": "float32",
}
"""A verl dtype spelling -> the torch dtype name it means."""


def torch_dtype_name(value: str) -> str:
    """``"bf16"`` -> ``"bfloat16"``; ValueError naming the valid spellings otherwise."""
    try:
        return DTYPE_NAMES[str(value)]
    except KeyError:
        raise ValueError(f"{value!r} is not a dtype; valid: {', '.join(DTYPE_NAMES)}") from None


class _Precision(_Section):
    """verl's FSDP engine precision: master weights and optimizer state in ``model_dtype``, forward and
    backward in ``dtype`` (FSDP's param dtype; gradients reduced in fp32)."""

    dtype: DType = Field(DType.bfloat16, description="Compute dtype of forward and backward (verl: bfloat16).")
    model_dtype: DType = Field(DType.fp32, description="Dtype of the master weights and optimizer state (verl: fp32).")


class FsdpConfig(_Precision):
    param_offload: bool = False
    optimizer_offload: bool = False
    ulysses_sequence_parallel_size: int = Field(1, gt=0, le=1024, description="verl's Ulysses sequence-parallel size.")
    turbo_cp_size: int = Field(
        1, gt=0, le=1024,
        description="FSDP-Turbo's own Ulysses/CP group size (strategy fsdp_turbo only; not a verl key, exported with +).",
    )


class ActorSection(_Section):
    strategy: Strategy = Strategy.fsdp
    ppo_mini_batch_size: int = Field(256, gt=0, le=1_000_000)
    ppo_micro_batch_size_per_gpu: int | None = Field(None, gt=0, le=1_000_000)
    ppo_epochs: int = Field(1, gt=0, le=1000)
    clip_ratio: float = Field(0.2, gt=0, le=10)
    entropy_coeff: float = Field(0.0, ge=0, le=10)
    use_kl_loss: bool = False
    kl_loss_coef: float = Field(0.001, ge=0, le=100)
    kl_loss_type: KLType = KLType.low_var_kl
    grad_clip: float = Field(1.0, gt=0)
    optim: OptimSection = Field(default_factory=lambda: OptimSection(lr=1e-6))
    fsdp_config: FsdpConfig = Field(default_factory=FsdpConfig)


class RefSection(_Section):
    """The reference policy's own FSDP engine settings (its model is the actor's section)."""

    fsdp_config: _Precision = Field(default_factory=_Precision)


class RolloutSection(_Section):
    name: RolloutName = Field(
        RolloutName.vllm,
        description="verl's rollout engine (mandatory in verl); attnboard always generates with the actor's HF model.",
    )
    n: int = Field(1, gt=0, le=1024)
    temperature: float = Field(1.0, ge=0, le=100)
    top_p: float = Field(1.0, gt=0, le=1)
    do_sample: bool = True
    dtype: DType = Field(DType.bfloat16, description="Dtype the rollout generates in (verl: bfloat16).")


class ActorRolloutRef(_Section):
    model: ModelSection = Field(default_factory=ModelSection)
    actor: ActorSection = Field(default_factory=ActorSection)
    ref: RefSection = Field(default_factory=RefSection)
    rollout: RolloutSection = Field(default_factory=RolloutSection)


class CriticSection(_Section):
    strategy: Strategy = Strategy.fsdp
    model: ModelSection = Field(default_factory=ModelSection)
    optim: CriticOptimSection = Field(default_factory=CriticOptimSection)
    fsdp: _Precision = Field(default_factory=_Precision)
    ppo_micro_batch_size_per_gpu: int | None = Field(None, gt=0, le=1_000_000)
    cliprange_value: float = Field(0.5, gt=0, le=100)
    grad_clip: float = Field(1.0, gt=0)
    ulysses_sequence_parallel_size: int = Field(1, gt=0, le=1024)
    turbo_cp_size: int = Field(1, gt=0, le=1024, description="FSDP-Turbo's own CP group size for the critic (fsdp_turbo only).")


class KLCtrl(_Section):
    kl_coef: float = Field(0.001, ge=0, le=100)


class AlgorithmSection(_Section):
    adv_estimator: AdvEstimator = AdvEstimator.gae
    gamma: float = Field(1.0, ge=0, le=1)
    lam: float = Field(1.0, ge=0, le=1)
    use_kl_in_reward: bool = False
    kl_penalty: KLType = KLType.kl
    kl_ctrl: KLCtrl = Field(default_factory=KLCtrl)
    norm_adv_by_std_in_grpo: bool = True


TrainFile = Annotated[str, Field(min_length=1, max_length=4096)]


class DataSection(_Section):
    train_files: TrainFile | list[TrainFile] = Field(
        "~/data/rlhf/gsm8k/train.parquet",
        description="A built-in task (builtin:count, builtin:copy, ...) or a verl-format parquet file, or a list "
                    "of parquet files (read one after the other into one dataset, as verl does).",
    )
    train_batch_size: int = Field(1024, gt=0, le=1_000_000)
    max_prompt_length: int = Field(512, gt=0, le=1_000_000)
    max_response_length: int = Field(512, gt=0, le=1_000_000)

    @field_validator("train_files")
    @classmethod
    def _some_files(cls, v: Any) -> Any:
        if isinstance(v, list) and not 1 <= len(v) <= MAX_TRAIN_FILES:
            raise ValueError(f"give 1 to {MAX_TRAIN_FILES} files, got {len(v)}")
        return v


class ResumeMode(str, Enum):
    """verl's ``trainer.resume_mode``."""

    auto = "auto"
    disable = "disable"
    resume_path = "resume_path"


DEFAULT_LOCAL_DIR = "checkpoints/${trainer.project_name}/${trainer.experiment_name}"
"""verl's ``trainer.default_local_dir``, an OmegaConf interpolation. The spec keeps it as this text (so a
spec at verl's defaults equals ``RunSpec()`` and exports as verl's own default); ``checkpoint_folder``
resolves it against the spec when the engine uses it."""


class TrainerSection(_Section):
    device: Device = Device.cuda
    n_gpus_per_node: int = Field(8, gt=0, le=1024)
    nnodes: int = Field(1, gt=0, le=1024)
    total_epochs: int = Field(30, gt=0, le=1_000_000)
    total_training_steps: int | None = Field(None, gt=0, le=10_000_000)
    project_name: str = Field("verl_examples", max_length=200)
    experiment_name: str = Field("gsm8k", max_length=200)
    save_freq: int = Field(
        -1, ge=-1, le=10_000_000,
        description="Save a checkpoint every N steps and at the last step; -1 (verl's default) or 0: never.",
    )
    resume_mode: ResumeMode = Field(
        ResumeMode.auto,
        description="auto: resume from the newest complete checkpoint in default_local_dir; disable: start fresh; "
                    "resume_path: resume from resume_from_path.",
    )
    resume_from_path: str | None = Field(
        None, min_length=1, max_length=4096,
        description="With resume_mode=resume_path: a global_step_N folder, or a checkpoint folder (its newest "
                    "complete checkpoint is used).",
    )
    default_local_dir: str = Field(
        DEFAULT_LOCAL_DIR, min_length=1, max_length=4096,
        description="Checkpoint folder; a relative path is placed under the run's artefact folder.",
    )
    max_actor_ckpt_to_keep: int | None = Field(
        None, gt=0, le=1_000_000, description="Actor checkpoints kept (the newest); null keeps all.")
    max_critic_ckpt_to_keep: int | None = Field(
        None, gt=0, le=1_000_000, description="Critic checkpoints kept (the newest); null keeps all.")


class CustomRewardFunction(_Section):
    name: str | None = Field(
        None,
        max_length=200,
        description="A reward function from attnboard's registry; null picks one by the data's data_source.",
    )


class DebugSection(_Section):
    output_attentions: bool = Field(False, description="Ask every forward for attention weights (needs eager).")


class AttnboardSection(_Section):
    """Keys verl does not have."""

    fallback_policy: FallbackPolicy = Field(
        FallbackPolicy.strict,
        description="strict: fail as verl does; fallback: flash_attention_2 -> sdpa -> eager, each step recorded.",
    )
    seed: int = Field(42, ge=0, le=2**31 - 1)
    max_restarts: int = Field(
        2, ge=0, le=100,
        description="Times a run whose rank or engine host died restarts from its newest complete checkpoint "
                    "(from the start when it has none); 0: a death fails the run.",
    )
    rank_cpus: int = Field(
        0, ge=0, le=1024,
        description="CPUs each rank asks Ray for and runs torch threads on; 0: derived from the cluster (on cpu, "
                    "its CPUs shared among the run's ranks, at most a node's; on cuda, 1).",
    )
    debug: DebugSection = Field(default_factory=DebugSection)


PASSTHROUGH = "verl_passthrough"
PASSTHROUGH_NOTE = "passed through to verl, not run by attnboard"


class RunSpecFields(_Section):
    """``RunSpec``'s fields and derived views. ``worker.spec.runspec.RunSpec`` adds the pass-through's check,
    which reads the keys these fields make (``worker.spec.keys``), so the fields live below it."""

    model_engine: ModelEngine = Field(
        ModelEngine.dp,
        description="verl's training engine (its model_engine config group): dp (FSDP/FSDP2), megatron, torchtitan, "
                    "veomni, automodel (newer verl). It decides which key chooses attention; attnboard's own engine "
                    "runs dp semantics.",
    )
    actor_rollout_ref: ActorRolloutRef = Field(default_factory=ActorRolloutRef)
    critic: CriticSection = Field(default_factory=CriticSection)
    algorithm: AlgorithmSection = Field(default_factory=AlgorithmSection)
    data: DataSection = Field(default_factory=DataSection)
    trainer: TrainerSection = Field(default_factory=TrainerSection)
    custom_reward_function: CustomRewardFunction = Field(default_factory=CustomRewardFunction)
    attnboard: AttnboardSection = Field(default_factory=AttnboardSection)
    verl_passthrough: dict[str, Any] = Field(
        default_factory=dict,
        description=PASSTHROUGH_NOTE + ": keys of verl's config that attnboard does not model, as dotted keys "
                    "(one that verl's config lacks starts with +), exported to verl unchanged.",
    )

    # ---- derived views used throughout

    @property
    def world_size(self) -> int:
        return self.trainer.nnodes * self.trainer.n_gpus_per_node

    @property
    def has_critic(self) -> bool:
        """The estimator reads a critic's values (its registry entry says so; verl's ``need_critic``)."""
        return advantage.needs_critic(self.algorithm.adv_estimator)

    @property
    def actor_sp(self) -> int:
        """The sequence-parallel size the actor (and rollout, reference) runs with: verl's or Turbo's."""
        fsdp = self.actor_rollout_ref.actor.fsdp_config
        return max(fsdp.ulysses_sequence_parallel_size, fsdp.turbo_cp_size)

    @property
    def critic_sp(self) -> int:
        return max(self.critic.ulysses_sequence_parallel_size, self.critic.turbo_cp_size)

    def precision(self, role: str) -> tuple[str, str]:
        """(compute dtype, master-weights dtype) of a role as torch dtype names, e.g. ("bfloat16", "float32").
        Rollout generates in ``rollout.dtype`` with the actor's weights (master dtype: the actor's)."""
        arr = self.actor_rollout_ref
        section = {"actor": arr.actor.fsdp_config, "reference": arr.ref.fsdp_config, "critic": self.critic.fsdp,
                   "rollout": arr.actor.fsdp_config}[role]
        compute = arr.rollout.dtype if role == "rollout" else section.dtype
        return torch_dtype_name(compute), torch_dtype_name(section.model_dtype)

    @property
    def total_steps(self) -> int | None:
        return self.trainer.total_training_steps

