"""The live run page (``run.html``) and its server-sent event stream, and the page's actions: cancel,
retry (as it was, or with eager on one role) and resume from a checkpoint."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse
from sqlmodel import Session
from starlette.concurrency import run_in_threadpool

from app.deps import CSRF, PageUser, SessionDep, get_launcher, open_session, require_page_write
from app.errors import AppError
from app.models import Run
from app.services import checkpoints as checkpoints_service
from app.services import events as events_service
from app.services import runs as runs_service
from app.services.feeds import RunFeed
from app.views.live_run import checkpoint_context, eager_roles, load_view, passthrough_of, trimmed
from app.views.run_view import CHARTS, RunView, apply_event, fold, format_eta
from app.web import page_context, redirect, render, templates
from worker.spec import PASSTHROUGH_NOTE

router = APIRouter(tags=["pages"], include_in_schema=False)


def _run_context(request: Request, session: Session, run: Run) -> dict[str, Any]:
    view = load_view(session, run)
    return {**page_context(request), "run": run, "view": view, "charts": CHARTS, "eta": format_eta(view.eta_seconds),
            "eager_roles": eager_roles(run, view), "passthrough": passthrough_of(run),
            "passthrough_note": PASSTHROUGH_NOTE, **_checkpoints(request, run, view)}


def _checkpoints(request: Request, run: Run, view: RunView) -> dict[str, Any]:
    return checkpoint_context(request.app.state.settings.checkpoint_root, run, view)


@router.get("/runs/{run_id}")
def run_page(request: Request, run_id: int, _: PageUser, session: SessionDep) -> Response:
    run = runs_service.get_run(session, run_id=run_id)
    return render(request, "run.html", _run_context(request, session, run), block="status")


STREAM_BLOCKS = {"status": "status", "attention": "attention", "env_probe": "probe", "fallback": "trouble_row",
                 "error": "trouble_row", "attention_mismatch": "trouble_row", "log": "log_row",
                 "restart": "trouble_row"}
SSE_NAMES = {"fallback": "trouble", "error": "trouble", "attention_mismatch": "trouble", "restart": "trouble"}
HEARTBEAT_S = 15.0


def _sse(event: str, data: str, seq: int | None = None) -> str:
    lines = [f"event: {event}"] + ([f"id: {seq}"] if seq is not None else [])
    lines += [f"data: {line}" for line in data.splitlines() or [""]]
    return "\n".join(lines) + "\n\n"


def _block(request: Request, name: str, ctx: dict[str, Any]) -> str:
    template = templates.env.get_template("run.html")
    return "".join(template.blocks[name](template.new_context({**ctx, "request": request}))).strip()


@router.get("/runs/{run_id}/stream")
async def run_stream(request: Request, run_id: int, _: PageUser, after: int = 0) -> Response:
    """Server-sent events from seq > Last-Event-ID (or ?after=): each event's `id:` is its seq, so a
    reconnect resumes exactly. The events come from the run's feed (``app.services.feeds``: one read of
    the database per batch of new events, for every stream of the run), a comment line keeps a quiet
    stream open, and the stream ends (event `end`) once the run is terminal and every event has been sent."""
    header = request.headers.get("last-event-id", "")
    start = int(header) if header.isdigit() else max(0, after)

    def load() -> tuple[Run, RunView]:
        with open_session(request) as s:
            run = runs_service.get_run(s, run_id=run_id)
            events: list[Any] = []
            last = 0
            while last < start:
                batch, _ = events_service.events_since(s, run_id=run_id, after_seq=last, limit=min(1000, start - last))
                if not batch:
                    break
                events.extend(batch)
                last = batch[-1].seq
            return run, trimmed(fold(events, total_steps=run.total_steps))

    run, view = await run_in_threadpool(load)
    base = {"run": run, "charts": CHARTS, "principal": request.state.principal, "csrf_token": request.state.csrf_token}
    feeds = request.app.state.run_feeds

    def render(feed: RunFeed, ev: Any) -> list[str]:
        """The messages one event makes, after folding it into this stream's view; what does not depend on
        the viewer is rendered once per event for every stream of the run (``RunFeed.rendered``)."""
        trimmed(apply_event(view, seq=ev.seq, kind=ev.kind, payload=ev.payload, ts=ev.ts))

        def context(**extra: Any) -> dict[str, Any]:
            return {**base, "view": view, "eta": format_eta(view.eta_seconds), "entry": None,
                    "eager_roles": eager_roles(run, view), "resume_from": None, **extra}

        def shared(event: str, block: str, seq: int | None = None, **extra: Any) -> str:
            return feed.rendered(ev.seq, event, lambda: _sse(event, _block(request, block, context(**extra)), seq))

        out: list[str] = []
        saved = ev.kind == "log" and isinstance(ev.payload, dict) and "checkpoint" in ev.payload
        ended = ev.kind == "status" and view.terminal
        if saved or ev.kind == "restart" or ended:  # the checkpoints table, read from the run's folder once
            out.append(feed.rendered(ev.seq, "checkpoints", lambda: _sse("checkpoints", _block(
                request, "checkpoints", context(**_checkpoints(request, run, view))))))
        if ev.kind == "metric":
            return [*out, shared("status", "status"),
                    feed.rendered(ev.seq, "metric", lambda: _sse("metric", json.dumps(view.metrics[-1])
                                                                 if view.metrics else "{}", ev.seq))]
        name = STREAM_BLOCKS.get(ev.kind)
        if name is None:
            return [*out, _sse("other", "", ev.seq)]
        entry = None
        if name in ("trouble_row", "log_row"):
            entry = (view.trouble if ev.kind != "log" else view.logs)[-1]
        out.append(shared(SSE_NAMES.get(ev.kind, ev.kind), name, ev.seq, entry=entry))
        if ev.kind == "error":  # a role that could not load gets its row in the attention table
            out.append(shared("attention", "attention"))
        if ev.kind == "restart":  # the status widget says how often the run restarted
            out.append(shared("status", "status"))
        if ev.kind in ("fallback", "error", "attention", "status"):  # retry offers (the viewer's CSRF token)
            resume = _checkpoints(request, run, view) if ended else {}
            out.append(_sse("actions", _block(request, "actions", context(**resume))))
        return out

    async def messages() -> AsyncIterator[str]:
        yield "retry: 1000\n\n"
        async with feeds.follow(run_id, view.last_seq) as feed:
            async for batch in feed.after(view.last_seq, heartbeat_s=HEARTBEAT_S):
                # One chunk per batch: each chunk is a write of its own to the connection.
                chunk = [message for ev in batch.events for message in render(feed, ev)]
                if batch.finished:
                    chunk.append(_sse("end", "done"))
                yield "".join(chunk) or ": keep-alive\n\n"
                if batch.finished:
                    return

    return StreamingResponse(messages(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


@router.post("/runs/{run_id}/cancel", dependencies=CSRF)
def cancel(request: Request, run_id: int, principal: PageUser, session: SessionDep) -> Response:
    require_page_write(principal)
    runs_service.cancel_run(session, run_id=run_id, launcher=get_launcher(request))
    return redirect(f"/runs/{run_id}")


@router.post("/runs/{run_id}/retry", dependencies=CSRF)
async def retry(request: Request, run_id: int, principal: PageUser, session: SessionDep) -> Response:
    """Retry as it was, or with eager on one role (``eager_on=critic|actor``): the seed's first remedy."""
    require_page_write(principal)
    form = await request.form()
    role = str(form.get("eager_on") or "")
    sections = {"critic": "critic", "actor": "actor_rollout_ref"}
    if role and role not in sections:
        raise AppError(422, "invalid_request", f"eager_on {role!r} is not a role with its own attention setting",
                       field="eager_on", value=role, valid=list(sections))
    patch = {f"{sections[role]}.model.override_config.attn_implementation": "eager"} if role else {}
    new = await run_in_threadpool(runs_service.retry_run, session, run_id=run_id, patch=patch,
                                  launcher=get_launcher(request))
    return redirect(f"/runs/{new.id}")


@router.post("/runs/{run_id}/resume", dependencies=CSRF)
async def resume(request: Request, run_id: int, principal: PageUser, session: SessionDep) -> Response:
    """Resume a failed or cancelled run from its newest checkpoint: a new run (``retry_of`` this one)."""
    require_page_write(principal)
    run = runs_service.get_run(session, run_id=run_id)
    new = await run_in_threadpool(checkpoints_service.resume_run, session, run=run,
                                  root=request.app.state.settings.checkpoint_root, launcher=get_launcher(request))
    return redirect(f"/runs/{new.id}")
