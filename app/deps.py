"""Dependencies as ``Annotated`` aliases; tests swap them with ``app.dependency_overrides``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from sqlmodel import Session

from app.core.config import Settings
from app.services.auth import Principal, current_principal, require_scope
from app.services.launcher import Launcher


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_session(request: Request) -> Iterator[Session]:
    with Session(request.app.state.engine, expire_on_commit=False) as session:
        yield session


def get_launcher(request: Request) -> Launcher | None:
    return request.app.state.launcher


SettingsDep = Annotated[Settings, Depends(get_settings)]
SessionDep = Annotated[Session, Depends(get_session)]
LauncherDep = Annotated[Launcher | None, Depends(get_launcher)]


def get_principal(request: Request, session: SessionDep) -> Principal:
    return current_principal(request, session, request.app.state.authenticators)


CurrentPrincipal = Annotated[Principal, Depends(get_principal)]


def require_read(principal: CurrentPrincipal, settings: SettingsDep) -> Principal:
    """Reads are open unless ATTNBOARD_REQUIRE_TOKEN_FOR_READS; a presented token must still be valid."""
    if not settings.REQUIRE_TOKEN_FOR_READS:
        return principal
    return require_scope(principal, "read")


def require_write(principal: CurrentPrincipal) -> Principal:
    return require_scope(principal, "write")


def require_token(principal: CurrentPrincipal) -> Principal:
    """Any valid token (read scope): for POST endpoints that compute but change nothing."""
    return require_scope(principal, "read")


ReadAccess = Annotated[Principal, Depends(require_read)]
WriteAccess = Annotated[Principal, Depends(require_write)]
