"""The run spec: a PPO run in verl's vocabulary, plus the few keys attnboard adds.

The tree mirrors verl's Hydra config (``actor_rollout_ref.model.override_config`` and so on) and its
defaults are verl 0.9.1's (``verl/trainer/config/_generated_ppo_trainer.yaml``), so a spec means what
verl would run. Keys verl does not have live under ``attnboard.*``.

Pure logic: no I/O. ``parse_spec`` turns untrusted JSON/YAML data into a ``RunSpec`` or raises
``SpecError`` listing every problem with its dotted field, the bad value and what is valid;
``check_spec`` adds the cross-field rules (batch arithmetic, Ulysses sizes, strategy conflicts).
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass
from enum import Enum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from worker.core.implementations import BUILTIN_NAMES, VALID_DESCRIPTION, is_valid_name
from worker.core.pydantic_errors import valid_for
from worker.core.vocabulary import AdvEstimator, KLType, ModelInfo  # shared with the PPO math and the model readers
from worker.ppo import advantage
from worker.spec.engines import (
    ANY_ENGINE_DEFAULTS,
    CONFIG_GROUPS,
    RETIRED,
    ROLLOUT_MODE_SYNC_ERROR,
    VERL_CONFIG_ENGINES,
    ModelEngine,
    engine_keys,
    key_outside_engine,
    retired_message,
)
from worker.spec.verl_defaults import VERL_DEFAULTS, VERL_VERSION

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


class RunSpec(_Section):
    """A PPO run. Defaults are verl 0.9.1's, so an imported command means what verl would run."""

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

    @field_validator("verl_passthrough")
    @classmethod
    def _canonical_passthrough(cls, value: dict[str, Any]) -> dict[str, Any]:
        lifted, passthrough, issues = split_passthrough(value)
        if issues:
            raise ValueError("; ".join(f"{i.field}: {i.message}" for i in issues))
        if lifted:
            raise ValueError(f"{', '.join(lifted)}: modelled by attnboard; set {'them' if len(lifted) > 1 else 'it'} "
                             "in the spec, not in verl_passthrough")
        return passthrough

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


# --------------------------------------------------------------------------------------------
# Dotted keys


def flatten(tree: dict[str, Any], prefix: str = "", *, stop_at: frozenset[str] = frozenset()) -> dict[str, Any]:
    """``{"a": {"b": 1}} -> {"a.b": 1}``. Dicts under a key in ``stop_at`` are expanded too
    (override_config sub-keys become ``...override_config.attn_implementation``) unless empty."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, dotted + ".", stop_at=stop_at))
        else:
            out[dotted] = value
    return out


def unflatten(flat: dict[str, Any]) -> dict[str, Any]:
    """``{"a.b": 1} -> {"a": {"b": 1}}``; nested dict values are merged, later keys win."""
    tree: dict[str, Any] = {}
    for dotted, value in flat.items():
        parts = str(dotted).split(".")
        node = tree
        for part in parts[:-1]:
            nxt = node.get(part)
            if not isinstance(nxt, dict):
                nxt = node[part] = {}
            node = nxt
        leaf = parts[-1]
        if isinstance(value, dict) and isinstance(node.get(leaf), dict):
            node[leaf] = _merge(node[leaf], value)
        else:
            node[leaf] = value
    return tree


def tree_get(tree: dict[str, Any], dotted: str) -> Any:
    """``tree_get({"a": {"b": 1}}, "a.b") -> 1``; None where a part of the path is missing."""
    node: Any = tree
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


OPEN_DICT_FIELDS = ("actor_rollout_ref.model.override_config", "critic.model.override_config")
"""Fields whose sub-keys are free (any HF config key); everything else is a closed schema."""


def _schema_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    keys: list[str] = []
    for name, info in model.model_fields.items():
        ann = info.annotation
        dotted = prefix + name
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            keys.extend(_schema_keys(ann, dotted + "."))
        else:
            keys.append(dotted)
    return keys


SPEC_KEYS: tuple[str, ...] = tuple(k for k in _schema_keys(RunSpec) if k != PASSTHROUGH)
"""Every leaf key attnboard models, dotted (override_config counts as one leaf; ``verl_passthrough`` is not one)."""

# verl's deprecated aliases, accepted on input and rewritten to their current key.
ALIASES: dict[str, str] = {
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size":
        "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size",
}


VERL_NAMES: dict[str, str] = {
    spec_key: verl_key
    for spec_key, verl_key in (
        ("actor_rollout_ref.actor.fsdp_config.turbo_cp_size",
         "actor_rollout_ref.actor.fsdp_config.turbo_config.distributed.ulysses_parallel_size"),
        ("critic.turbo_cp_size", "critic.fsdp.turbo_config.distributed.ulysses_parallel_size"),
    )
    if spec_key in SPEC_KEYS and verl_key in VERL_DEFAULTS
}
"""Spec keys that verl spells differently: FSDP-Turbo's CP group size is verl's
``turbo_config.distributed.ulysses_parallel_size``. Read on import, written on export."""
SPEC_NAMES: dict[str, str] = {verl_key: spec_key for spec_key, verl_key in VERL_NAMES.items()}

DOTTED_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*(?:\.[A-Za-z0-9_\-]+)*$")
"""A dotted key as Hydra's override grammar reads one."""
_MODELLED = frozenset(SPEC_KEYS) - frozenset(OPEN_DICT_FIELDS)
_SECTIONS = frozenset(k.rsplit(".", i)[0] for k in SPEC_KEYS for i in range(1, k.count(".") + 1))
_VERL_SECTIONS = frozenset(k.rsplit(".", i)[0] for k in ANY_ENGINE_DEFAULTS for i in range(1, k.count(".") + 1))

