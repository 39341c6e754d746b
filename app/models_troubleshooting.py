"""Tables and schemas of the troubleshooting log and the attention trials (issue 6), one family per table
as in ``app.models``: the row (``table=True``), what a client sends (``...Create``) and what the API
answers (``...Public``).

- ``TroubleshootingEntry``: one per attention failure a run reported (a ``fallback`` or ``error`` event,
  or a ``failed`` status without an error event), keyed by the event's ``(run_id, seq)`` so each event
  yields exactly one entry; the classifier's ``Diagnosis`` is stored as JSON.
- ``TroubleshootingNote``: what people write on an entry.
- ``EnvironmentRecheck``: a probe result posted to ``/api/troubleshooting/recheck``; with the runs'
  own ``env_probe`` events it tells whether a cause is gone (return to the fast path).
- ``Trial``: an attention trial, its request and (once done) its ``worker.engine.trial.TrialResult`` as JSON.
"""

from __future__ import annotations

from datetime import datetime
from enum import Enum
from typing import Any

from pydantic import BaseModel
from sqlalchemy import JSON, Column, DateTime, ForeignKey, Integer, Text, UniqueConstraint
from sqlmodel import Field, SQLModel

from app.models import NAME_MAX, UtcDatetime, _Request, utcnow

NOTE_MAX = 4000
MAX_TRIAL_STEPS = 20

# --------------------------------------------------------------------------------------------
# Troubleshooting log


class EntrySource(str, Enum):
    """Which event made the entry."""

    fallback = "fallback"  # an implementation failed and the next one of the chain replaced it
    error = "error"  # the run's error event (strict policy, chain exhausted, a crash)
    failed = "failed"  # a failed status without an error event before it
    mismatch = "mismatch"  # an attention_mismatch: the kernel loaded or observed is not the one expected


class TroubleshootingEntry(SQLModel, table=True):
    __table_args__ = (UniqueConstraint("run_id", "seq"),)

    id: int | None = Field(default=None, primary_key=True)
    run_id: int = Field(sa_column=Column(Integer, ForeignKey("run.id", ondelete="CASCADE"), nullable=False, index=True))
    seq: int = Field(nullable=False, description="The seq of the event the entry comes from.")
    source: str = Field(max_length=16)
    role: str | None = Field(default=None, max_length=32, index=True)
    category: str = Field(max_length=48, index=True)
    implementation: str | None = Field(default=None, max_length=NAME_MAX)
    model: str | None = Field(default=None, sa_type=Text, description="The model path of the role (of the actor when none).")
    environment: str | None = Field(default=None, max_length=NAME_MAX,
                                    description="A label of the node the error happened on, e.g. 'cpu, no flash-attn'.")
    env: dict[str, Any] | None = Field(default=None, sa_type=JSON, nullable=True, description="The probe's facts.")
    error: str = Field(sa_type=Text, description="The original error text.")
    diagnosis: dict[str, Any] = Field(sa_type=JSON, nullable=False,
                                      description="worker.troubleshoot.classify.Diagnosis.as_dict().")
    created_at: datetime = Field(default_factory=utcnow, sa_type=DateTime(timezone=True), nullable=False)


class TroubleshootingNote(SQLModel, table=True):
    id: int | None = Field(default=None, primary_key=True)
    entry_id: int = Field(sa_column=Column(Integer, ForeignKey("troubleshootingentry.id", ondelete="CASCADE"),
                                           nullable=False, index=True))
    author: str = Field(max_length=NAME_MAX)
    text: str = Field(sa_type=Text)
    created_at: datetime = Field(default_factory=utcnow, sa_type=DateTime(timezone=True), nullable=False)


class EnvironmentRecheck(SQLModel, table=True):
    id: int | None = Field(default=None, primary_key=True)
    environment: dict[str, Any] = Field(sa_type=JSON, nullable=False)
    author: str = Field(max_length=NAME_MAX)
    created_at: datetime = Field(default_factory=utcnow, sa_type=DateTime(timezone=True), nullable=False)


class NoteCreate(_Request):
    text: str = Field(min_length=1, max_length=NOTE_MAX, description="What you found or tried.")


class NotePublic(BaseModel):
    id: int
    entry_id: int
    author: str
    text: str
    created_at: UtcDatetime


