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
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from worker.attention import BUILTIN_NAMES, VALID_DESCRIPTION, is_valid_name
from worker.pydantic_errors import valid_for

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


class AdvEstimator(str, Enum):
    gae = "gae"
    grpo = "grpo"


class KLType(str, Enum):
    """KL estimators (verl ``kl_penalty`` / ``kl_loss_type``); see http://joschu.net/blog/kl-approx.html."""

    kl = "kl"
    abs = "abs"
    mse = "mse"
    low_var_kl = "low_var_kl"


class RolloutName(str, Enum):
    """verl's rollout engines. attnboard always generates with the actor's HF model (see resolution)."""

    hf = "hf"
    vllm = "vllm"
    sglang = "sglang"


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


class DataSection(_Section):
    train_files: str = Field(
        "~/data/rlhf/gsm8k/train.parquet",
        min_length=1,
        max_length=4096,
        description="A built-in task (builtin:count, builtin:copy, ...) or a verl-format parquet file.",
    )
    train_batch_size: int = Field(1024, gt=0, le=1_000_000)
    max_prompt_length: int = Field(512, gt=0, le=1_000_000)
    max_response_length: int = Field(512, gt=0, le=1_000_000)

    @field_validator("train_files", mode="before")
    @classmethod
    def _one_file(cls, v: Any) -> Any:
        # verl accepts a list of files; attnboard runs one data source, given once.
        if isinstance(v, list) and len(v) == 1:
            return v[0]
        return v


class TrainerSection(_Section):
    device: Device = Device.cuda
    n_gpus_per_node: int = Field(8, gt=0, le=1024)
    nnodes: int = Field(1, gt=0, le=1024)
    total_epochs: int = Field(30, gt=0, le=1_000_000)
    total_training_steps: int | None = Field(None, gt=0, le=10_000_000)
    project_name: str = Field("verl_examples", max_length=200)
    experiment_name: str = Field("gsm8k", max_length=200)


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
    debug: DebugSection = Field(default_factory=DebugSection)


class RunSpec(_Section):
    """A PPO run. Defaults are verl 0.9.1's, so an imported command means what verl would run."""

    actor_rollout_ref: ActorRolloutRef = Field(default_factory=ActorRolloutRef)
    critic: CriticSection = Field(default_factory=CriticSection)
    algorithm: AlgorithmSection = Field(default_factory=AlgorithmSection)
    data: DataSection = Field(default_factory=DataSection)
    trainer: TrainerSection = Field(default_factory=TrainerSection)
    custom_reward_function: CustomRewardFunction = Field(default_factory=CustomRewardFunction)
    attnboard: AttnboardSection = Field(default_factory=AttnboardSection)

    # ---- derived views used throughout

    @property
    def world_size(self) -> int:
        return self.trainer.nnodes * self.trainer.n_gpus_per_node

    @property
    def has_critic(self) -> bool:
        return self.algorithm.adv_estimator == AdvEstimator.gae.value

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


SPEC_KEYS: tuple[str, ...] = tuple(_schema_keys(RunSpec))
"""Every leaf key of a spec, dotted (override_config counts as one leaf)."""

# verl's deprecated aliases, accepted on input and rewritten to their current key.
ALIASES: dict[str, str] = {
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size": "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size",
}


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


def _unknown_key_issue(key: str, value: Any) -> Issue:
    near = nearest_key(key)
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
    flat = {}
    for key, value in _flatten_schema_aware(tree).items():
        flat[ALIASES.get(key, key)] = value
    return unflatten(flat)


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
        node: Any = tree
        for part in dotted.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        attn = node.get("attn_implementation") if isinstance(node, dict) else None
        if attn is not None and (not isinstance(attn, str) or not is_valid_name(attn)):
            issues.append(Issue(f"{dotted}.attn_implementation", attn,
                                f"unknown attn_implementation {_short(attn)}; valid: {VALID_DESCRIPTION}",
                                valid=list(BUILTIN_NAMES)))
    return issues


def _issues_from_validation(exc: ValidationError) -> list[Issue]:
    issues: list[Issue] = []
    for err in exc.errors(include_url=False):
        loc = ".".join(str(p) for p in err["loc"])
        value = err.get("input")
        if err["type"] == "extra_forbidden":
            issues.append(_unknown_key_issue(loc, value))
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
    return issues


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# --------------------------------------------------------------------------------------------
# Cross-field rules


@dataclass(frozen=True)
class ModelInfo:
    """What the validation needs to know about a model; read from its config by the caller (I/O edge)."""

    architecture: str
    num_attention_heads: int
    num_key_value_heads: int
    hidden_size: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


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
) -> list[Issue]:
    """Cross-field rules verl enforces (and a few it should). Returns errors and warnings, errors first."""
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
    if spec.algorithm.adv_estimator == AdvEstimator.grpo.value and n < 2:
        issues.append(Issue("actor_rollout_ref.rollout.n", n,
                            "grpo normalises rewards within a group of samples per prompt: rollout.n must be >= 2",
                            valid=">= 2"))
    if spec.algorithm.use_kl_in_reward and actor.use_kl_loss:
        issues.append(Issue("actor_rollout_ref.actor.use_kl_loss", True,
                            "KL is applied twice: algorithm.use_kl_in_reward and actor.use_kl_loss are both true",
                            severity="warning"))

    issues.sort(key=lambda i: i.severity != "error")
    return issues


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0][:32]


def validate_spec(data: Any, **model_info: Any) -> tuple[RunSpec, list[Issue]]:
    """parse_spec + check_spec: raises SpecError on any error, returns the spec and its warnings."""
    spec = parse_spec(data)
    issues = check_spec(spec, **model_info)
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
