"""The troubleshooting log: every attention failure a run reports, classified, with its remedy, notes, a
one-click retry, and the suggestion to return to the fast path once a later probe shows the cause gone.

Entries are made when events are ingested (``record_events``, called by ``events.append_events`` inside
its transaction), one per ``fallback`` or ``error`` event and one per ``failed`` status that no error
event explained. An entry is keyed by its event's ``(run_id, seq)``: event ingestion is idempotent, so
the log is too. Each entry stores ``worker.troubleshoot.classify.classify``'s Diagnosis as JSON, made with the facts
of the run's latest ``env_probe`` event.

"Later probe": the newest of (an ``env_probe`` event of a newer run, an environment posted to
``/api/troubleshooting/recheck`` after the entry). When it meets the diagnosis'
``return_to_fast_path_when`` (``worker.troubleshoot.classify.suggest_return_to_fast_path``), the entry offers the
fast-path patch as a retry.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func
from sqlmodel import Session, col, select

from app.errors import AppError, not_found
from app.models import Event, EventCreate, EventKind, Run
from app.models_troubleshooting import (
    EntryPublic,
    EntrySource,
    EnvironmentRecheck,
    FastPath,
    NotePublic,
    TroubleshootingEntry,
    TroubleshootingNote,
)
from app.services.interop import environment_of
from app.services.launcher import Launcher
from worker.core.environment import Environment
from worker.core.roles import NAMES
from worker.troubleshoot.classify import (
    ROLE_SECTIONS,
    Category,
    Diagnosis,
    ErrorInfo,
    classify,
    fast_path_patch,
    suggest_return_to_fast_path,
)

ERROR_TEXT_MAX = 8000
PROBE_EXTRAS = frozenset({"rank", "hostname", "python_version", "model_folder", "implementations"})
"""Keys ``worker.engine.probe.probe_environment`` (and the engine's env_probe event) add to the environment's fields."""
RETRY_USES = ("remedy", "fast_path")

# --------------------------------------------------------------------------------------------
# Pure: from an event to an entry


@dataclass(frozen=True)
class Draft:
    """What an event says about a failure, before it is stored."""

    source: EntrySource
    role: str | None
    error: str
    implementation: str | None


def _text(value: Any) -> str:
    return value if isinstance(value, str) else "" if value is None else str(value)


def draft_from_event(kind: str, payload: Mapping[str, Any], *, run_has_error: bool) -> Draft | None:
    """The failure an event reports, or None when it reports none.

    - ``fallback``: the error of the implementation that was replaced (``payload.error``).
    - ``error``: the last failed attempt's error when the engine lists attempts, else the traceback,
      else the message.
    - ``status`` ``failed`` (``payload.status`` from the API, ``payload.state`` from the engine), only when
      no error event of the run explained it already.
    - ``attention_mismatch``: the engine's message (the preview and the loaded implementation disagree, or
      the first forward called another kernel than the one loaded); the implementation is the expected one.
    """
    role = payload.get("role")
    role = role if isinstance(role, str) and role in ROLE_SECTIONS else None
    if kind == EventKind.fallback.value:
        error = _text(payload.get("error")) or _text(payload.get("message"))
        return Draft(EntrySource.fallback, role, error or "fallback without an error text", _text(payload.get("from")) or None)
    if kind == EventKind.error.value:
        attempts = payload.get("attempts")
        last = attempts[-1] if isinstance(attempts, list) and attempts and isinstance(attempts[-1], dict) else {}
        error = _text(last.get("error")) or _text(payload.get("traceback")) or _text(payload.get("message"))
        return Draft(EntrySource.error, role, error or "error without a message", _text(last.get("implementation")) or None)
    if kind == EventKind.attention_mismatch.value:
        error = _text(payload.get("message"))
        if not error:
            error = f"expected {_text(payload.get('expected')) or '?'}, got {_text(payload.get('actual')) or 'nothing'}"
        return Draft(EntrySource.mismatch, role, error, _text(payload.get("expected")) or None)
    if kind == EventKind.status.value and not run_has_error:
        state = payload.get("status", payload.get("state"))
        if state == "failed":
            return Draft(EntrySource.failed, role, _text(payload.get("reason")) or "the run failed without a reason", None)
    return None


def diagnose(draft: Draft, env: Mapping[str, Any] | None) -> Diagnosis:
    """Classify a draft with the node's facts (None: unknown node)."""
    try:
        facts = Environment.from_probe(env) if env else None
    except (ValueError, TypeError):
        facts = None  # a probe we cannot read: classify without it
    return classify(ErrorInfo.from_traceback_text(draft.error), facts, role=draft.role)


