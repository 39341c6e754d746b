"""The database tables and the API's request/response schemas, one family per table:
``XBase`` (shared fields) -> ``XCreate`` (what a client sends) -> ``X(table=True)`` (the row) ->
``XPublic`` (what the API answers).

The schema only changes through Alembic (``migrations/``); a test fails when these models and the
migrations drift apart.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, computed_field, model_validator
from pydantic_core import PydanticCustomError
from sqlalchemy import JSON, Column, DateTime, ForeignKey, Integer, MetaData, String, Text, UniqueConstraint, false
from sqlmodel import Field, SQLModel

from worker.core.contract import TERMINAL, Kind, RunState

# Constraint names that are the same on SQLite and PostgreSQL, so migrations can refer to them.
SQLModel.metadata.naming_convention = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}
metadata: MetaData = SQLModel.metadata

NAME_MAX = 200
DESCRIPTION_MAX = 4000


def utcnow() -> datetime:
    return datetime.now(UTC)


def _as_utc(value: datetime) -> datetime:
    """SQLite hands timestamps back without a zone; they were written in UTC."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


UtcDatetime = Annotated[datetime, AfterValidator(_as_utc)]


INT32_MAX = 2**31 - 1
"""Ids, seqs and steps are 32-bit integers in both databases; bigger values are refused up front."""


MAX_BODY_DEPTH = 32
"""Deepest nesting a request body may have; a spec needs about 6 levels."""


def _visible(text: str) -> str:
    """``text`` with NUL and lone surrogates written as escapes, safe to echo in an error."""
    return text.replace("\x00", "\\0").encode("utf-8", "backslashreplace").decode("utf-8")


def _text_problem(text: str) -> str | None:
    if "\x00" in text:
        return "text must not contain NUL (\\0) characters"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "text must be valid Unicode: it holds a lone surrogate (\\ud800-\\udfff)"
    return None


STORABLE = f"JSON without NaN/Infinity, NUL characters or lone surrogates, nested at most {MAX_BODY_DEPTH} levels"


def storable_problem(value: Any, path: str = "") -> tuple[str, Any, str] | None:
    """The first value the app cannot take faithfully, as (field, value, why), or None: nesting deeper
    than MAX_BODY_DEPTH (which would exhaust recursion further on), NaN/Infinity (JSON has no such
    numbers; PostgreSQL refuses them), NUL characters (PostgreSQL text cannot hold them) and lone
    surrogates (not encodable as UTF-8). Iterative, so a hostile body cannot exhaust the stack here."""
    stack: list[tuple[str, Any, int]] = [(path, value, 0)]
    while stack:
        where, item, depth = stack.pop()
        if depth > MAX_BODY_DEPTH:
            return where or "(body)", "...", f"nested more than {MAX_BODY_DEPTH} levels deep"
        if isinstance(item, float) and not math.isfinite(item):
            return where or "(body)", str(item), "NaN and Infinity are not numbers JSON can store"
        if isinstance(item, str) and (why := _text_problem(item)):
            return _visible(where or "(body)"), _visible(item[:80]), why
        if isinstance(item, dict):
            for key, child in item.items():
                if isinstance(key, str) and (why := _text_problem(key)):
                    return _visible(f"{where}.{key}".lstrip(".")), _visible(key[:80]), f"keys: {why}"
                stack.append((f"{where}.{key}".lstrip("."), child, depth + 1))
        elif isinstance(item, (list, tuple)):
            stack.extend((f"{where}[{i}]", child, depth + 1) for i, child in enumerate(item))
    return None


