"""Under verl, per training engine and role: the key that chooses attention, its default, and what verl does with it.

Since verl 0.8 the ``model_engine`` config group decides which key an FSDP/Megatron/... worker reads
(read from verl 0.9.1's wheel: ``trainer/config/*``, ``workers/config/engine.py``, ``workers/engine/*``; automodel
from newer verl's ``automodel_actor.yaml``/``automodel_ref.yaml``):

- dp (FSDP/FSDP2): ``override_config.attn_implementation`` (default flash_attention_2); the reference is a copy of
  the actor's model config; the critic's value-head loader passes flash_attention_2 explicitly (#5210).
- VeOmni: ``actor_rollout_ref.actor.veomni.attn_implementation``; the reference's own key defaults to the actor's
  (``${oc.select:...}``); ``critic.veomni.attn_implementation`` is the critic's own and honoured.
  ``VeOmniEngineConfig.__post_init__`` renames flash_attention_{2,3,4} to ``veomni_flash_attention_{2,3,4}_with_sp``.
- TorchTitan: ``<role>.torchtitan.attn_type`` (default flex), asserted to be flex, flex_flash or varlen
  (``attn_type sdpa not supported (sdpa is not a valid language-model backend)``); no value-model engine.
- Megatron: ``<role>.megatron.override_transformer_config.attention_backend`` (default flash; the reference takes
  the actor's whole ``override_transformer_config``).
- Automodel: ``<role>.automodel_config.attn_implementation`` (sdpa, flash_attention_2, eager, te) passed explicitly
  to ``from_pretrained``, plus ``backend_config.attn`` (te, sdpa), which ``force_hf`` ignores for Qwen/Llama with
  ``ep_size <= 1``; no value-model engine.

``verl_engine_view(...)`` is pure: the spec's keys (modelled and passed through), the environment's device and
the model's architecture in, one ``EngineAttention`` per role out. attnboard's own engine runs dp semantics (it
reads ``override_config``), which the view says where it differs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from worker.attention.availability import Reason, Rule
from worker.core.implementations import DEFAULT_IMPL
from worker.spec.engines import ModelEngine, engine_default
from worker.spec.verl_defaults import VERL_VERSION
from worker.spec.verl_engine_keys import ENGINE_INHERITS

ROLES = ("actor", "reference", "critic")
SECTIONS = {"actor": "actor_rollout_ref.actor", "reference": "actor_rollout_ref.ref", "critic": "critic"}
OVERRIDE_KEYS = {"actor": "actor_rollout_ref.model.override_config.attn_implementation",
                 "reference": "actor_rollout_ref.model.override_config.attn_implementation",
                 "critic": "critic.model.override_config.attn_implementation"}

VEOMNI_RENAMES: dict[str, str] = {f"flash_attention_{v}": f"veomni_flash_attention_{v}_with_sp" for v in (2, 3, 4)}
"""``VeOmniEngineConfig.__post_init__``: logged at info level only ("Replacing attn_implementation from ...")."""
TORCHTITAN_ATTN_TYPES = ("flex", "flex_flash", "varlen")
MEGATRON_BACKENDS = ("flash", "fused", "unfused", "local", "auto")
AUTOMODEL_IMPLEMENTATIONS = ("sdpa", "flash_attention_2", "eager", "te")
AUTOMODEL_HF_ARCHITECTURES = ("qwen", "llama")

VALUE_MODEL_BACKENDS = ("dp", "megatron", "veomni")
"""Engines that register a ``value_model`` (critic) in verl 0.9.1's ``EngineRegistry``."""
ENGINE_DEVICES: dict[str, tuple[str, ...]] = {"dp": ("cuda", "npu"), "megatron": ("cuda", "npu"),
                                              "torchtitan": ("cuda", "npu"), "veomni": ("cuda", "npu"),
                                              "automodel": ("cuda",)}
"""The devices each engine registers for (``@EngineRegistry.register(..., device=[...])``; Megatron's NPU is MindSpeed)."""


def torchtitan_refusal(value: str) -> str:
    return f"AssertionError: attn_type {value} not supported (sdpa is not a valid language-model backend)"


def unknown_backend(engine: str) -> str:
    """``EngineRegistry.get_engine_cls`` for a critic on an engine without a value model."""
    return f"AssertionError: Unknown backend: {engine}"


