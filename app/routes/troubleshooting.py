"""The troubleshooting log: the API (``router``) and the dashboard pages (``pages``).

API: list (filters, newest first), one entry, add a note, retry with the remedy (or the fast path), and
post a probe to recheck which causes are gone. Pages: ``/troubleshooting`` with filters, one entry's page,
and ``/runs/{id}/troubleshooting``, the per-run fragment (``_troubleshooting_entries.html``) the live run
page can include.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request, status
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from app.deps import (
    CSRF,
    CurrentPrincipal,
    LauncherDep,
    PageUser,
    ReadAccess,
    SessionDep,
    Write,
    get_launcher,
    require_page_write,
)
from app.errors import LAUNCH_RESPONSES, AppError
from app.models import INT32_MAX, RunPublic
from app.models_troubleshooting import (
    NOTE_MAX,
    EntriesPublic,
    EntryPublic,
    EntryRetry,
    NoteCreate,
    NotePublic,
    RecheckCreate,
    RecheckPublic,
)
from app.routes.params import Limit, NameFilter, Offset
from app.services import troubleshooting as service
from app.services.redact import entry_for
from app.views.run_view import offers_retry
from app.web import page_context, redirect, render

router = APIRouter(prefix="/api/troubleshooting", tags=["troubleshooting"])
pages = APIRouter(tags=["pages"], include_in_schema=False)
EntryId = Annotated[int, Path(ge=1, le=INT32_MAX, description="A troubleshooting entry's id.")]
Text = Annotated[str | None, Query(max_length=200)]


@router.get("", response_model=EntriesPublic)
def list_entries(
    session: SessionDep,
    reader: ReadAccess,
    category: Text = None,
    role: Text = None,
    model: NameFilter = None,
    environment: NameFilter = None,
    run_id: Annotated[int | None, Query(ge=1, le=INT32_MAX)] = None,
    limit: Limit = 50,
    offset: Offset = 0,
) -> EntriesPublic:
    """Newest first; ``model`` and ``environment`` match a case-insensitive substring. Anonymous readers get each
    error's last line without the traceback, absolute paths shortened."""
    rows, total = service.list_entries(session, category=category, role=role, model=model, environment=environment,
                                       run_id=run_id, limit=limit, offset=offset)
    return EntriesPublic(data=[entry_for(reader, service.entry_public(session, e)) for e in rows], total=total,
                         limit=limit, offset=offset)


@router.post("/recheck", response_model=RecheckPublic, status_code=status.HTTP_201_CREATED, dependencies=Write)
def recheck(session: SessionDep, principal: CurrentPrincipal, body: RecheckCreate) -> RecheckPublic:
    """Store a probe (or a profile) and answer the entries whose cause it shows gone."""
    row, suggestions = service.recheck(session, environment=body.environment, author=principal.name)
    return RecheckPublic(id=row.id, environment=row.environment, created_at=row.created_at, suggestions=suggestions)


@router.get("/{entry_id:int}", response_model=EntryPublic)
def get_entry(session: SessionDep, reader: ReadAccess, entry_id: EntryId) -> EntryPublic:
    return entry_for(reader, service.entry_public(session, service.get_entry(session, entry_id=entry_id)))


@router.post("/{entry_id}/notes", response_model=NotePublic, status_code=status.HTTP_201_CREATED, dependencies=Write)
def add_note(session: SessionDep, principal: CurrentPrincipal, entry_id: EntryId, body: NoteCreate) -> NotePublic:
    note = service.add_note(session, entry_id=entry_id, author=principal.name, text=body.text)
    return NotePublic.model_validate(note, from_attributes=True)


@router.post("/{entry_id}/retry", response_model=RunPublic, status_code=status.HTTP_201_CREATED, dependencies=Write,
             responses=LAUNCH_RESPONSES)
def retry(session: SessionDep, launcher: LauncherDep, entry_id: EntryId, body: EntryRetry | None = None) -> RunPublic:
    """A new run from the entry's run with the remedy's patch (``use=fast_path``: back to the fast path)."""
    body = body or EntryRetry()
    run = service.retry_entry(session, entry_id=entry_id, use=body.use, name=body.name, launcher=launcher)
    return RunPublic.model_validate(run)