def environment_label(probe: Mapping[str, Any] | None, fallback: Any = None) -> str | None:
    """A short, filterable description of a node: ``cpu, no flash-attn``, ``cuda sm75 Tesla T4, no flash-attn``."""
    if not probe:
        if isinstance(fallback, str):
            return fallback
        if isinstance(fallback, Mapping) and isinstance(fallback.get("name"), str):
            return fallback["name"]
        return None
    parts = [str(probe.get("device") or "unknown device")]
    cc = probe.get("compute_capability")
    if isinstance(cc, (list, tuple)) and len(cc) == 2:
        parts[0] += f" sm{cc[0]}{cc[1]}"
    if probe.get("gpu_name"):
        parts[0] += f" {probe['gpu_name']}"
    version = probe.get("flash_attn_version")
    parts.append(f"flash-attn {version}" if version else "no flash-attn")
    return ", ".join(parts)[:200]


def model_of(spec: Mapping[str, Any], role: str | None) -> str | None:
    """The model path the role loads (the critic's own, else the actor's)."""
    section = ROLE_SECTIONS.get(role or "actor", "actor_rollout_ref")
    model = (spec.get(section) or {}).get("model") or {}
    path = model.get("path") if isinstance(model, Mapping) else None
    return path if isinstance(path, str) else None


# --------------------------------------------------------------------------------------------
# Ingestion (inside events.append_events' transaction)


def _latest_probe(session: Session, run_id: int, before_seq: int) -> dict[str, Any] | None:
    row = session.exec(select(Event).where(Event.run_id == run_id, Event.kind == EventKind.env_probe.value,
                                           col(Event.seq) < before_seq).order_by(col(Event.seq).desc()).limit(1)).first()
    return dict(row.payload) if row is not None else None


def record_events(session: Session, *, run: Run, events: Sequence[EventCreate]) -> list[TroubleshootingEntry]:
    """Add (not commit) one entry per failure among ``events``, the fresh events of one append, in seq order."""
    if not any(ev.kind in (EventKind.fallback, EventKind.error, EventKind.status, EventKind.attention_mismatch)
               for ev in events):
        return []
    assert run.id is not None
    probe: dict[str, Any] | None = None
    probe_loaded = False
    has_error = session.exec(select(func.count()).select_from(TroubleshootingEntry).where(
        TroubleshootingEntry.run_id == run.id, TroubleshootingEntry.source == EntrySource.error.value)).one() > 0
    made = []
    for ev in events:
        if ev.kind == EventKind.env_probe:
            probe, probe_loaded = dict(ev.payload), True
            continue
        draft = draft_from_event(ev.kind.value, ev.payload, run_has_error=has_error)
        if draft is None:
            continue
        if not probe_loaded:
            probe, probe_loaded = _latest_probe(session, run.id, ev.seq), True
        has_error = has_error or draft.source == EntrySource.error
        diagnosis = diagnose(draft, probe)
        entry = TroubleshootingEntry(
            run_id=run.id, seq=ev.seq, source=draft.source.value, role=draft.role, category=diagnosis.category.value,
            implementation=(diagnosis.implementation or draft.implementation or "")[:200] or None,
            model=model_of(run.spec, draft.role), environment=environment_label(probe, run.environment),
            env=probe, error=draft.error[:ERROR_TEXT_MAX], diagnosis=diagnosis.as_dict())
        session.add(entry)
        made.append(entry)
    return made