class EntryRetry(_Request):
    name: str | None = Field(None, min_length=1, max_length=NAME_MAX)
    use: str = Field("remedy", description="'remedy': the classifier's patch; 'fast_path': return to the fast "
                                           "implementation (offered once a later probe shows the cause gone).")


class RecheckCreate(_Request):
    environment: str | dict[str, Any] = Field(description="A profile name or a probe result (worker.engine.probe).")


class FastPath(BaseModel):
    sentence: str
    patch: dict[str, Any]
    probe: str = Field(description="Where the newer probe comes from: 'run <id>' or 'recheck <id>'.")


class EntryPublic(BaseModel):
    id: int
    run_id: int
    seq: int
    source: str
    role: str | None
    category: str
    implementation: str | None
    model: str | None
    environment: str | None
    env: dict[str, Any] | None
    error: str
    diagnosis: dict[str, Any]
    created_at: UtcDatetime
    run_name: str
    run_status: str
    notes: list[NotePublic] = []
    return_to_fast_path: FastPath | None = None


class EntriesPublic(BaseModel):
    data: list[EntryPublic]
    total: int
    limit: int
    offset: int


class RecheckPublic(BaseModel):
    id: int
    environment: dict[str, Any]
    created_at: UtcDatetime
    suggestions: list[EntryPublic] = Field(description="Entries whose cause this probe shows gone.")


# --------------------------------------------------------------------------------------------
# Attention trials


class TrialStatus(str, Enum):
    queued = "queued"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"


TRIAL_TERMINAL = frozenset({TrialStatus.succeeded.value, TrialStatus.failed.value, TrialStatus.cancelled.value})


class Trial(SQLModel, table=True):
    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(max_length=NAME_MAX)
    status: str = Field(default=TrialStatus.queued.value, max_length=16, index=True)
    spec: dict[str, Any] = Field(sa_type=JSON, nullable=False)
    implementations: list[str] = Field(sa_type=JSON, nullable=False)
    steps: int = Field(nullable=False)
    environment: Any = Field(default=None, sa_type=JSON, nullable=True)
    result: dict[str, Any] | None = Field(default=None, sa_type=JSON, nullable=True)
    error: str | None = Field(default=None, sa_type=Text)
    status_reason: str | None = Field(default=None, sa_type=Text)  # what it waits for, does now, or how it ended
    engine_job: str | None = Field(default=None, max_length=NAME_MAX, nullable=True)  # its job in the engine host
    cancel_requested: bool = Field(default=False, nullable=False)
    restarts: int = Field(default=0, nullable=False, sa_column_kwargs={"server_default": "0"})
    author: str = Field(max_length=NAME_MAX)
    created_at: datetime = Field(default_factory=utcnow, sa_type=DateTime(timezone=True), nullable=False, index=True)
    started_at: datetime | None = Field(default=None, sa_type=DateTime(timezone=True), nullable=True)
    finished_at: datetime | None = Field(default=None, sa_type=DateTime(timezone=True), nullable=True)


class TrialCreate(_Request):
    name: str | None = Field(None, min_length=1, max_length=NAME_MAX)
    spec: dict[str, Any] = Field(description="A run spec, nested or dotted keys; each implementation runs it.")
    implementations: list[str] = Field(default_factory=lambda: ["flash_attention_2", "sdpa", "eager"], min_length=1,
                                       max_length=8)
    steps: int = Field(3, ge=1, le=MAX_TRIAL_STEPS, description="PPO steps per implementation.")
    environment: str | dict[str, Any] | None = Field(
        None, description="A profile name or a probe; default: a probe of the node the trial runs on.")


class TrialPublic(BaseModel):
    id: int
    name: str
    status: TrialStatus
    spec: dict[str, Any]
    implementations: list[str]
    steps: int
    environment: Any
    result: dict[str, Any] | None
    error: str | None
    status_reason: str | None = Field(description="What the trial waits for (e.g. the ranks a run holds), what it "
                                                   "does now, or how it ended.")
    engine_job: str | None = Field(description="Its job in the engine host, once started there.")
    cancel_requested: bool
    restarts: int = Field(description="Times it was started again after its engine host died.")
    author: str
    created_at: UtcDatetime
    started_at: UtcDatetime | None
    finished_at: UtcDatetime | None


class TrialsPublic(BaseModel):
    data: list[TrialPublic]
    total: int
    limit: int
    offset: int