KeyKind = Literal["spec", "open", "section", "verl", "hydra", "under_value", "unknown"]


def open_field(key: str) -> str | None:
    """The override_config field ``key`` is, or lies under."""
    return next((f for f in OPEN_DICT_FIELDS if key == f or key.startswith(f + ".")), None)


def classify_key(key: str) -> KeyKind:
    """What a dotted key (aliases already rewritten) is: a key attnboard models (``spec``), an
    override_config key (``open``), a section holding keys (``section``), a key of verl 0.9.1's config
    that attnboard does not model (``verl``, including keys under a verl key whose default is ``{}`` or
    null), Hydra's own (``hydra``), a sub-key of a verl value that has none (``under_value``), or none of
    these (``unknown``)."""
    key = SPEC_NAMES.get(key, key)
    if key in _MODELLED:
        return "spec"
    if open_field(key):
        return "open"
    if key in _SECTIONS or key in _VERL_SECTIONS:
        return "section"
    if key == "hydra" or key.startswith("hydra."):
        return "hydra"
    if key in ANY_ENGINE_DEFAULTS:
        return "verl"
    parts = key.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        ancestor = ".".join(parts[:cut])
        if ancestor in ANY_ENGINE_DEFAULTS:
            return "verl" if ANY_ENGINE_DEFAULTS[ancestor] in ({}, None) else "under_value"
        if ancestor in _MODELLED:
            return "under_value"
    return "unknown"


def nearest_verl_key(key: str) -> str | None:
    """The key of verl's config a typo most likely meant (``gpu_memory_utilisation`` -> ``..._utilization``)."""
    leaf = key.rsplit(".", 1)[-1]
    candidates = [k for k in VERL_DEFAULTS if k.startswith(key.split(".", 1)[0] + ".")] or list(VERL_DEFAULTS)
    found = difflib.get_close_matches(key, candidates, n=1, cutoff=0.85)
    if not found:
        found = [k for k in candidates if k.rsplit(".", 1)[-1] == leaf][:1]
    return found[0] if found else None


MAX_SUGGESTED_KEYS = 20
"""Unknown keys per spec that get a "did you mean" (string matching costs ~1.7 ms a key); later ones are named
without one, so a request of thousands of unknown keys costs no more than this many matches."""
MAX_UNKNOWN_KEYS = 100
"""Unknown keys per spec named one by one; past this, one issue counts the rest."""


def _more_unknown(field: str, count: int) -> Issue:
    return Issue(field, f"{count} unknown keys", f"{count - MAX_UNKNOWN_KEYS} more unknown keys are not listed "
                 f"(at most {MAX_UNKNOWN_KEYS} are named one by one)", valid=f"<= {MAX_UNKNOWN_KEYS} unknown keys")


