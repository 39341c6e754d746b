"""The new-run form: which spec field gets which input, in which group, with which help; form data
to spec data and back. Pure: no I/O, no web framework.

Every input is named by its dotted spec key (``actor_rollout_ref.actor.strategy``), so a
``SpecError`` issue's ``field`` is also the name of the input to show it beside. The fields are
derived from ``RunSpec`` itself: a key added to the spec appears on the form without edits here.
"""

from __future__ import annotations

import functools
import types
import typing
from dataclasses import dataclass
from enum import Enum
from typing import Any, Literal

import yaml
from pydantic import BaseModel

from worker.core import yaml_guard
from worker.core.implementations import BUILTIN_NAMES
from worker.ppo import advantage
from worker.spec import PASSTHROUGH, PASSTHROUGH_NOTE, SPEC_KEYS, Issue, RunSpec, spec_to_flat, spec_to_tree, tree_get
from worker.spec.schema import DTYPE_NAMES, DType

Widget = Literal["text", "number", "checkbox", "select", "dtype", "attention", "mapping", "passthrough"]

ATTN_SUFFIX = ".override_config.attn_implementation"
OVERRIDE_KEYS = ("actor_rollout_ref.model.override_config", "critic.model.override_config")

ATTENTION_HELP: dict[str, str] = {
    "": "verl's default: flash_attention_2",
    "eager": "plain PyTorch; debugging, output_attentions and the fallback when nothing else works",
    "sdpa": "PyTorch fused scaled_dot_product_attention; broad compatibility",
    "flash_attention_2": "fastest; needs an Ampere+ GPU (sm80) and the flash-attn package",
    "flash_attention_3": "needs a Hopper GPU (sm90) and flash-attn 3",
    "flash_attention_4": "newest flash-attn kernels",
    "flex_attention": "torch flex_attention; no backward on CPU",
}


@dataclass(frozen=True)
class Group:
    key: str
    title: str
    help: str
    prefixes: tuple[str, ...]


def estimators_help() -> str:
    """What the engine's advantage estimators need, from their registry entries."""
    def named(needs: str) -> str:
        return ", ".join(e.name.value for e in advantage.ESTIMATORS.values() if getattr(e, needs))

    return (f"The engine runs {', '.join(advantage.names())}. {named('critic')} trains a critic; "
            f"{named('group')} compare the samples of each prompt (rollout.n >= 2); "
            f"{named('baseline')} subtracts the score of a greedy rollout.")


# Order is the order on the page; a key belongs to the first group with a matching prefix.
GROUPS: tuple[Group, ...] = (
    Group("model", "Model", "A built-in preset (builtin:tiny-llama, builtin:tiny-qwen2) or a local Hugging Face folder.",
          ("actor_rollout_ref.model.path", "critic.model.path")),
    Group("attention", "Other Hugging Face config keys (override_config)",
          "actor, rollout and reference share one setting; the critic has its own. Empty keeps verl's default.",
          OVERRIDE_KEYS),
    Group("precision", "Precision",
          "verl's default: bf16 forward/backward over fp32 master weights. FlashAttention needs bf16 or fp16 compute.",
          ("actor_rollout_ref.actor.fsdp_config.dtype", "actor_rollout_ref.actor.fsdp_config.model_dtype",
           "actor_rollout_ref.ref", "actor_rollout_ref.rollout.dtype", "critic.fsdp")),
    Group("strategy", "Engine, strategy and sequence parallelism",
          "verl's model_engine decides which key chooses attention (dp: override_config; veomni, torchtitan, megatron, "
          "automodel: their own, kept in the pass-through keys); attnboard's engine runs dp semantics. fsdp_turbo with "
          "Ulysses > 1 forces eager attention; plain fsdp/fsdp2 Ulysses needs use_remove_padding.",
          ("model_engine", "actor_rollout_ref.actor.strategy", "critic.strategy", "actor_rollout_ref.actor.fsdp_config",
           "critic.ulysses_sequence_parallel_size", "actor_rollout_ref.model", "critic.model")),
    Group("algorithm", "Algorithm", estimators_help(), ("algorithm",)),
    Group("actor", "Actor and critic optimisation", "verl 0.9.1 defaults.", ("actor_rollout_ref.actor", "critic")),
    Group("rollout", "Rollout", "Generation uses the actor's weights.", ("actor_rollout_ref.rollout",)),
    Group("data", "Data and reward", "A built-in task (builtin:count, builtin:copy) or a verl-format parquet file.",
          ("data", "custom_reward_function")),
    Group("checkpoints", "Checkpoints and restarts",
          "verl's keys: a checkpoint every save_freq steps (-1: none) under default_local_dir (relative: in the run's "
          "folder). A run whose rank or engine host dies restarts from its newest one, at most max_restarts times.",
          ("trainer.save_freq", "trainer.resume_mode", "trainer.resume_from_path", "trainer.default_local_dir",
           "trainer.max_actor_ckpt_to_keep", "trainer.max_critic_ckpt_to_keep", "attnboard.max_restarts")),
    Group("trainer", "Trainer", "Where and how long the run goes; rank_cpus 0 shares the cluster's CPUs among the ranks.",
          ("trainer", "attnboard.seed", "attnboard.rank_cpus")),
    Group("policy", "Fallback policy and debug",
          "strict fails as verl does; fallback walks flash_attention_2 -> sdpa -> eager and records each step.",
          ("attnboard",)),
    Group("passthrough", "Passed through to verl, not run by attnboard",
          "Keys of verl's config that attnboard does not model (an import keeps them all), one dotted key per "
          "line; a key verl's config lacks starts with +. Exported to verl unchanged.", (PASSTHROUGH,)),
)