@dataclass(frozen=True)
class EngineAttention:
    """What verl's training engine does with one role's attention choice."""

    engine: str
    role: str
    key: str  # the verl key that chooses it under this engine
    requested: str  # its value: given, inherited or the default
    source: str  # "set" | "inherited" | "default"
    effective: str | None  # what verl's engine runs after its own rewrites; None: verl refuses the role
    reasons: tuple[Reason, ...]
    honoured: bool = True  # False: verl reads another value than the key says (dp's critic, #5210)
    error: str | None = None  # verl's own refusal, exact
    attnboard_differs: str | None = None  # attnboard's engine runs dp semantics: what it reads instead, when different

    def to_dict(self) -> dict[str, Any]:
        return {"engine": self.engine, "role": self.role, "key": self.key, "requested": self.requested,
                "source": self.source, "effective": self.effective, "honoured": self.honoured, "error": self.error,
                "attnboard_differs": self.attnboard_differs,
                "reasons": [{"rule": r.rule, "text": r.text} for r in self.reasons]}


@dataclass(frozen=True)
class _Inputs:
    engine: str
    keys: Mapping[str, Any]  # every key the spec sets (modelled and passed through, dotted, no +)
    device: str
    architecture: str | None


AUTOMODEL_INHERITS: dict[str, str] = {
    f"actor_rollout_ref.ref.automodel_config.{leaf}": f"actor_rollout_ref.actor.automodel_config.{leaf}"
    for leaf in ("attn_implementation", "param_offload", "model_dtype", "distributed_strategy", "tp_size", "pp_size",
                 "cp_size", "ep_size")
}
"""Newer verl's ``automodel_ref.yaml`` mirrors these actor keys (``${oc.select:...}``); the wheel has no such file."""


def _inherited_from(key: str) -> str | None:
    direct = ENGINE_INHERITS.get(key) or AUTOMODEL_INHERITS.get(key)
    if direct:
        return direct
    return next((ENGINE_INHERITS[p] + key[len(p):] for p in ENGINE_INHERITS if key.startswith(p + ".")), None)


def _lookup(inp: _Inputs, role: str, key: str) -> tuple[str, str, list[Reason]]:
    """(value, source, reasons) of ``key`` for a role: set, inherited from the key its default selects, or default."""
    reasons: list[Reason] = []
    if key in inp.keys:
        value, source = str(inp.keys[key]), "set"
        reasons.append(Reason(Rule.verl_engine_key.value, f"model_engine={inp.engine}: {key}={value} chooses the "
                                                          f"{role}'s attention."))
        return value, source, reasons
    target = _inherited_from(key)
    if target is not None:
        value, _, _ = _lookup(inp, "actor", target)
        reasons.append(Reason(Rule.verl_reference_inherits.value,
                              f"model_engine={inp.engine}: {key} is absent, so it takes {target} "
                              f"(${{oc.select:{target},...}} in verl's config): {value}."))
        return value, "inherited", reasons
    default = engine_default(inp.engine, key)
    value = "none" if default is None else str(default)
    reasons.append(Reason(Rule.verl_engine_key.value, f"model_engine={inp.engine}: {key} is absent: verl's default "
                                                      f"{value} applies."))
    return value, "default", reasons


def _attnboard_reads(inp: _Inputs, role: str) -> str:
    return str(inp.keys.get(OVERRIDE_KEYS[role], DEFAULT_IMPL))


def _differs(inp: _Inputs, role: str, verl_runs: str | None) -> tuple[str | None, list[Reason]]:
    """attnboard's engine runs dp semantics: what it loads for the role, when that is not what verl's engine runs."""
    ours = _attnboard_reads(inp, role)
    if verl_runs == ours:
        return None, []
    text = (f"attnboard's engine runs dp semantics: it loads the {role} with {OVERRIDE_KEYS[role]} ({ours}), "
            f"not what verl's {inp.engine} engine runs ({verl_runs or 'nothing: verl refuses'}).")
    return text, [Reason(Rule.attnboard_runs_dp.value, text)]


def _device(inp: _Inputs) -> tuple[str | None, list[Reason]]:
    devices = ENGINE_DEVICES[inp.engine]
    if inp.device in devices:
        return None, []
    text = (f"verl registers its {inp.engine} engine for {' and '.join(devices)} only (EngineRegistry), not "
            f"{inp.device}: verl cannot train this role here.")
    return text, [Reason(Rule.verl_engine_refuses.value, text)]


def _override_unread(inp: _Inputs, role: str, key: str) -> list[Reason]:
    override = inp.keys.get(OVERRIDE_KEYS[role])
    if override is None or inp.engine == ModelEngine.dp.value:
        return []
    return [Reason(Rule.verl_engine_ignores.value,
                   f"{OVERRIDE_KEYS[role]}={override} is not what verl's {inp.engine} engine reads for attention "
                   f"({key} is).")]


