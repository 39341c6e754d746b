"""Log in with an API token (a signed session cookie, ``app.auth_browser``) and log out."""

from __future__ import annotations

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


@router.post("/login", dependencies=CSRF)
async def login(request: Request, session: SessionDep) -> Response:
    form = await request.form()
    token = str(form.get("token") or "").strip()
    target = auth_browser.safe_next(str(form.get("next") or "/"))
    row = await run_in_threadpool(tokens_service.authenticate_token, session, token=token) if token else None
    if row is None:
        request.state.csrf_token = auth_browser.csrf_token_for(request)
        message = "enter an API token (atb_...)" if not token else "unknown or revoked token"
        return render(request, "login.html", {"csrf_token": request.state.csrf_token, "principal": None,
                                              "next": target, "error": message}, status_code=401)
    response = redirect(target)
    auth_browser.start_session(request, response, row)
    return response


@router.post("/logout", dependencies=CSRF)
def logout() -> Response:
    response = redirect("/login")
    auth_browser.end_session(response)
    return response
