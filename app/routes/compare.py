"""Runs side by side (``/compare``): the spec keys that differ, the mean throughput, one reward chart."""

from __future__ import annotations

import re

from fastapi import APIRouter, Request
from fastapi.responses import Response

from app.deps import PageUser, SessionDep
from app.services import runs as runs_service
from app.views.live_run import load_view
from app.views.run_view import (
    MAX_MEMORY_MB,
    REWARD_KEYS,
    STEP_TIME_S,
    TOKENS_PER_S,
    aligned_series,
    max_of,
    mean_of,
    series,
    spec_differences,
)
from app.web import page_context, render
from worker.spec import flatten

router = APIRouter(tags=["pages"], include_in_schema=False)


@router.get("/compare")
def compare(request: Request, _: PageUser, session: SessionDep) -> Response:
    """``?ids=1,2`` (typed) or ``?ids=1&ids=2`` (the runs list's checkboxes): at most 8 runs."""
    ids = ",".join(request.query_params.getlist("ids"))
    wanted = [int(x) for x in re.findall(r"\d+", ids)][:8]
    runs = [runs_service.get_run(session, run_id=i) for i in dict.fromkeys(wanted)]
    views = [load_view(session, r) for r in runs]
    diffs = spec_differences([flatten(r.spec) for r in runs])
    curves = [(f"#{r.id} {r.name}", series(v, REWARD_KEYS)) for r, v in zip(runs, views, strict=True)]
    summary = [{"run": r, "view": v, "tokens_per_s": mean_of(v, TOKENS_PER_S), "step_time": mean_of(v, STEP_TIME_S),
                "peak_memory": max_of(v, MAX_MEMORY_MB), "badges": v.role_badges()} for r, v in zip(runs, views, strict=True)]
    return render(request, "compare.html", {**page_context(request), "runs": runs, "summary": summary, "diffs": diffs,
                                            "reward": aligned_series(curves), "ids": ids,
                                            "recent": runs_service.list_runs(session, limit=20)[0]})