def _dp(inp: _Inputs, role: str) -> EngineAttention:
    key = OVERRIDE_KEYS[role]
    if role == "critic":
        value, source, reasons = _lookup(inp, role, key) if key in inp.keys else (DEFAULT_IMPL, "default", [])
        if source == "default":
            reasons.append(Reason(Rule.verl_engine_key.value, f"model_engine=dp: {key} is absent: verl's default "
                                                              f"{DEFAULT_IMPL} applies."))
        if source == "set":
            reasons.append(Reason(Rule.verl_critic_defect.value,
                                  f"verl <= {VERL_VERSION} ignores {key} (issue #5210: load_valuehead_model passes "
                                  f"flash_attention_2 explicitly): the critic runs flash_attention_2."))
        differs = None if value == DEFAULT_IMPL else (
            f"attnboard's engine honours {key} ({value}); verl runs flash_attention_2 (#5210).")
        if differs:
            reasons.append(Reason(Rule.attnboard_runs_dp.value, differs))
        device_error, device_reasons = _device(inp)
        return EngineAttention("dp", role, key, value, source, None if device_error else DEFAULT_IMPL,
                               tuple(reasons + device_reasons), honoured=value == DEFAULT_IMPL, attnboard_differs=differs)
    value = str(inp.keys.get(key, DEFAULT_IMPL))
    source = "set" if key in inp.keys else "default"
    if role == "reference":
        reasons = [Reason(Rule.verl_reference_inherits.value,
                          f"model_engine=dp: the reference is built from a copy of the actor's model config, so "
                          f"{key} ({value}) is the reference's too; it cannot differ.")]
        source = "inherited"
    else:
        reasons = _lookup(inp, role, key)[2]
    device_error, device_reasons = _device(inp)
    return EngineAttention("dp", role, key, value, source, None if device_error else value,
                           tuple(reasons + device_reasons))


def _veomni(inp: _Inputs, role: str) -> EngineAttention:
    key = f"{SECTIONS[role]}.veomni.attn_implementation"
    value, source, reasons = _lookup(inp, role, key)
    effective = VEOMNI_RENAMES.get(value, value)
    if effective != value:
        reasons.append(Reason(Rule.verl_engine_rewrite.value,
                              f"VeOmniEngineConfig.__post_init__ renames {value} to {effective} (logged at info level "
                              f"only: \"Replacing attn_implementation from '{value}' to '{effective}'\")."))
    if role == "critic":
        reasons.append(Reason(Rule.verl_critic_honoured.value,
                              f"model_engine=veomni: the critic's own {key} is honoured (unlike dp's #5210)."))
    reasons += _override_unread(inp, role, key)
    error_text, device_reasons = _device(inp)
    reasons += device_reasons
    differs, differ_reasons = _differs(inp, role, None if error_text else effective)
    return EngineAttention("veomni", role, key, value, source, None if error_text else effective,
                           tuple(reasons + differ_reasons), attnboard_differs=differs)


def _torchtitan(inp: _Inputs, role: str) -> EngineAttention:
    key = f"{SECTIONS[role]}.torchtitan.attn_type"
    value, source, reasons = _lookup(inp, role, key)
    error = None
    if role == "critic":
        error = unknown_backend("torchtitan")
        reasons.append(Reason(Rule.verl_engine_refuses.value,
                              f"verl {VERL_VERSION} registers no torchtitan value model: a critic (adv_estimator=gae) "
                              f"stops with {error}."))
    elif value not in TORCHTITAN_ATTN_TYPES:
        error = torchtitan_refusal(value)
        reasons.append(Reason(Rule.verl_engine_refuses.value,
                              f"TorchtitanEngineConfig allows attn_type {', '.join(TORCHTITAN_ATTN_TYPES)} only "
                              f"(its docstring's sdpa is refused): {error}."))
    reasons += _override_unread(inp, role, key)
    device_error, device_reasons = _device(inp)
    reasons += device_reasons
    effective = None if error or device_error else f"torchtitan:{value}"
    differs, differ_reasons = _differs(inp, role, effective)
    return EngineAttention("torchtitan", role, key, value, source, effective, tuple(reasons + differ_reasons),
                           error=error, attnboard_differs=differs)