# --------------------------------------------------------------------------------------------
# Reading


def get_entry(session: Session, *, entry_id: int) -> TroubleshootingEntry:
    entry = session.get(TroubleshootingEntry, entry_id)
    if entry is None:
        raise not_found("troubleshooting entry", entry_id, field="entry_id")
    return entry


def list_entries(
    session: Session,
    *,
    category: str | None = None,
    role: str | None = None,
    model: str | None = None,
    environment: str | None = None,
    run_id: int | None = None,
    limit: int = 50,
    offset: int = 0,
) -> tuple[list[TroubleshootingEntry], int]:
    """Newest first (by id: ingestion order), filtered; returns (page, total matching). An unknown category
    or role is an error listing the valid ones."""
    for name, value, valid in (("category", category, [c.value for c in Category]), ("role", role, list(NAMES))):
        if value and value not in valid:
            raise AppError(422, "invalid_request", f"{name} {value!r} is not valid; valid: {', '.join(valid)}",
                           field=name, value=value, valid=valid)
    query = select(TroubleshootingEntry)
    if category:
        query = query.where(TroubleshootingEntry.category == category)
    if role:
        query = query.where(TroubleshootingEntry.role == role)
    if model:
        query = query.where(col(TroubleshootingEntry.model).icontains(model, autoescape=True))
    if environment:
        query = query.where(col(TroubleshootingEntry.environment).icontains(environment, autoescape=True))
    if run_id is not None:
        query = query.where(TroubleshootingEntry.run_id == run_id)
    total = session.exec(select(func.count()).select_from(query.subquery())).one()
    rows = session.exec(query.order_by(col(TroubleshootingEntry.id).desc()).limit(limit).offset(offset)).all()
    return list(rows), total


def facets(session: Session) -> dict[str, list[str]]:
    """The values present, for the page's filter menus."""
    def distinct(column: Any) -> list[str]:
        return sorted(v for v in session.exec(select(column).distinct()).all() if v)

    return {"category": distinct(TroubleshootingEntry.category), "role": distinct(TroubleshootingEntry.role),
            "model": distinct(TroubleshootingEntry.model), "environment": distinct(TroubleshootingEntry.environment)}


@dataclass(frozen=True)
class Probe:
    facts: Environment
    source: str  # "run 7" | "recheck 3"


def later_probe(session: Session, entry: TroubleshootingEntry) -> Probe | None:
    """The newest probe taken after the entry: a newer run's env_probe event or a posted recheck."""
    event = session.exec(select(Event).where(Event.kind == EventKind.env_probe.value, col(Event.run_id) > entry.run_id)
                         .order_by(col(Event.ts).desc(), col(Event.id).desc()).limit(1)).first()
    recheck = session.exec(select(EnvironmentRecheck).where(col(EnvironmentRecheck.created_at) >= entry.created_at)
                           .order_by(col(EnvironmentRecheck.id).desc()).limit(1)).first()
    candidates: list[tuple[Any, Mapping[str, Any], str]] = []
    if event is not None:
        candidates.append((_aware(event.ts), event.payload, f"run {event.run_id}"))
    if recheck is not None:
        candidates.append((_aware(recheck.created_at), recheck.environment, f"recheck {recheck.id}"))
    for _, payload, source in sorted(candidates, key=lambda c: c[0], reverse=True):
        try:
            return Probe(Environment.from_probe(payload), source)
        except (ValueError, TypeError):
            continue
    return None


def _aware(value: datetime) -> datetime:
    """SQLite hands timestamps back without a zone; they were written in UTC."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def fast_path(entry: TroubleshootingEntry, probe: Probe | None) -> FastPath | None:
    """The return-to-fast-path suggestion when ``probe`` shows the entry's cause gone."""
    if probe is None:
        return None
    diagnosis = Diagnosis.from_dict(entry.diagnosis)
    sentence = suggest_return_to_fast_path(diagnosis, probe.facts)
    if sentence is None:
        return None
    return FastPath(sentence=sentence, patch=fast_path_patch(diagnosis), probe=probe.source)