# --------------------------------------------------------------------------------------------
# Pages

PAGE_SIZE = 25
ENTRIES_CONTEXT = {"offers_retry": offers_retry}
"""What ``_troubleshooting_entries.html`` needs beside its entries: the run page's rule for offering a retry."""
FILTERS = ("category", "role", "model", "environment", "run_id")


def _filters(request: Request) -> dict[str, str]:
    return {k: request.query_params.get(k, "").strip()[:200] for k in FILTERS}


@pages.get("/troubleshooting")
def log_page(request: Request, reader: PageUser, session: SessionDep, page: int = 1) -> Response:
    chosen = _filters(request)
    run_id = int(chosen["run_id"]) if chosen["run_id"].isdigit() and int(chosen["run_id"]) <= INT32_MAX else None
    page = max(1, min(page, 1_000_000))
    rows, total = service.list_entries(session, category=chosen["category"] or None, role=chosen["role"] or None,
                                       model=chosen["model"] or None, environment=chosen["environment"] or None,
                                       run_id=run_id, limit=PAGE_SIZE, offset=(page - 1) * PAGE_SIZE)
    query = "&".join(f"{k}={v}" for k, v in chosen.items() if v)
    return render(request, "troubleshooting.html", {
        **page_context(request), **ENTRIES_CONTEXT,
        "entries": [entry_for(reader, service.entry_public(session, e)) for e in rows], "total": total,
        "page": page, "pages": max(1, -(-total // PAGE_SIZE)), "filters": chosen, "facets": service.facets(session),
        "query": query}, block="entries")


@pages.get("/troubleshooting/{entry_id}")
def entry_page(request: Request, entry_id: int, reader: PageUser, session: SessionDep) -> Response:
    entry = entry_for(reader, service.entry_public(session, service.get_entry(session, entry_id=entry_id)))
    return render(request, "troubleshooting_entry.html", {**page_context(request), **ENTRIES_CONTEXT, "entry": entry,
                                                           "note_max": NOTE_MAX}, block="notes")


@pages.get("/runs/{run_id}/troubleshooting")
def run_entries(request: Request, run_id: int, reader: PageUser, session: SessionDep) -> Response:
    """The run's entries as the fragment the live run page includes (or loads with hx-get)."""
    rows, _total = service.list_entries(session, run_id=run_id, limit=200)
    return render(request, "_troubleshooting_entries.html", {
        **page_context(request), **ENTRIES_CONTEXT,
        "entries": [entry_for(reader, service.entry_public(session, e)) for e in rows], "compact": True})


@pages.post("/troubleshooting/{entry_id}/notes", dependencies=CSRF)
async def add_note_form(request: Request, entry_id: int, principal: PageUser, session: SessionDep) -> Response:
    require_page_write(principal)
    text = str((await request.form()).get("text") or "").strip()
    if not text or len(text) > NOTE_MAX or "\x00" in text:
        raise AppError(422, "invalid_request", f"text: a note needs 1 to {NOTE_MAX} characters (no NUL); got "
                       f"{len(text)}", field="text", value=text[:80], valid=f"1 to {NOTE_MAX} characters")
    await run_in_threadpool(service.add_note, session, entry_id=entry_id, author=principal.name, text=text)
    return redirect(f"/troubleshooting/{entry_id}#notes")


@pages.post("/troubleshooting/{entry_id}/retry", dependencies=CSRF)
async def retry_form(request: Request, entry_id: int, principal: PageUser, session: SessionDep) -> Response:
    """The one-click "retry with this remedy" (``use=remedy``) or "return to the fast path" (``use=fast_path``)."""
    require_page_write(principal)
    use = str((await request.form()).get("use") or "remedy")
    run = await run_in_threadpool(service.retry_entry, session, entry_id=entry_id, use=use,
                                  launcher=get_launcher(request))
    return redirect(f"/runs/{run.id}")