def _megatron(inp: _Inputs, role: str) -> EngineAttention:
    key = f"{SECTIONS[role]}.megatron.override_transformer_config.attention_backend"
    value, source, reasons = _lookup(inp, role, key)
    error = None
    if value not in MEGATRON_BACKENDS:
        error = f"KeyError: '{value}'"
        reasons.append(Reason(Rule.verl_engine_refuses.value,
                              f"verl's mcore config_converter looks the value up as AttnBackend[{value!r}] (one of "
                              f"{', '.join(MEGATRON_BACKENDS)}): {error}."))
    reasons.append(Reason(Rule.verl_engine_key.value,
                          "Megatron-Core builds its own attention (TransformerEngine); attention_backend is not a "
                          "transformers attn_implementation, and attnboard's engine cannot launch model_engine=megatron."))
    reasons += _override_unread(inp, role, key)
    device_error, device_reasons = _device(inp)
    reasons += device_reasons
    effective = None if error or device_error else f"megatron:{value}"
    differs, differ_reasons = _differs(inp, role, effective)
    return EngineAttention("megatron", role, key, value, source, effective, tuple(reasons + differ_reasons),
                           error=error, attnboard_differs=differs)


def _automodel(inp: _Inputs, role: str) -> EngineAttention:
    key = f"{SECTIONS[role]}.automodel_config.attn_implementation"
    value, source, reasons = _lookup(inp, role, key)
    error = None
    reasons.append(Reason(Rule.verl_engine_refuses.value,
                          f"verl {VERL_VERSION}'s ppo_trainer has no model_engine/automodel config (newer verl has it); "
                          f"this row reads newer verl's automodel_config keys."))
    if role == "critic":
        error = unknown_backend("automodel")
        reasons.append(Reason(Rule.verl_engine_refuses.value,
                              f"verl registers no automodel value model: a critic (adv_estimator=gae) stops with {error}."))
    elif value not in AUTOMODEL_IMPLEMENTATIONS:
        reasons.append(Reason(Rule.verl_engine_key.value,
                              f"{key}={value} is none of {', '.join(AUTOMODEL_IMPLEMENTATIONS)} (AutomodelEngineConfig's "
                              f"documented values); transformers decides whether it loads."))
    backend_key = f"{SECTIONS[role]}.automodel_config.backend_config.attn"
    backend, _, _ = _lookup(inp, role, backend_key)
    ep_key = f"{SECTIONS[role]}.automodel_config.ep_size"
    ep_size = int(_lookup(inp, role, ep_key)[0]) if str(_lookup(inp, role, ep_key)[0]).isdigit() else 1
    arch = (inp.architecture or "").lower()
    if not arch:
        reasons.append(Reason(Rule.verl_engine_ignores.value,
                              f"{backend_key}={backend} applies unless the model is Qwen or Llama with ep_size <= 1 "
                              f"(then force_hf loads the Hugging Face model and ignores it); the architecture was not read."))
    elif ep_size <= 1 and any(name in arch for name in AUTOMODEL_HF_ARCHITECTURES):
        reasons.append(Reason(Rule.verl_engine_ignores.value,
                              f"{inp.architecture} with ep_size {ep_size}: verl sets force_hf, so {backend_key}={backend} "
                              f"is ignored; attention is {key}={value}."))
    else:
        reasons.append(Reason(Rule.verl_engine_key.value,
                              f"{inp.architecture}: Automodel's own layers run, {backend_key}={backend} chooses their "
                              f"attention backend."))
    reasons += _override_unread(inp, role, key)
    device_error, device_reasons = _device(inp)
    reasons += device_reasons
    effective = None if error or device_error else value
    differs, differ_reasons = _differs(inp, role, effective)
    return EngineAttention("automodel", role, key, value, source, effective, tuple(reasons + differ_reasons),
                           error=error, attnboard_differs=differs)


_ENGINES: dict[str, Callable[[_Inputs, str], EngineAttention]] = {
    ModelEngine.dp.value: _dp,
    ModelEngine.veomni.value: _veomni,
    ModelEngine.torchtitan.value: _torchtitan,
    ModelEngine.megatron.value: _megatron,
    ModelEngine.automodel.value: _automodel,
}


def verl_engine_view(engine: str, keys: Mapping[str, Any], *, device: str, has_critic: bool,
                     architecture: str | None = None) -> dict[str, EngineAttention]:
    """Per role (actor, reference, and critic when one runs): what verl's ``engine`` reads for attention and runs.

    ``keys``: every dotted key the spec sets (``override_config`` sub-keys expanded, pass-through keys without
    their ``+``); ``device``: the target environment's; ``architecture``: the actor's model class, when read."""
    view = _ENGINES[engine]
    inp = _Inputs(engine, keys, device, architecture)
    return {role: view(inp, role) for role in ROLES if role != "critic" or has_critic}
