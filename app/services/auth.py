"""Who is calling: a ``Principal`` found by the app's authenticators, tried in order.

The API's authenticator reads ``Authorization: Bearer atb_...``. The dashboard appends its own (a
session cookie) to ``app.state.authenticators``; anything that returns a Principal grants its scopes.
Authenticators read their credentials from the Authorization header or the cookies: a request with
neither is anonymous without calling them (``presents_credentials``), so it costs no database work.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from fastapi import Request
from sqlmodel import Session

from app.errors import AppError
from app.services.tokens import authenticate_token

Authenticator = Callable[[Request, Session], "Principal | None"]


@dataclass(frozen=True)
class Principal:
    kind: Literal["anonymous", "token", "session", "cli"]
    name: str
    scopes: frozenset[str] = field(default_factory=frozenset)
    token_id: int | None = None
    user_id: int | None = None

    def can(self, scope: str) -> bool:
        return scope in self.scopes


ANONYMOUS = Principal(kind="anonymous", name="anonymous")

_BEARER_HINT = "send 'Authorization: Bearer <token>' (create one with `attnboard token create`)"


def _unauthorized(message: str, value: str | None = None) -> AppError:
    return AppError(401, "unauthorized", message, field="Authorization", value=value,
                    valid="Bearer atb_...", headers={"WWW-Authenticate": "Bearer"})


def bearer_authenticator(request: Request, session: Session) -> Principal | None:
    """A Principal for a valid bearer token; None without an Authorization header; 401 for a bad one."""
    header = request.headers.get("authorization")
    if header is None:
        return None
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise _unauthorized(f"the Authorization header must be 'Bearer <token>'; {_BEARER_HINT}", scheme[:20])
    row = authenticate_token(session, token=token.strip())
    if row is None:
        raise _unauthorized("unknown or revoked token", token.strip()[:10] + "...")
    return Principal(kind="token", name=row.name, scopes=frozenset(row.scopes), token_id=row.id)


def presents_credentials(request: Request) -> bool:
    """Whether the request carries anything an authenticator could accept (an Authorization header or cookies)."""
    headers = request.headers
    return "authorization" in headers or "cookie" in headers


def current_principal(request: Request, session: Session, authenticators: list[Authenticator]) -> Principal:
    for authenticate in authenticators:
        principal = authenticate(request, session)
        if principal is not None:
            return principal
    return ANONYMOUS


def require_scope(principal: Principal, scope: Literal["read", "write", "admin"]) -> Principal:
    if principal.can(scope):
        return principal
    if principal.kind == "anonymous":
        raise _unauthorized(f"this endpoint needs a token with the {scope} scope; {_BEARER_HINT}")
    raise AppError(403, "forbidden", f"{principal.kind} {principal.name!r} lacks the {scope} scope",
                   field="scope", value=sorted(principal.scopes), valid=[scope])