MAX_PASSTHROUGH_KEYS = 2000
MAX_PASSTHROUGH_DEPTH = 16
_HYDRA_DICT_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _passthrough_value_problem(value: Any, depth: int = 0) -> str | None:
    """Why a value cannot go through to verl on a command line and back, or None."""
    if depth > MAX_PASSTHROUGH_DEPTH:
        return f"nested more than {MAX_PASSTHROUGH_DEPTH} levels deep"
    if value is None or isinstance(value, (bool, int)):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{value} cannot be stored (JSON has no NaN or Infinity)"
    if isinstance(value, str):
        if "\x00" in value:
            return "a NUL character cannot be passed on a command line"
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return "a lone surrogate (\\ud800-\\udfff) is not valid Unicode"
        return None
    if isinstance(value, list):
        return next((p for p in (_passthrough_value_problem(v, depth + 1) for v in value) if p), None)
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str) or not _HYDRA_DICT_KEY.match(k):
                return f"dict key {k!r} is not a name Hydra can write ({_HYDRA_DICT_KEY.pattern})"
            problem = _passthrough_value_problem(v, depth + 1)
            if problem:
                return problem
        return None
    return f"a {type(value).__name__} is not a value verl's config can hold"


def split_passthrough(raw: Any) -> tuple[dict[str, Any], dict[str, Any], list[Issue]]:
    """Pass-through data -> (keys attnboard models, found among them; the canonical pass-through; issues).

    The canonical form: one dotted key per value, dict values spread into sub-keys (an empty dict
    stays a value), ``+`` in front exactly when verl 0.9.1's config lacks the key (``++`` is read as
    ``+``). A key that attnboard models is handed back to be set in the spec; a key verl's config
    lacks needs the ``+`` (as on verl's command line), so a typo is an error naming the nearest key."""
    if not isinstance(raw, dict):
        return {}, {}, [Issue(PASSTHROUGH, raw, f"must be a mapping of dotted verl keys to values, got "
                                                f"{type(raw).__name__}")]
    lifted: dict[str, Any] = {}
    out: dict[str, Any] = {}
    issues: list[Issue] = []
    unknown = 0

    def add(given: str, value: Any, depth: int) -> None:
        nonlocal unknown
        where = f"{PASSTHROUGH}.{given}"
        plus = given.startswith("+")
        key = given.lstrip("+")
        if len(given) - len(key) > 2 or not DOTTED_KEY.match(key):
            issues.append(Issue(where, value, f"{given!r} is not a dotted key (such as data.val_files), "
                                              "optionally after + to add a key verl's config lacks"))
            return
        key = ALIASES.get(key, key)
        kind = classify_key(key)
        if kind in ("spec", "open"):
            lifted[SPEC_NAMES.get(key, key)] = value
            return
        nested = kind in ("section", "verl", "unknown", "hydra") and depth < MAX_PASSTHROUGH_DEPTH
        if isinstance(value, dict) and value and nested:
            for sub, sub_value in value.items():
                if not isinstance(sub, str) or not _HYDRA_DICT_KEY.match(sub):
                    issues.append(Issue(f"{where}.{sub}", sub_value, f"{sub!r} is not a key name"))
                    continue
                add(("+" if plus else "") + f"{key}.{sub}", sub_value, depth + 1)
            return
        if kind == "section":
            issues.append(Issue(where, value, f"{key} is a section of verl's config, not a value: give its keys"))
            return
        if kind == "under_value":
            issues.append(Issue(where, value, f"{key} lies under a key of verl's config that holds a value, "
                                              "not a section"))
            return
        if kind == "unknown" and (not plus or key.split(".", 1)[0] == "attnboard"):
            unknown += 1
            if unknown > MAX_UNKNOWN_KEYS:
                return
        if kind == "unknown" and key.split(".", 1)[0] == "attnboard":
            issues.append(_unknown_key_issue(key, value, suggest=unknown <= MAX_SUGGESTED_KEYS))
            return
        if kind == "unknown" and not plus:
            near = nearest_verl_key(key) if unknown <= MAX_SUGGESTED_KEYS else None
            hint = f"; did you mean {near}?" if near else ""
            issues.append(Issue(where, value, f"unknown key {key}: verl {VERL_VERSION}'s config lacks it; write "
                                              f"+{key} to add it{hint}", valid=near))
            return
        problem = _passthrough_value_problem(value)
        if problem:
            issues.append(Issue(where, _jsonable(value), problem))
            return
        out[("+" if needs_plus(key) else "") + key] = typed_like_verl(key, value)

    if len(raw) > MAX_PASSTHROUGH_KEYS:
        return {}, {}, [Issue(PASSTHROUGH, f"{len(raw)} keys", f"at most {MAX_PASSTHROUGH_KEYS} keys")]
    for given, value in raw.items():
        if not isinstance(given, str):
            issues.append(Issue(PASSTHROUGH, given, "keys must be strings"))
            continue
        add(given, value, 0)
    if unknown > MAX_UNKNOWN_KEYS:
        issues.append(_more_unknown(PASSTHROUGH, unknown))
    return lifted, out, issues