def _not_unix_seconds(value: Any) -> Any:
    """pydantic reads a number as Unix seconds, so ``created_after=2026`` would mean 1970-01-01T00:33:46Z:
    the API takes ISO 8601 date-times only."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(value, str):
        try:
            float(value)
            number = True
        except ValueError:
            pass
    if number:
        raise PydanticCustomError("datetime_parsing", "Input should be an ISO 8601 date-time, not a number")
    return value


IsoDatetime = Annotated[datetime, BeforeValidator(_not_unix_seconds)]


class _Request(SQLModel):
    """Request bodies reject unknown keys (a typo is an error naming the key, not silently ignored)
    and values no database could store."""

    model_config = ConfigDict(extra="forbid")  # type: ignore[assignment]

    @model_validator(mode="before")
    @classmethod
    def _storable(cls, data: Any) -> Any:
        problem = storable_problem(data)
        if problem is not None:
            field, value, why = problem
            raise PydanticCustomError("unstorable", "{value!r} cannot be stored: {why}",
                                      {"field": field, "value": value, "why": why, "valid": STORABLE})
        return data


# --------------------------------------------------------------------------------------------
# Specs: saved, named run specs (the canonical tree of worker.spec.RunSpec).


class SpecBase(SQLModel):
    name: str = Field(min_length=1, max_length=NAME_MAX, index=True, description="A name people recognise.")
    description: str = Field("", max_length=DESCRIPTION_MAX, sa_type=Text, description="Free text.")


class SpecCreate(SpecBase, _Request):
    spec: dict[str, Any] = Field(description="A run spec, nested or dotted keys (see worker.spec.RunSpec).")


class SpecUpdate(_Request):
    name: str | None = Field(None, min_length=1, max_length=NAME_MAX)
    description: str | None = Field(None, max_length=DESCRIPTION_MAX)
    spec: dict[str, Any] | None = None


class Spec(SpecBase, table=True):
    id: int | None = Field(default=None, primary_key=True)
    spec: dict[str, Any] = Field(sa_type=JSON, nullable=False)
    created_at: datetime = Field(default_factory=utcnow, sa_type=DateTime(timezone=True), nullable=False)
    updated_at: datetime = Field(default_factory=utcnow, sa_type=DateTime(timezone=True), nullable=False)


class SpecPublic(SpecBase):
    id: int
    spec: dict[str, Any]
    created_at: UtcDatetime
    updated_at: UtcDatetime


class SpecsPublic(BaseModel):
    data: list[SpecPublic]
    total: int
    limit: int
    offset: int


# --------------------------------------------------------------------------------------------
# Runs


RunStatus = RunState
"""The run states of PRODUCT.md's contract, one definition shared with the worker (``worker.core.contract``)."""


class RunBase(SQLModel):
    name: str = Field(min_length=1, max_length=NAME_MAX, index=True)


EXAMPLE_SPEC: dict[str, Any] = {
    "actor_rollout_ref.model.path": "builtin:tiny-llama",
    "critic.model.path": "builtin:tiny-llama",
    "critic.model.override_config.attn_implementation": "eager",
    "data.train_files": "builtin:count",
    "data.train_batch_size": 4,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 2,
    "trainer.device": "cpu",
    "trainer.n_gpus_per_node": 1,
    "trainer.total_training_steps": 2,
}
"""A small CPU run in dotted keys: the example the API documents (and the schemathesis fuzzer starts from)."""


