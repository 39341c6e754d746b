"""The tokens page (``/tokens``): list every token (never a secret), mint one (its secret shown once) and revoke
one, for a browser signed in with an admin token; the same rules as ``/api/tokens`` and ``attnboard token``."""

from __future__ import annotations

from typing import Annotated, get_args

from fastapi import APIRouter, Path, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from app.deps import CSRF, PageUser, SessionDep
from app.errors import AppError, LoginRequired
from app.models import INT32_MAX, NAME_MAX, Scope
from app.services import tokens as service
from app.services.auth import Principal, require_scope
from app.web import page_context, redirect, render

router = APIRouter(tags=["pages"], include_in_schema=False)
SCOPE_SETS = {"read": ["read"], "write": ["read", "write"], "admin": ["admin", "read", "write"]}
assert set(SCOPE_SETS) == set(get_args(Scope))


def _admin(principal: Principal) -> None:
    if principal.kind == "anonymous":
        raise LoginRequired()
    require_scope(principal, "admin")


def _page(request: Request, session: SessionDep, *, created: tuple[str, str] | None = None,
          status_code: int = 200) -> Response:
    return render(request, "tokens.html", {**page_context(request), "tokens": service.list_tokens(session),
                                           "created": created, "scopes": list(SCOPE_SETS), "name_max": NAME_MAX},
                  status_code=status_code)


@router.get("/tokens")
def tokens_page(request: Request, principal: PageUser, session: SessionDep) -> Response:
    _admin(principal)
    return _page(request, session)


@router.post("/tokens", dependencies=CSRF)
async def create_token(request: Request, principal: PageUser, session: SessionDep) -> Response:
    _admin(principal)
    form = await request.form()
    name, scope = str(form.get("name") or "").strip(), str(form.get("scope") or "write")
    if not 1 <= len(name) <= NAME_MAX or "\x00" in name:
        raise AppError(422, "invalid_request", f"name: a token's name needs 1 to {NAME_MAX} characters", field="name",
                       value=name[:80], valid=f"1 to {NAME_MAX} characters")
    if scope not in SCOPE_SETS:
        raise AppError(422, "invalid_request", f"scope: {scope[:40]!r} is not a scope", field="scope", value=scope[:40],
                       valid=list(SCOPE_SETS))
    row, secret = await run_in_threadpool(service.create_token, session, name=name, scopes=SCOPE_SETS[scope])
    return _page(request, session, created=(row.name, secret), status_code=201)


@router.post("/tokens/{token_id}/revoke", dependencies=CSRF)
async def revoke_token(request: Request, token_id: Annotated[int, Path(ge=1, le=INT32_MAX)], principal: PageUser,
                       session: SessionDep) -> Response:
    _admin(principal)
    await run_in_threadpool(service.revoke_token, session, token_id=token_id)
    return redirect("/tokens")