def needs_plus(key: str, engine: str | None = None) -> bool:
    """Whether verl's command line needs ``+key=`` (Hydra's struct mode): the key is not in verl's config under
    ``model_engine=engine`` (None: under any engine), nor a config group, nor one of Hydra's own."""
    if key in CONFIG_GROUPS:
        return False
    known = ANY_ENGINE_DEFAULTS if engine is None else engine_keys(engine)
    return key not in known and classify_key(key) != "hydra"


def typed_like_verl(key: str, value: Any, raw: str | None = None) -> Any:
    """A value typed as verl's generated config has ``key``: a string key given a number or a bool
    (``trainer.project_name=2024``) keeps its text (``raw``, the text as written, when there is one)."""
    if isinstance(ANY_ENGINE_DEFAULTS.get(key), str) and isinstance(value, (bool, int, float)):
        if raw is not None:
            return raw.strip()
        return ("true" if value else "false") if isinstance(value, bool) else repr(value)
    return value


def nearest_key(key: str) -> str | None:
    """The valid key a typo most likely meant: string similarity plus shared words (``total_steps`` ->
    ``total_training_steps``), preferring keys whose last component matches (``critic.lr`` -> ``critic.optim.lr``)."""

    def words(k: str) -> set[str]:
        return set(k.replace(".", "_").split("_")) - {""}

    def score(candidate: str) -> float:
        ratio = difflib.SequenceMatcher(None, key, candidate).ratio()
        shared = len(words(key) & words(candidate)) / max(len(words(key)), 1)
        same_leaf = key.rsplit(".", 1)[-1] == candidate.rsplit(".", 1)[-1]
        return ratio + 0.5 * shared + (0.5 if same_leaf else 0.0)

    best = max(SPEC_KEYS, key=score)
    return best if score(best) >= 0.9 else None


def keys_near(key: str) -> list[str]:
    """The valid keys of the deepest section of ``key`` that exists (``trainer.foo`` -> the ``trainer.*``
    keys), or the top-level sections when none does."""
    parts = key.split(".")
    for n in range(len(parts) - 1, 0, -1):
        prefix = ".".join(parts[:n]) + "."
        under = [k for k in SPEC_KEYS if k.startswith(prefix)]
        if under:
            return under
    return sorted({k.split(".", 1)[0] for k in SPEC_KEYS})


def _unknown_key_issue(key: str, value: Any, *, suggest: bool = True) -> Issue:
    near = nearest_key(key) if suggest else None
    hint = f"; did you mean {near!r}?" if near else ""
    return Issue(key, value, f"unknown key {key!r}{hint}", valid=near or keys_near(key))


# --------------------------------------------------------------------------------------------
# Parsing untrusted input