class RunCreate(_Request):
    """Exactly one of ``spec_id`` (a saved spec) or ``spec`` (inline)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [  # type: ignore[assignment]
        {"name": "tiny cpu run", "spec": EXAMPLE_SPEC}, {"spec_id": 1}]})

    name: str | None = Field(None, min_length=1, max_length=NAME_MAX,
                             description="Defaults to the saved spec's name, or 'run'.")
    spec_id: int | None = Field(None, ge=1, le=INT32_MAX, description="A saved spec to run (its current content is copied).")
    spec: dict[str, Any] | None = Field(None, description="An inline run spec, nested or dotted keys.")
    environment: str | dict[str, Any] | None = Field(
        None, description="The target environment the preview was made for: a profile name or a probe."
    )


class RunRetry(_Request):
    name: str | None = Field(None, min_length=1, max_length=NAME_MAX)
    patch: dict[str, Any] = Field(
        default_factory=dict,
        description="Dotted spec keys to change, e.g. {'critic.model.override_config.attn_implementation': 'eager'}.",
    )


class RunClone(_Request):
    name: str | None = Field(None, min_length=1, max_length=NAME_MAX)


class RunResume(RunRetry):
    """A resume takes what a retry takes: a name, and dotted spec keys to change on top of the old run's
    spec (e.g. ``{'trainer.total_training_steps': 20}`` to train further)."""


class CheckpointPublic(BaseModel):
    """A complete checkpoint of a run (``worker.engine.checkpoint``)."""

    step: int
    path: str
    size_bytes: int
    saved_at: str | None = Field(description="When it was written (ISO 8601, UTC).")
    roles: list[str] = Field(description="The trained roles it holds (a keep limit may have pruned one).")
    resumable: bool = Field(description="It holds every role its run trained.")


class CheckpointsPublic(BaseModel):
    folder: str = Field(description="The run's trainer.default_local_dir, resolved.")
    data: list[CheckpointPublic] = Field(description="Oldest first.")
    skipped: list[dict[str, str]] = Field(description="Folders that are not complete checkpoints (path, why).")


class Run(RunBase, table=True):
    id: int | None = Field(default=None, primary_key=True)
    spec_id: int | None = Field(
        default=None, sa_column=Column(Integer, ForeignKey("spec.id", ondelete="SET NULL"), nullable=True, index=True)
    )
    spec: dict[str, Any] = Field(sa_type=JSON, nullable=False, description="Immutable copy taken at submission.")
    status: str = Field(default=RunStatus.queued.value, max_length=16, index=True)
    status_reason: str | None = Field(default=None, sa_type=Text)
    cancel_requested: bool = Field(default=False, nullable=False)
    environment: Any = Field(default=None, sa_type=JSON, nullable=True)
    retry_of: int | None = Field(
        default=None, sa_column=Column(Integer, ForeignKey("run.id", ondelete="SET NULL"), nullable=True)
    )
    created_at: datetime = Field(default_factory=utcnow, sa_type=DateTime(timezone=True), nullable=False, index=True)
    started_at: datetime | None = Field(default=None, sa_type=DateTime(timezone=True), nullable=True)
    finished_at: datetime | None = Field(default=None, sa_type=DateTime(timezone=True), nullable=True)
    step: int = Field(default=0, nullable=False)
    total_steps: int | None = Field(default=None, nullable=True)
    last_seq: int = Field(default=0, nullable=False)
    effective_attention: dict[str, Any] | None = Field(default=None, sa_type=JSON, nullable=True)
    ray_job: str | None = Field(default=None, max_length=NAME_MAX, nullable=True)
    restarts: int = Field(default=0, nullable=False, sa_column_kwargs={"server_default": "0"},
                          description="Times the run restarted after a rank or its engine host died.")
    archived: bool = Field(default=False, nullable=False, sa_column_kwargs={"server_default": false()},
                           description="Put away: hidden from the runs list unless archived runs are asked for.")


class Progress(BaseModel):
    step: int
    total_steps: int | None
    fraction: float | None


class RunPublic(RunBase):
    id: int
    spec_id: int | None
    spec: dict[str, Any] = Field(description="The spec the run was submitted with. Its verl_passthrough lists the verl "
                                             "keys passed through to verl, not run by attnboard.")
    status: RunStatus
    status_reason: str | None
    cancel_requested: bool
    environment: Any
    retry_of: int | None
    created_at: UtcDatetime
    started_at: UtcDatetime | None
    finished_at: UtcDatetime | None
    step: int
    total_steps: int | None
    last_seq: int
    effective_attention: dict[str, Any] | None
    ray_job: str | None
    restarts: int = Field(description="Times the run restarted after a rank or its engine host died "
                                      "(attnboard.max_restarts bounds it).")
    archived: bool = Field(description="Put away (POST /api/runs/{id}/archive): GET /api/runs and the runs list "
                                       "leave it out unless archived runs are asked for.")

    @computed_field  # type: ignore[prop-decorator]
    @property
    def progress(self) -> Progress:
        fraction = None
        if self.total_steps:
            fraction = min(1.0, self.step / self.total_steps)
        return Progress(step=self.step, total_steps=self.total_steps, fraction=fraction)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL


class RunsPublic(BaseModel):
    data: list[RunPublic]
    total: int
    limit: int
    offset: int


class RunWaitPublic(BaseModel):
    """The answer of ``GET /api/runs/{id}/wait``: the run when it finished or the wait timed out."""

    run: RunPublic
    timed_out: bool = Field(description="True when the run was still unfinished at the timeout.")
    attention: list[dict[str, Any]] = Field(
        description="One row per role (actor, rollout, reference, critic), the shape `attnboard submit --json` prints "
                    "too: every field of the role's attention payload (worker.core.attention_payload.AttentionPayload: "
                    "role, rank, requested, effective, observed, sdpa_backend, compute_dtype, status, ...; the first "
                    "rank's, after a restart the new ranks') and error (null). On a failed or cancelled run a role that "
                    "never reported has requested (from the spec), effective null, status error and error: its load "
                    "error or why the run ended first."
    )


# --------------------------------------------------------------------------------------------
# Events: the contract in PRODUCT.md, (run_id, seq, ts, kind, payload), seq contiguous from 1.


EventKind = Kind
"""Event kinds of PRODUCT.md's contract, shared with the worker (``worker.core.contract``)."""


class EventBase(SQLModel):
    seq: int = Field(ge=1, le=INT32_MAX)
    kind: str = Field(max_length=32)
    payload: dict[str, Any] = Field(default_factory=dict, sa_type=JSON, nullable=False)


