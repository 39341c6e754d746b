"""The typed event contract: one payload model per event kind (``PAYLOADS``).

An event is ``{"run_id", "seq", "ts", "kind", "payload"}`` with ``seq`` contiguous from 1 per run; only the
controller numbers events (ranks return payloads). The models say what each kind's payload holds; unknown
keys are refused except in ``log`` (whose context varies: pids, the resolution preview, a saved path) and
``env_probe`` (the probe reports more than the environment: hostname, backend checks, implementations).
The ``attention`` payload is ``worker.core.attention_payload.AttentionPayload``, defined once, pure.

After the final status nothing more is recorded (a controller abandoned by a cancel may still return).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, fields, replace
from typing import Any, Literal, get_type_hints

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from worker.core.attention_payload import AttentionPayload, status_of
from worker.core.contract import Kind, RunState

__all__ = ["PAYLOADS", "AttentionMismatchPayload", "AttentionPayload", "EnvProbePayload", "ErrorPayload",
           "FallbackPayload", "LogPayload", "MetricPayload", "RestartPayload", "StatusPayload", "read_attention",
           "validate_payload"]


class _Payload(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, populate_by_name=True)


class StatusPayload(_Payload):
    """``queued -> starting -> running -> succeeded | failed | cancelled``."""

    state: RunState
    reason: str = ""
    total_steps: int | None = None
    """On running: the steps the run will take."""
    rank: int | None = None
    """The rank that failed, when one did."""
    role: str | None = None
    """The role that could not load, when one did not."""
    status: RunState | None = None
    """The app's copy of ``state`` (its pages read ``status``)."""


class EnvProbePayload(_Payload):
    """``worker.engine.probe.probe_environment()`` of rank 0's node (its Environment fields and more)."""

    model_config = ConfigDict(extra="allow")
    rank: int
    device: str


class FallbackPayload(_Payload):
    """A failed attempt that a later implementation replaced."""

    role: str
    rank: int
    from_: str = Field(alias="from")
    """The implementation that failed."""
    to: str
    """The one that replaced it."""
    error: str
    """The exception text."""
    diagnosis: dict[str, Any]
    """``worker.troubleshoot.classify.Diagnosis.as_dict()``."""
    refused_by: str | None = None
    """The rule of the availability check that refused it before any load, when it did."""


class AttentionMismatchPayload(_Payload):
    """A disagreement between the preview, the loaded config and the observed kernel."""

    role: str
    rank: int | None
    what: Literal["resolution-vs-loaded", "loaded-vs-observed"]
    expected: str | None
    actual: str | None
    message: str
    calls: dict[str, int] | None = None


class MetricPayload(_Payload):
    """One training step."""

    step: int
    total_steps: int | None = None
    values: dict[str, float]
    """verl-style names: critic/rewards/mean, actor/kl, perf/tokens_per_s, perf/max_memory_mb, ..."""
    peak_memory_mb: dict[str, float] = {}
    """Per rank (as a string), MiB: max RSS on CPU, ``torch.cuda.max_memory_allocated`` on GPU."""


class LogPayload(_Payload):
    """A line of the run's log, with its context."""

    model_config = ConfigDict(extra="allow")
    message: str


class ErrorPayload(_Payload):
    """A failure: of a rank (rank, cause, died, traceback), of a role that could not load (role, attempts,
    diagnosis, policy), of a checkpoint that cannot be resumed (field, issues), or seen by the app (source)."""

    message: str
    rank: int | None = None
    cause: str | None = None
    died: bool | None = None
    traceback: str | None = None
    role: str | None = None
    attempts: list[dict[str, Any]] | None = None
    diagnosis: dict[str, Any] | None = None
    policy: str | None = None
    field: str | None = None
    issues: list[dict[str, Any]] | None = None
    source: Literal["engine", "app"] | None = None


class RestartPayload(_Payload):
    """The run starts again on new ranks after a rank or its engine host died; its status stays running."""

    message: str
    cause: str
    rank: int | None
    """The dead rank, or null for the host."""
    attempt: int
    """1 for the first restart."""
    max_restarts: int
    resumed_from_step: int
    """0: from the start, no checkpoint yet."""
    checkpoint: str | None
    source: Literal["engine", "app"]
    """engine: a rank died; app: the engine host died."""


PAYLOADS: dict[Kind, Any] = {
    Kind.status: StatusPayload,
    Kind.env_probe: EnvProbePayload,
    Kind.attention: AttentionPayload,
    Kind.fallback: FallbackPayload,
    Kind.attention_mismatch: AttentionMismatchPayload,
    Kind.metric: MetricPayload,
    Kind.log: LogPayload,
    Kind.error: ErrorPayload,
    Kind.restart: RestartPayload,
}
"""The payload model of every event kind."""

_ADAPTERS = {kind: TypeAdapter(model) for kind, model in PAYLOADS.items()}


def validate_payload(kind: Kind | str, payload: Mapping[str, Any]) -> Any:
    """The payload as its kind's model; ``pydantic.ValidationError`` names the bad field."""
    return _ADAPTERS[Kind(kind)].validate_python(dict(payload))


_FIELD_ADAPTERS = {name: TypeAdapter(hint) for name, hint in get_type_hints(AttentionPayload).items()
                   if not name.startswith("__")}


def read_attention(payload: Mapping[str, Any]) -> AttentionPayload:
    """A stored ``attention`` payload, read leniently (stored events may be older or posted by hand): each field
    that validates is kept, any other is its default (a required one as text); unknown keys are left aside;
    a missing ``status`` follows ``forced`` and ``fallback``."""
    values: dict[str, Any] = {}
    for f in fields(AttentionPayload):
        if f.name not in payload:
            continue
        try:
            values[f.name] = _FIELD_ADAPTERS[f.name].validate_python(payload[f.name])
        except ValidationError:
            if f.default is MISSING and f.default_factory is MISSING:
                values[f.name] = str(payload[f.name])
    read = AttentionPayload(**{"role": "?", **values})
    return read if "status" in values else replace(read, status=status_of(read.forced, read.fallback))
