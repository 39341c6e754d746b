"""The runs list (``/``): filters by status and name, pages of 25, one attention badge per role."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from app.deps import PageUser, SessionDep
from app.models import RunStatus
from app.services import events as events_service
from app.services import runs as runs_service
from app.views.run_view import eager_settings, role_badges
from app.web import page_context, render

router = APIRouter(tags=["pages"], include_in_schema=False)

PAGE_SIZE = 25


@router.get("/")
def runs_list(request: Request, _: PageUser, session: SessionDep, status: str = "", q: str = "", page: int = 1) -> Response:
    statuses = [RunStatus(s) for s in status.split(",") if s in RunStatus.__members__]
    page = max(1, page)
    rows, total = runs_service.list_runs(session, status=statuses or None, name=q.strip() or None,
                                         limit=PAGE_SIZE, offset=(page - 1) * PAGE_SIZE)
    events = events_service.attention_events(session, run_ids=[r.id for r in rows if r.id is not None])
    badges = {run_id: role_badges(found) for run_id, found in events.items()}
    return render(request, "runs.html", {**page_context(request), "runs": rows, "total": total, "page": page,
                                         "pages": max(1, -(-total // PAGE_SIZE)), "status": status, "q": q,
                                         "statuses": [s.value for s in RunStatus], "badges": badges,
                                         "eager": {run_id: eager_settings(b) for run_id, b in badges.items()}},
                  block="runs")
