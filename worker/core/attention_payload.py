"""The ``attention`` event's payload, defined once: per role and rank, what was asked for, what the preview
predicted, what loaded and which kernel (and SDPA backend) the first forward really called, in which dtypes.

Pure (the standard library only): the rank (``worker.engine.rank``) builds it where pydantic is not
installed. ``worker.core.events`` validates it as the payload model of ``Kind.attention`` (unknown keys are
refused; each attribute's docstring is its description in the API schema); the plan, the controller, the
app's pump, the run view, ``/wait`` and both CLIs read its fields from here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, ClassVar


@dataclass
class AttentionPayload:
    """One role on one rank: requested -> predicted -> effective -> observed."""

    __pydantic_config__: ClassVar[dict[str, Any]] = {"extra": "forbid", "use_attribute_docstrings": True}

    role: str
    """actor, rollout, reference or critic (``worker.core.roles.Role``)."""
    rank: int | None = None
    """The rank that loaded (or, for the rollout, generated with) the role."""
    requested: str | None = None
    """The implementation the spec asks for (the override, else verl's default)."""
    source: str | None = None
    """Where the request comes from: default, override or forced (the resolution's)."""
    predicted: str | None = None
    """What the preview (``worker.attention.resolution``) predicted would load; null when it predicted an error."""
    effective: str | None = None
    """The implementation the rank built the model with."""
    config_attn_implementation: str | None = None
    """The loaded model config's ``_attn_implementation`` (a Ulysses wrapper's name when one is registered)."""
    kernel_source: dict[str, str | None] | None = None
    """Where a FlashAttention (or Hub) kernel came from (``worker.engine.observe.kernel_source``): ``origin``
    package | hub | npu, ``repo``, ``revision`` and ``detail`` (``flash_attn 2.8.3``,
    ``kernels-community/flash-attn2@<revision>``); null for another implementation."""
    observed: str | None = None
    """The attention function called most in the first forward (generate for the rollout)."""
    calls: dict[str, int] = field(default_factory=dict)
    """Calls per attention function in the first forward."""
    wrappers: dict[str, int] = field(default_factory=dict)
    """Calls per wrapper around the kernel (attnboard's Ulysses all-to-all)."""
    sdpa_backend: str | None = None
    """The SDPA backend of most calls (flash_attention, efficient_attention, cudnn_attention, math); null when no
    SDPA call ran."""
    sdpa_backend_reason: str | None = None
    """Why the backend was math, when it was."""
    sdpa: list[dict[str, Any]] = field(default_factory=list)
    """Per SDPA input signature: backend, the aten op that named it, calls, reason and the inputs' summary."""
    compute_dtype: str | None = None
    """The dtype of forward and backward (verl's ``fsdp_config.dtype``; ``rollout.dtype`` for the rollout)."""
    weights_dtype: str | None = None
    """The dtype the weights are held in (the master dtype when trained, the compute dtype when frozen)."""
    forced: bool = False
    """The strategy forced the implementation (FSDP-Turbo with Ulysses: eager)."""
    fallback: bool = False
    """An earlier implementation of the chain failed to load and this one replaced it."""
    status: str = "ok"
    """ok, forced or fallback."""
    reasons: list[dict[str, str]] = field(default_factory=list)
    """The resolution's ordered reasons: ``{"rule", "text"}``."""
    strategy: str | None = None
    """fsdp, fsdp2 or fsdp_turbo."""
    sp: int = 1
    """The Ulysses sequence-parallel size."""
    output_attentions: bool = False
    """The first forward asked for the attention weights (``attnboard.debug.output_attentions``) and got them."""
    gradient_checkpointing: bool = False
    """Gradient checkpointing was applied to the role's module."""
    remove_padding: bool = False
    """Micro-batches ran packed into one row with ``position_ids`` and no mask (``model.use_remove_padding``, as
    verl runs it); false: padded rows (generation always runs padded rows with a KV cache)."""
    node: str | None = None
    """The node the rank ran on."""
    pid: int | None = None
    """The rank's process id."""
    attempt: int = 0
    """0 for the first ranks; n after the run's n-th restart (the role was observed again on new ranks)."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def of(cls, data: Mapping[str, Any], **changes: Any) -> AttentionPayload:
        """The payload's fields of ``data`` (a rank's report also holds its ``attempts``), with ``changes``."""
        return replace(cls(**{name: data[name] for name in FIELDS if name in data}), **changes)


FIELDS: tuple[str, ...] = tuple(f.name for f in fields(AttentionPayload))
"""Every field of the payload, in order."""

SUMMARY_FIELDS: tuple[str, ...] = ("role", "rank", "requested", "effective", "observed", "sdpa_backend", "compute_dtype",
                                   "status", "calls")
"""What a one-line summary of a role shows (the CLIs' tables); the full payload is in ``/wait`` and on the run page."""


def status_of(forced: bool, fallback: bool) -> str:
    """The ``status`` field: forced, fallback or ok."""
    return "forced" if forced else "fallback" if fallback else "ok"


def cell(payload: Mapping[str, Any], name: str) -> str:
    """One field as a table cell: ``-`` when absent; calls as ``sdpa x2``; the SDPA backend with why it was math."""
    value = payload.get(name)
    if name == "calls" and isinstance(value, Mapping):
        return ", ".join(f"{kernel} x{count}" for kernel, count in sorted(value.items())) or "-"
    if name == "sdpa_backend" and value and payload.get("sdpa_backend_reason"):
        return f"{value} ({payload['sdpa_backend_reason']})"
    return "-" if value is None else str(value)