def _normalise(data: dict[str, Any]) -> dict[str, Any]:
    """Accept nested or dotted keys (or a mix) and rewrite verl's deprecated aliases."""
    flat_input: dict[str, Any] = {}
    for key, value in data.items():
        if not isinstance(key, str):
            raise SpecError([Issue(str(key), value, "keys must be strings")])
        flat_input[key] = value
    tree = unflatten(flat_input)
    raw_passthrough = tree.pop(PASSTHROUGH, {})
    flat = {}
    for key, value in _flatten_schema_aware(tree).items():
        flat[ALIASES.get(key, key)] = value
    # Keys of the pass-through that attnboard models are read as the spec's own (a spec stored before
    # attnboard modelled a key keeps meaning the same); given twice with two values is an error.
    lifted, passthrough, issues = split_passthrough(raw_passthrough)
    for key, value in lifted.items():
        if key in flat and flat[key] != value:
            issues.append(Issue(f"{PASSTHROUGH}.{key}", value, f"{key} is given twice, in the spec ({_short(flat[key])}) "
                                                               f"and in {PASSTHROUGH} ({_short(value)})"))
        flat[key] = value
    if issues:
        raise SpecError(issues)
    out = unflatten(flat)
    if passthrough:
        out[PASSTHROUGH] = passthrough
    return out


def _flatten_schema_aware(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Flatten, but keep open dicts (override_config) whole so their keys are not mistaken for schema keys."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if dotted in OPEN_DICT_FIELDS:
            out[dotted] = value if not isinstance(value, dict) else unflatten(value)
        elif isinstance(value, dict) and value:
            out.update(_flatten_schema_aware(value, dotted + "."))
        else:
            out[dotted] = value
    return out


def parse_spec(data: Any) -> RunSpec:
    """Untrusted data (nested or dotted keys) -> RunSpec, or SpecError naming every bad field."""
    if not isinstance(data, dict):
        raise SpecError([Issue("(spec)", data, f"a spec must be a mapping of keys to values, got {type(data).__name__}")])
    tree = _normalise(data)
    attn_issues = _attention_issues(tree)
    try:
        spec = RunSpec.model_validate(tree)
    except ValidationError as exc:
        issues = [i for i in _issues_from_validation(exc) if not i.field.endswith("override_config") or not attn_issues]
        raise SpecError(attn_issues + issues) from None
    return spec


def _attention_issues(tree: dict[str, Any]) -> list[Issue]:
    """Unknown attention names, reported on the exact key with the list of valid names."""
    issues = []
    for dotted in OPEN_DICT_FIELDS:
        node = tree_get(tree, dotted)
        attn = node.get("attn_implementation") if isinstance(node, dict) else None
        if attn is not None and (not isinstance(attn, str) or not is_valid_name(attn)):
            issues.append(Issue(f"{dotted}.attn_implementation", attn,
                                f"unknown attn_implementation {_short(attn)}; valid: {VALID_DESCRIPTION}",
                                valid=list(BUILTIN_NAMES)))
    return issues


def _issues_from_validation(exc: ValidationError) -> list[Issue]:
    issues: list[Issue] = []
    unknown = 0
    for err in exc.errors(include_url=False):
        loc = ".".join(str(p) for p in err["loc"])
        value = err.get("input")
        if err["type"] == "extra_forbidden":
            unknown += 1
            if unknown <= MAX_UNKNOWN_KEYS:
                issues.append(_unknown_key_issue(loc, value, suggest=unknown <= MAX_SUGGESTED_KEYS))
            continue
        message = err["msg"]
        if message.startswith("Value error, "):
            message = message[len("Value error, ") :]
        valid = valid_for(err)
        if err["type"] == "enum":
            message = f"{value!r} is not valid; valid: {', '.join(valid)}"
        elif err["type"] in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
            message = f"{_short(value)} is out of range: {message.lower()}"
        else:
            message = f"{_short(value)} is not valid: {message}"
        issues.append(Issue(loc, value, message, valid=valid))
    if unknown > MAX_UNKNOWN_KEYS:
        issues.append(_more_unknown("(spec)", unknown))
    return issues


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


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


def spec_to_tree(spec: RunSpec) -> dict[str, Any]:
    """The spec as plain nested data (enums as strings), JSON and YAML safe."""
    return spec.model_dump(mode="json")


def spec_to_flat(spec: RunSpec) -> dict[str, Any]:
    """The spec as dotted keys, with override_config sub-keys expanded (verl's command-line form)."""
    return flatten(spec_to_tree(spec))


_DEFAULT_FLAT = spec_to_flat(RunSpec())
