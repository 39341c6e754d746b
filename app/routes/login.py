"""Log in with an API token (a signed session cookie, ``app.auth_browser``) and log out."""

from __future__ import annotations

from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from app import auth_browser
from app.deps import CSRF, SessionDep
from app.services import tokens as tokens_service
from app.web import redirect, render

router = APIRouter(tags=["pages"], include_in_schema=False)


@router.get("/login")
def login_page(request: Request, next: str = "/") -> Response:
    request.state.csrf_token = auth_browser.csrf_token_for(request)
    return render(request, "login.html", {"csrf_token": request.state.csrf_token, "principal": None,
                                          "next": auth_browser.safe_next(next), "error": None})


DRAFT = "draft"
"""The login form's hidden field holding the new-run form a logged-out Launch posted (URL-encoded): after the
sign-in the browser goes back to ``/runs/new?restore=1&<draft>``, the same form, filled."""
DRAFT_TARGET = "/runs/new"


def sign_in_keeping(request: Request, form: dict[str, list[str]]) -> Response:
    """The login page, asked for by a logged-out Launch: it carries the posted form, so nothing is lost."""
    request.state.csrf_token = auth_browser.csrf_token_for(request)
    fields = [(k, v) for k, values in form.items() if k != auth_browser.CSRF_FIELD for v in values]
    return render(request, "login.html", {"csrf_token": request.state.csrf_token, "principal": None,
                                          "next": DRAFT_TARGET, "draft": urlencode(fields),
                                          "error": "sign in to launch: the form comes back as you filled it"},
                  status_code=401)


@router.post("/login", dependencies=CSRF)
async def login(request: Request, session: SessionDep) -> Response:
    form = await request.form()
    token = str(form.get("token") or "").strip()
    target = auth_browser.safe_next(str(form.get("next") or "/"))
    draft = str(form.get(DRAFT) or "")
    row = await run_in_threadpool(tokens_service.authenticate_token, session, token=token) if token else None
    if row is None:
        request.state.csrf_token = auth_browser.csrf_token_for(request)
        message = "enter an API token (atb_...)" if not token else "unknown or revoked token"
        return render(request, "login.html", {"csrf_token": request.state.csrf_token, "principal": None,
                                              "next": target, "draft": draft, "error": message}, status_code=401)
    response = redirect(f"{DRAFT_TARGET}?restore=1&{draft}" if draft and target == DRAFT_TARGET else target)
    await run_in_threadpool(auth_browser.start_session, request, response, row)
    return response


@router.post("/logout", dependencies=CSRF)
async def logout(request: Request) -> Response:
    """Ends the session server-side (a replayed cookie signs no one in) and drops the cookie."""
    response = redirect("/login")
    await run_in_threadpool(auth_browser.end_session, response, request)
    return response
