"""Dependencies as ``Annotated`` aliases; tests swap them with ``app.dependency_overrides``.

The cheap ones are ``async def``: FastAPI runs a plain ``def`` dependency in the thread pool, a hop
that costs more than the dependency itself. Who is calling (``get_principal``) is found once per
request: on the event loop for a request without credentials (anonymous, no database work), in the
thread pool with a session of its own for one that carries an Authorization header or cookies, so a
revoked token is refused on its next request. The access checks (``require_read`` and friends) call
``get_principal`` directly rather than depend on it (FastAPI solves each dependency on every request);
override them, not ``get_principal``, to change access in a test."""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import Depends, FastAPI, Request
from sqlmodel import Session
from starlette.concurrency import run_in_threadpool

from app.core.config import Settings
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


def get_session(request: Request) -> Iterator[Session]:
    with Session(request.app.state.engine, expire_on_commit=False) as session:
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


SettingsDep = Annotated[Settings, Depends(get_settings)]
SessionDep = Annotated[Session, Depends(get_session)]
LauncherDep = Annotated[Launcher | None, Depends(_launcher)]


def _authenticate(request: Request) -> Principal:
    with Session(request.app.state.engine, expire_on_commit=False) as session:
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