def entry_public(session: Session, entry: TroubleshootingEntry, *, probe: Probe | None = None) -> EntryPublic:
    """The entry with its run's name and status, its notes (oldest first) and the fast-path suggestion
    against ``probe`` (default: the latest probe after the entry, ``later_probe``)."""
    run = session.get(Run, entry.run_id)
    notes = session.exec(select(TroubleshootingNote).where(TroubleshootingNote.entry_id == entry.id)
                         .order_by(col(TroubleshootingNote.id))).all()
    found = probe if probe is not None else later_probe(session, entry)
    return EntryPublic(
        **entry.model_dump(), run_name=run.name if run else "?", run_status=run.status if run else "?",
        notes=[NotePublic.model_validate(n, from_attributes=True) for n in notes],
        return_to_fast_path=fast_path(entry, found))


# --------------------------------------------------------------------------------------------
# Writing


def add_note(session: Session, *, entry_id: int, author: str, text: str) -> TroubleshootingNote:
    get_entry(session, entry_id=entry_id)
    note = TroubleshootingNote(entry_id=entry_id, author=author[:200], text=text)
    session.add(note)
    session.commit()
    session.refresh(note)
    return note


def retry_patch(session: Session, entry: TroubleshootingEntry, use: str) -> dict[str, Any]:
    """The patch a retry of ``entry`` applies: the remedy's, or the fast path's once a later probe allows it."""
    if use not in RETRY_USES:
        raise AppError(422, "invalid_request", f"use {use!r} is not a kind of retry; valid: {', '.join(RETRY_USES)}",
                       field="use", value=use, valid=list(RETRY_USES))
    diagnosis = Diagnosis.from_dict(entry.diagnosis)
    if use == "fast_path":
        suggestion = fast_path(entry, later_probe(session, entry))
        if suggestion is None:
            raise AppError(409, "cause_not_gone", f"entry {entry.id}: no later probe shows the cause "
                           f"({diagnosis.category.value}) gone; the fast path needs "
                           f"{diagnosis.return_to_fast_path_when or 'a fix the classifier cannot check'}",
                           field="use", value=use, valid=["remedy"])
        return suggestion.patch
    if not diagnosis.remedy.patch:
        raise AppError(409, "no_spec_remedy", f"entry {entry.id}: the remedy is not a spec change: "
                       f"{diagnosis.remedy.sentence}", field="entry_id", value=entry.id)
    return dict(diagnosis.remedy.patch)


def retry_entry(session: Session, *, entry_id: int, use: str = "remedy", name: str | None = None,
                launcher: Launcher | None = None) -> Run:
    """Retry the entry's run with the remedy (or fast-path) patch; the new run goes to the launcher if any."""
    from app.services.runs import retry_run

    entry = get_entry(session, entry_id=entry_id)
    patch = retry_patch(session, entry, use)
    return retry_run(session, run_id=entry.run_id, patch=patch, name=name, launcher=launcher)


def parse_environment(value: str | Mapping[str, Any], *, field: str = "environment") -> Environment:
    """A profile name or a probe dict; the keys a probe adds beyond the environment's (``PROBE_EXTRAS``) are
    ignored, any other unknown key is an error naming it."""
    if isinstance(value, Mapping):
        value = {k: v for k, v in value.items() if k not in PROBE_EXTRAS}
    return environment_of(value, field=field)


def recheck(session: Session, *, environment: str | Mapping[str, Any], author: str,
            limit: int = 200) -> tuple[EnvironmentRecheck, list[EntryPublic]]:
    """Store a probe and answer the entries (newest ``limit``) whose cause it shows gone."""
    env = parse_environment(environment)
    row = EnvironmentRecheck(environment=env.to_dict(), author=author[:200])
    session.add(row)
    session.commit()
    session.refresh(row)
    probe = Probe(env, f"recheck {row.id}")
    entries, _ = list_entries(session, limit=limit)
    suggestions = [entry_public(session, e, probe=probe) for e in entries if fast_path(e, probe) is not None]
    return row, suggestions
