"""The runs list (``/``): filters by status and name, archived runs on request, an order, pages of 25, one
attention badge per role; live (the table reloads itself while the page is open); archive and restore."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.datastructures import URL

from app.deps import CSRF, PageUser, SessionDep, require_page_write
from app.models import RunStatus
from app.services import events as events_service
from app.services import runs as runs_service
from app.views.run_view import eager_settings, role_badges
from app.web import page_context, redirect, render

router = APIRouter(tags=["pages"], include_in_schema=False)

PAGE_SIZE = 25
LIVE_S, QUIET_S = 3, 15
"""How often the table reloads itself: while a run on it is active, and otherwise (new runs appear)."""
SORT_LABELS = {"newest": "newest first", "oldest": "oldest first", "name": "name", "status": "status",
               "progress": "most steps done"}


@router.get("/")
def runs_list(request: Request, _: PageUser, session: SessionDep, status: str = "", q: str = "", page: int = 1,
              sort: str = "newest", archived: runs_service.ArchivedChoice | Literal[""] = "") -> Response:
    """``archived`` (``runs_service.ARCHIVED``): empty (the default) or ``hide`` hides archived runs, ``with``
    shows them among the others, ``only`` shows just them."""
    archived = "" if archived == runs_service.ARCHIVED_DEFAULT else archived
    statuses = [RunStatus(s) for s in status.split(",") if s in RunStatus.__members__]
    page = max(1, page)
    sort = sort if sort in runs_service.RUN_SORTS else "newest"
    rows, total = runs_service.list_runs(session, status=statuses or None, name=q.strip() or None,
                                         archived=runs_service.ARCHIVED[archived or runs_service.ARCHIVED_DEFAULT], sort=sort,
                                         limit=PAGE_SIZE, offset=(page - 1) * PAGE_SIZE)
    events = events_service.attention_events(session, run_ids=[r.id for r in rows if r.id is not None])
    badges = {run_id: role_badges(found) for run_id, found in events.items()}
    query = {"status": status, "q": q, "sort": sort, "archived": archived}
    active = any(r.status in ("queued", "starting", "running") for r in rows)
    return render(request, "runs.html", {**page_context(request), "runs": rows, "total": total, "page": page,
                                         "pages": max(1, -(-total // PAGE_SIZE)), "status": status, "q": q,
                                         "sort": sort, "sorts": SORT_LABELS, "archived": archived,
                                         "statuses": [s.value for s in RunStatus], "badges": badges,
                                         "self_url": str(URL("/").include_query_params(**query, page=page)),
                                         "page_url": lambda n: str(URL("/").include_query_params(**query, page=n)),
                                         "refresh_s": LIVE_S if active else QUIET_S,
                                         "eager": {r.id: eager_settings(badges.get(r.id, ()), r.status) for r in rows}},
                  block="runs")


@router.post("/runs/{run_id}/archive", dependencies=CSRF)
async def archive(request: Request, run_id: int, principal: PageUser, session: SessionDep) -> Response:
    """Archive the run (``archived=true``, the default) or bring it back (``archived=false``)."""
    require_page_write(principal)
    form = await request.form()
    runs_service.set_archived(session, run_id=run_id, archived=str(form.get("archived", "true")) != "false")
    back = request.headers.get("referer", "")
    return redirect(back if back.startswith(str(request.base_url)) else "/")