class EventCreate(EventBase, _Request):
    kind: EventKind  # type: ignore[assignment]
    ts: IsoDatetime | None = None


class Event(EventBase, table=True):
    """UNIQUE(run_id, seq) makes ingestion idempotent; its index also serves "events of a run after seq"."""

    __table_args__ = (UniqueConstraint("run_id", "seq"),)

    id: int | None = Field(default=None, primary_key=True)
    run_id: int = Field(sa_column=Column(Integer, ForeignKey("run.id", ondelete="CASCADE"), nullable=False))
    ts: datetime = Field(default_factory=utcnow, sa_type=DateTime(timezone=True), nullable=False)


class EventPublic(EventBase):
    run_id: int
    ts: UtcDatetime


class EventsPublic(BaseModel):
    data: list[EventPublic]
    last_seq: int = Field(description="The run's highest stored seq.")
    next_after: int = Field(description="Pass as ?after= to continue.")


class AppendResult(BaseModel):
    inserted: int
    duplicates: int
    last_seq: int
    conflicts: int = Field(0, description="Events whose seq was already stored with a different kind or payload: "
                           "the stored one is kept, the other logged and counted in event_conflict.")


class EventConflict(SQLModel, table=True):
    """An event that arrived with a seq already stored under a different kind or payload: the first one stays
    (the engine numbers its events once), this one is kept here, logged and counted, never silently dropped."""

    __tablename__ = "event_conflict"

    id: int | None = Field(default=None, primary_key=True)
    run_id: int = Field(sa_column=Column(Integer, ForeignKey("run.id", ondelete="CASCADE"), nullable=False, index=True))
    seq: int = Field(nullable=False)
    kind: str = Field(max_length=32, nullable=False)
    payload: dict[str, Any] = Field(default_factory=dict, sa_type=JSON, nullable=False)
    stored_kind: str = Field(max_length=32, nullable=False)
    detected_at: datetime = Field(default_factory=utcnow, sa_type=DateTime(timezone=True), nullable=False)


# --------------------------------------------------------------------------------------------
# API tokens and the browser sessions signed in with them.

Scope = Literal["read", "write", "admin"]
"""read: GET everything; write: launch, cancel, retry; admin: mint and revoke tokens."""


class ApiTokenBase(SQLModel):
    name: str = Field(min_length=1, max_length=NAME_MAX)


class ApiTokenCreate(ApiTokenBase, _Request):
    scopes: list[Scope] = Field(default_factory=lambda: ["read", "write"], min_length=1)


class ApiToken(ApiTokenBase, table=True):
    id: int | None = Field(default=None, primary_key=True)
    token_hash: str = Field(
        sa_column=Column(String(64), nullable=False, unique=True),
        description="sha256 hex of the token; the plaintext is never stored.",
    )
    prefix: str = Field(max_length=16, description="The token's first characters, to recognise it in lists.")
    scopes: list[str] = Field(default_factory=list, sa_type=JSON, nullable=False)
    created_at: datetime = Field(default_factory=utcnow, sa_type=DateTime(timezone=True), nullable=False)
    last_used_at: datetime | None = Field(default=None, sa_type=DateTime(timezone=True), nullable=True)
    revoked: bool = Field(default=False, nullable=False)


class BrowserSession(SQLModel, table=True):
    """A signed-in browser. The cookie carries the session's random id (signed); only its sha256 is stored. Logout,
    expiry or revoking the token ends it server-side, so a replayed cookie is worth nothing."""

    __tablename__ = "browser_session"

    id: int | None = Field(default=None, primary_key=True)
    session_hash: str = Field(sa_column=Column(String(64), nullable=False, unique=True))
    token_id: int = Field(sa_column=Column(Integer, ForeignKey("apitoken.id", ondelete="CASCADE"), nullable=False))
    csrf: str = Field(max_length=64, nullable=False)
    created_at: datetime = Field(default_factory=utcnow, sa_type=DateTime(timezone=True), nullable=False)
    expires_at: datetime = Field(sa_type=DateTime(timezone=True), nullable=False)
    ended_at: datetime | None = Field(default=None, sa_type=DateTime(timezone=True), nullable=True)


class ApiTokenPublic(ApiTokenBase):
    id: int
    prefix: str
    scopes: list[str]
    created_at: UtcDatetime
    last_used_at: UtcDatetime | None
    revoked: bool


class ApiTokenCreated(ApiTokenPublic):
    token: str = Field(description="The secret, shown this once; send it as 'Authorization: Bearer <token>'.")