@dataclass(frozen=True)
class FormField:
    key: str
    label: str
    widget: Widget
    group: str
    options: tuple[str, ...] = ()
    optional: bool = False
    step: str | None = None
    help: str = ""
    listable: bool = False
    """A text input that also takes a list, written ``[a.parquet, b.parquet]`` (data.train_files)."""

    @property
    def input_id(self) -> str:
        return "f-" + self.key.replace(".", "-").replace("_", "-")


def _leaf_model_field(key: str) -> Any:
    model: type[BaseModel] = RunSpec
    parts = key.split(".")
    for part in parts[:-1]:
        model = model.model_fields[part].annotation  # type: ignore[assignment]
    return model.model_fields[parts[-1]]


def _unwrap_optional(annotation: Any) -> tuple[Any, bool]:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0], len(args) < len(typing.get_args(annotation))
    return annotation, False


def _takes_list(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (typing.Union, types.UnionType) and any(
        typing.get_origin(a) is list for a in typing.get_args(annotation))


# Plain names for the keys whose last part alone says little (verl's ``dtype`` is the compute dtype).
LEAF_NAMES = {"dtype": "compute dtype", "model_dtype": "weights dtype", "path": "model path",
              "adv_estimator": "advantage estimator", "n_gpus_per_node": "ranks per node (GPUs, or CPU processes)"}
# The role a section configures: actor_rollout_ref.<part> -> its role.
SECTION_OWNER = {"actor": "actor", "ref": "reference", "rollout": "rollout", "model": "actor / rollout / reference"}


def _label(key: str) -> str:
    parts = key.split(".")
    if key.endswith(ATTN_SUFFIX):
        return ("critic" if key.startswith("critic") else "actor / rollout / reference") + " attention"
    if key in OVERRIDE_KEYS:
        return ("critic" if key.startswith("critic") else "actor") + " other override_config keys"
    owner = {"critic": "critic", "custom_reward_function": "reward function"}.get(parts[0], "")
    if parts[0] == "actor_rollout_ref":
        owner = SECTION_OWNER.get(parts[1], "actor")
    name = LEAF_NAMES.get(parts[-1], parts[-1].replace("_", " "))
    return f"{owner} {name}".strip() if owner and parts[0] != "data" else name


def _field_for(key: str) -> FormField:
    info = _leaf_model_field(key)
    annotation, optional = _unwrap_optional(info.annotation)
    group = next(g.key for g in GROUPS if any(key == p or key.startswith(p + ".") for p in g.prefixes))
    help_text = info.description or ""
    if key in OVERRIDE_KEYS:
        return FormField(key, _label(key), "mapping", "attention", optional=True,
                         help="Any other Hugging Face config key, as a YAML mapping, e.g. {hidden_size: 64}.")
    if annotation is DType:  # one option per dtype: bf16, fp16, fp32 (verl's other spellings still parse)
        return FormField(key, _label(key), "dtype", group, DTYPE_CHOICES, optional, help=help_text)
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return FormField(key, _label(key), "select", group, tuple(m.value for m in annotation), optional, help=help_text)
    if annotation is bool:
        return FormField(key, _label(key), "checkbox", group, help=help_text)
    if annotation in (int, float):
        return FormField(key, _label(key), "number", group, optional=optional,
                         step="1" if annotation is int else "any", help=help_text)
    return FormField(key, _label(key), "text", group, optional=optional, help=help_text,
                     listable=_takes_list(info.annotation))


DTYPE_CHOICES = ("bf16", "fp16", "fp32")
"""The dtypes the form offers, one spelling each; ``DTYPE_NAMES`` maps every spelling verl accepts to its dtype."""


def dtype_options(value: str | None) -> list[tuple[str, str, bool]]:
    """A dtype select's options ``(value, label, selected)``: one per dtype, labelled bf16/fp16/fp32; the
    option of the value's dtype keeps the value's spelling (``bfloat16`` stays ``bfloat16``), so the spec
    the form submits is the spec it was filled from."""
    meant = DTYPE_NAMES.get(value or "")
    return [(value if meant == DTYPE_NAMES[choice] else choice, choice, meant == DTYPE_NAMES[choice])
            for choice in DTYPE_CHOICES]


PASSTHROUGH_FIELD = FormField(PASSTHROUGH, "verl keys", "passthrough", "passthrough", optional=True,
                              help=f"{PASSTHROUGH_NOTE}. A YAML mapping, e.g. data.val_files: ~/data/test.parquet")


def _all_fields() -> tuple[FormField, ...]:
    fields: list[FormField] = [PASSTHROUGH_FIELD]
    for key in SPEC_KEYS:
        if key in OVERRIDE_KEYS:
            attn_key = key + ".attn_implementation"
            fields.append(FormField(attn_key, _label(attn_key), "attention", "attention", ("", *BUILTIN_NAMES),
                                    optional=True, help=ATTENTION_HELP[""]))
        fields.append(_field_for(key))
    order = {g.key: i for i, g in enumerate(GROUPS)}
    return tuple(sorted(fields, key=lambda f: order[f.group]))


FIELDS: tuple[FormField, ...] = _all_fields()
FIELDS_BY_KEY: dict[str, FormField] = {f.key: f for f in FIELDS}


# The essentials, open on the form (beside the run's name and target); the rest is folded per group.
ESSENTIALS: tuple[Group, ...] = (
    Group("model", "Model", GROUPS[0].help, ("actor_rollout_ref.model.path", "critic.model.path")),
    Group("attention", "Attention per role",
          "actor, rollout and reference share one setting; the critic has its own. Empty keeps verl's default.",
          tuple(k + ".attn_implementation" for k in OVERRIDE_KEYS)),
    Group("training", "Algorithm, batch and steps", GROUPS[4].help,
          ("algorithm.adv_estimator", "data.train_batch_size", "trainer.total_training_steps")),
)
ESSENTIAL_KEYS = frozenset(k for g in ESSENTIALS for k in g.prefixes)


def essential_fields() -> list[tuple[Group, list[FormField]]]:
    return [(g, [FIELDS_BY_KEY[k] for k in g.prefixes]) for g in ESSENTIALS]


def grouped_fields() -> list[tuple[Group, list[FormField]]]:
    """The folded groups: every field that is not an essential, in its group (groups left empty go)."""
    groups = [(g, [f for f in FIELDS if f.group == g.key and f.key not in ESSENTIAL_KEYS]) for g in GROUPS]
    return [(g, fields) for g, fields in groups if fields]


def same_value(f: FormField, a: Any, b: Any) -> bool:
    """Two values of one input mean the same (``bf16`` is ``bfloat16``; ``4`` is ``4.0``)."""
    if f.widget == "dtype":
        return DTYPE_NAMES.get(str(a), a) == DTYPE_NAMES.get(str(b), b)
    if f.widget == "number":
        try:
            return float(a) == float(b)
        except (TypeError, ValueError):
            pass
    return (a or "") == (b or "") if f.widget != "checkbox" else bool(a) == bool(b)


def changed_counts(values: dict[str, Any], defaults: dict[str, Any]) -> dict[str, int]:
    """Per folded group, how many of its inputs differ from ``defaults`` (verl's: ``default_values()``)."""
    return {g.key: sum(not same_value(f, values.get(f.key), defaults.get(f.key)) for f in fields)
            for g, fields in grouped_fields()}


# --------------------------------------------------------------------------------------------
# Form data <-> spec data


class FormError(ValueError):
    def __init__(self, issues: list[Issue]):
        self.issues = issues
        super().__init__("; ".join(f"{i.field}: {i.message}" for i in issues))


def form_to_spec_data(form: dict[str, list[str]]) -> dict[str, Any]:
    """Submitted form (each name -> its values, in order) -> dotted spec data for ``parse_spec``.

    Empty optional inputs are left out (the spec default applies), a checkbox is its last value
    (a hidden ``false`` precedes it), a mapping input is parsed as a YAML mapping. Raises
    FormError for values no spec could hold, naming the input."""
    data: dict[str, Any] = {}
    issues: list[Issue] = []
    for f in FIELDS:
        values = form.get(f.key)
        if not values:
            continue
        raw = values[-1].strip()
        if f.widget == "checkbox":
            data[f.key] = raw == "true"
        elif f.widget in ("mapping", "passthrough"):
            if not raw:
                continue
            parsed = _yaml_mapping(f, raw, issues)
            if parsed is None:
                continue
            if f.widget == "passthrough":
                data[f.key] = parsed
                continue
            if "attn_implementation" in parsed:
                issues.append(Issue(f.key, raw, "set attn_implementation with the attention selector above"))
                continue
            for sub, value in parsed.items():
                data[f"{f.key}.{sub}"] = value
        elif f.listable and raw.startswith("["):
            try:
                parsed = yaml_guard.safe_load(raw)  # bounded: the browser's text is untrusted
            except (yaml.YAMLError, yaml_guard.InputTooLarge) as exc:
                issues.append(Issue(f.key, raw, f"not a list [a, b]: {str(exc).splitlines()[0]}"))
                continue
            data[f.key] = parsed
        elif raw == "" and (f.optional or f.widget == "attention"):
            continue
        elif f.widget == "number" and raw == "":
            issues.append(Issue(f.key, raw, "required: enter a number"))
        else:
            data[f.key] = raw
    if issues:
        raise FormError(issues)
    return data


_MAPPING_EXAMPLES = {"mapping": "a YAML mapping of config keys to values, e.g. {hidden_size: 64}",
                     "passthrough": "a YAML mapping of dotted verl keys to values, e.g. data.val_files: ~/data/test.parquet"}


def _yaml_mapping(f: FormField, raw: str, issues: list[Issue]) -> dict[str, Any] | None:
    """A mapping input's YAML, or None with the issue recorded."""
    try:
        parsed = yaml_guard.safe_load(raw)  # bounded: the browser's text is untrusted
    except (yaml.YAMLError, yaml_guard.InputTooLarge) as exc:
        issues.append(Issue(f.key, raw[:200], f"not a YAML mapping: {str(exc).splitlines()[0]}"))
        return None
    if not isinstance(parsed, dict):
        issues.append(Issue(f.key, raw[:200], f"must be {_MAPPING_EXAMPLES[f.widget]}"))
        return None
    return parsed


def spec_to_form_values(spec: RunSpec) -> dict[str, Any]:
    """A spec -> the value of every input (strings, booleans for checkboxes)."""
    flat = spec_to_flat(spec)
    tree = spec_to_tree(spec)
    values: dict[str, Any] = {}
    for f in FIELDS:
        if f.widget == "mapping":
            section, _ = f.key.split(".", 1)
            override = dict(tree[section]["model"]["override_config"])
            override.pop("attn_implementation", None)
            values[f.key] = yaml.safe_dump(override, default_flow_style=True).strip() if override else ""
        elif f.widget == "attention":
            values[f.key] = flat.get(f.key) or ""
        elif f.widget == "passthrough":
            passthrough = spec.verl_passthrough
            values[f.key] = yaml.safe_dump(passthrough, default_flow_style=False, sort_keys=False,
                                           allow_unicode=True).strip() if passthrough else ""
        elif isinstance(tree_get(tree, f.key), list):
            values[f.key] = yaml.safe_dump(tree_get(tree, f.key), default_flow_style=True).strip()
        else:
            value = flat.get(f.key)
            values[f.key] = value if f.widget == "checkbox" else ("" if value is None else str(value))
    return values


@functools.cache
def default_values() -> dict[str, Any]:
    """The value of every input for verl's defaults (``RunSpec()``); shared, not to be changed."""
    return spec_to_form_values(RunSpec())


def issues_by_field(issues: list[Issue]) -> dict[str, list[Issue]]:
    """Issues keyed by the input they belong to; an issue on an unknown or sub-key goes to its
    nearest input (``...override_config.hidden_size`` -> the override mapping input)."""
    out: dict[str, list[Issue]] = {}
    for issue in issues:
        key = issue.field
        while key and key not in FIELDS_BY_KEY:
            key = key.rpartition(".")[0]
        out.setdefault(key or "(spec)", []).append(issue)
    return out
