"""Every dependency alias of the app, for the API and the pages; tests swap them with ``app.dependency_overrides``.

The cheap ones are ``async def``: FastAPI runs a plain ``def`` dependency in the thread pool, a hop
that costs more than the dependency itself. Who is calling (``get_principal``) is found once per
request: on the event loop for a request without credentials (anonymous, no database work), in the
thread pool with a session of its own for one that carries an Authorization header or cookies, so a
revoked token is refused on its next request. The access checks (``require_read`` and friends) call
``get_principal`` directly rather than depend on it (FastAPI solves each dependency on every request);
override them, not ``get_principal``, to change access in a test."""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request
from sqlmodel import Session
from starlette.concurrency import run_in_threadpool

from app import auth_browser
from app.core.config import Settings
from app.errors import AppError, LoginRequired
from app.services.auth import (
    ANONYMOUS,
    Principal,
    current_principal,
    presents_credentials,
    require_scope,
)
from app.services.common import ROOTS
from app.services.launcher import Launcher
from app.services.reads import Reader


async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def open_session(request: Request) -> Session:
    """A database session of the app's engine, for code that outlives a dependency (a stream's reads)."""
    return Session(request.app.state.engine, expire_on_commit=False)


def get_session(request: Request) -> Iterator[Session]:
    with open_session(request) as session:
        session.info[ROOTS] = request.app.state.settings.roots  # each run made in this request checks its paths
        yield session


def reader_of(request: Request) -> Reader:
    """The app's ``Reader`` for the hot reads (made on first use, closed by ``serving_lifespan``). The hot
    handlers call this rather than depend on it: each dependency costs FastAPI work on every request."""
    reader = getattr(request.app.state, "reader", None)
    if reader is None:
        reader = request.app.state.reader = Reader(request.app.state.engine)
    return reader


@asynccontextmanager
async def serving_lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Around serving, inside the app's own lifespan (the runs router carries this one; FastAPI nests a
    router's lifespan in the app's, so it starts after the app's start-up and ends before its shutdown).

    After start-up the objects made so far (imports, routes, models: some 130,000) are moved out of
    the cyclic garbage collector's reach with ``gc.freeze()``: a full collection walked them all, which
    took about 90 ms on a 2-core machine and set the p99 of every endpoint. At shutdown they are
    handed back (``gc.unfreeze()``, so a test process that builds many apps can free them) and the
    app's ``Reader`` is closed, before the app disposes its engine."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        reader = getattr(app.state, "reader", None)
        app.state.reader = None
        gc.unfreeze()
        if reader is not None:
            await reader.close()


def get_launcher(request: Request) -> Launcher | None:
    return request.app.state.launcher


async def _launcher(request: Request) -> Launcher | None:
    return get_launcher(request)


async def get_model_roots(request: Request) -> list[Path]:
    """The folders a model path may name (``ATTNBOARD_MODEL_ROOTS``): the preview reads head counts there."""
    return list(request.app.state.settings.MODEL_ROOTS)


SettingsDep = Annotated[Settings, Depends(get_settings)]
ModelRoots = Annotated[list[Path], Depends(get_model_roots)]
SessionDep = Annotated[Session, Depends(get_session)]
LauncherDep = Annotated[Launcher | None, Depends(_launcher)]


def _authenticate(request: Request) -> Principal:
    with open_session(request) as session:
        return current_principal(request, session, request.app.state.authenticators)


async def get_principal(request: Request) -> Principal:
    """Who is calling, found once per request and kept on ``request.state.principal``."""
    principal = getattr(request.state, "principal", None)
    if principal is None:
        principal = await run_in_threadpool(_authenticate, request) if presents_credentials(request) else ANONYMOUS
        request.state.principal = principal
    return principal


CurrentPrincipal = Annotated[Principal, Depends(get_principal)]

# The access checks take the request alone and call get_principal themselves: one dependency to solve
# per request instead of three.


async def require_read(request: Request) -> Principal:
    """Reads are open unless ATTNBOARD_REQUIRE_TOKEN_FOR_READS; a presented token must still be valid."""
    principal = await get_principal(request)
    if not request.app.state.settings.REQUIRE_TOKEN_FOR_READS:
        return principal
    return require_scope(principal, "read")


async def require_write(request: Request) -> Principal:
    return require_scope(await get_principal(request), "write")


async def require_admin(request: Request) -> Principal:
    """Minting, listing and revoking tokens: the admin scope (a write token cannot mint itself more)."""
    return require_scope(await get_principal(request), "admin")


async def require_token(request: Request) -> Principal:
    """Any valid token (read scope): for POST endpoints that compute but change nothing."""
    return require_scope(await get_principal(request), "read")


ReadAccess = Annotated[Principal, Depends(require_read)]
WriteAccess = Annotated[Principal, Depends(require_write)]


# The route-level lists (``dependencies=Read``) of the API's routers.
Read, Write = [Depends(require_read)], [Depends(require_write)]


# --------------------------------------------------------------------------------------------
# The dashboard's pages


def page_user(request: Request, session: SessionDep) -> Principal:
    """Who is looking (bearer token or session cookie), and the CSRF token the page embeds; a page that
    needs a principal sends an anonymous browser to /login (``LoginRequired``)."""
    principal = current_principal(request, session, request.app.state.authenticators)
    request.state.principal = principal
    request.state.csrf_token = auth_browser.csrf_token_for(request)
    if request.app.state.settings.REQUIRE_TOKEN_FOR_READS and not principal.can("read"):
        raise LoginRequired()
    return principal


PageUser = Annotated[Principal, Depends(page_user)]
CSRF = [Depends(auth_browser.check_csrf)]
"""Every browser POST: 403 unless it carries the session's CSRF token (``app.auth_browser``)."""


def require_page_write(principal: Principal) -> None:
    """A page that changes something: anonymous goes to /login, a read-only principal gets a 403."""
    if principal.kind == "anonymous":
        raise LoginRequired()
    if not principal.can("write"):
        raise AppError(403, "forbidden", f"{principal.kind} {principal.name!r} is read only: launching, cancelling "
                       "and retrying need a token with the write scope", field="scope",
                       value=sorted(principal.scopes), valid=["write"])


# --------------------------------------------------------------------------------------------
# Trials


def get_trial_starter(request: Request) -> Callable[[int], Any]:
    """What follows a new trial: the scheduler is woken (the trial starts in the engine host when its ranks
    are free; with no Ray launcher attached it stays queued)."""
    wake = getattr(request.app.state.launcher, "wake", None)
    return lambda trial_id: wake.set() if wake is not None else None


TrialStarter = Annotated[Callable[[int], Any], Depends(get_trial_starter)]
