"""Browser sessions: log in with an API token, keep a signed session cookie, protect every form.

Sessions live in the database (``BrowserSession``): the cookie (HttpOnly, SameSite=Lax, ``Secure`` over https,
signed with ``SECRET_KEY`` by itsdangerous) holds the session's random secret, whose sha256 is the row's key, and
the session's CSRF token. Each request checks the row (not ended, not expired) and its token (not revoked), so
logout, expiry and revoking the token end the session server-side: a replayed cookie is worth nothing. The
session grants the token's scopes: a write token may launch, a read-only one may look.

CSRF is a double-submit token tied to the session: every page carries it (a hidden ``csrf_token``
field in forms, ``X-CSRF-Token`` on ``<body hx-headers>`` for htmx) and every browser POST must send
it back. Before login the token lives in its own signed cookie.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import timedelta
from typing import Any

from fastapi import Request
from itsdangerous import BadSignature, URLSafeTimedSerializer
from sqlalchemy import update
from sqlmodel import Session, select
from starlette.responses import Response

from app.errors import AppError
from app.models import ApiToken, BrowserSession, utcnow
from app.services.auth import Principal

SESSION_COOKIE = "attnboard_session"
CSRF_COOKIE = "attnboard_csrf"
CSRF_HEADER = "X-CSRF-Token"
CSRF_FIELD = "csrf_token"
SESSION_MAX_AGE_S = 12 * 3600
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def _signer(request: Request, purpose: str) -> URLSafeTimedSerializer:
    return URLSafeTimedSerializer(request.app.state.settings.SECRET_KEY, salt=f"attnboard.{purpose}")


def read_session(request: Request) -> dict[str, Any] | None:
    raw = request.cookies.get(SESSION_COOKIE)
    if not raw:
        return None
    try:
        data = _signer(request, "session").loads(raw, max_age=SESSION_MAX_AGE_S)
    except BadSignature:
        return None
    return data if isinstance(data, dict) and {"s", "c"} <= data.keys() and isinstance(data["s"], str) else None


def _session_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _live_session(session: Session, data: dict[str, Any]) -> tuple[BrowserSession, ApiToken] | None:
    """The session row and its token, when the session is neither ended nor expired and the token not revoked."""
    row = session.exec(select(BrowserSession).where(BrowserSession.session_hash == _session_hash(data["s"]))).first()
    if row is None or row.ended_at is not None:
        return None
    expires = row.expires_at if row.expires_at.tzinfo else row.expires_at.replace(tzinfo=utcnow().tzinfo)
    if expires <= utcnow():
        return None
    token = session.get(ApiToken, row.token_id)
    if token is None or token.revoked:
        return None
    return row, token


def _pre_session_csrf(request: Request) -> str | None:
    raw = request.cookies.get(CSRF_COOKIE)
    if not raw:
        return None
    try:
        value = _signer(request, "csrf").loads(raw, max_age=SESSION_MAX_AGE_S)
    except BadSignature:
        return None
    return value if isinstance(value, str) else None


def session_authenticator(request: Request, session: Session) -> Principal | None:
    """The app's authenticator for the session cookie (appended after the bearer one).

    A cookie alone never authorises a state change on the API: an unsafe request outside the pages
    (which check the form field themselves) must also carry the session's ``X-CSRF-Token`` header."""
    data = read_session(request)
    if data is None:
        return None
    live = _live_session(session, data)
    if live is None:
        return None
    row = live[1]
    csrf_needed = request.method not in SAFE_METHODS and not getattr(request.state, "csrf_checked", False)
    if csrf_needed and not hmac.compare_digest(request.headers.get(CSRF_HEADER, ""), str(data["c"])):
        return None
    return Principal(kind="session", name=row.name, scopes=frozenset(row.scopes), token_id=row.id)


def csrf_token_for(request: Request) -> str:
    """The CSRF token this browser must send back; a fresh pre-session one is set by ``app.web.render``."""
    data = read_session(request)
    if data is not None:
        return str(data["c"])
    existing = _pre_session_csrf(request)
    if existing:
        return existing
    token = secrets.token_urlsafe(24)
    # Set by ``app.web.render`` on the answer (``pending_cookies``): a newly minted pre-session token.
    request.state.pending_cookies = [(CSRF_COOKIE, _signer(request, "csrf").dumps(token),
                                      {"max_age": SESSION_MAX_AGE_S, "httponly": True, "samesite": "lax",
                                       "secure": request.url.scheme == "https", "path": "/"})]
    return token


async def check_csrf(request: Request) -> None:
    """403 unless a POST from the browser carries this session's CSRF token (header or form field)."""
    if request.method in SAFE_METHODS:
        return
    data = read_session(request)
    expected = str(data["c"]) if data is not None else _pre_session_csrf(request)
    given = request.headers.get(CSRF_HEADER)
    if given is None:
        form = await request.form()
        field = form.get(CSRF_FIELD)
        given = field if isinstance(field, str) else None
    if not expected or not given or not hmac.compare_digest(given, expected):
        raise AppError(403, "csrf_failed",
                       "the form's CSRF token is missing or does not match this session; reload the page and try again",
                       field=CSRF_FIELD, valid="the token of the page the form came from")
    request.state.csrf_checked = True


def start_session(request: Request, response: Response, token: ApiToken) -> None:
    """A new session row for ``token`` and its cookie (the secret is in the cookie only, its hash in the row)."""
    secret, csrf = secrets.token_urlsafe(32), secrets.token_urlsafe(24)
    with Session(request.app.state.engine) as session:
        session.add(BrowserSession(session_hash=_session_hash(secret), token_id=token.id, csrf=csrf,
                                   expires_at=utcnow() + timedelta(seconds=SESSION_MAX_AGE_S)))
        session.commit()
    value = _signer(request, "session").dumps({"s": secret, "c": csrf})
    response.set_cookie(SESSION_COOKIE, value, max_age=SESSION_MAX_AGE_S, httponly=True, samesite="lax",
                        secure=request.url.scheme == "https", path="/")
    response.delete_cookie(CSRF_COOKIE, path="/")


def end_session(response: Response, request: Request | None = None) -> None:
    """Log out: the session's row is ended (a replayed cookie no longer signs anyone in) and the cookie dropped."""
    data = read_session(request) if request is not None else None
    if data is not None:
        with Session(request.app.state.engine) as session:  # type: ignore[union-attr]
            session.exec(update(BrowserSession).where(BrowserSession.session_hash == _session_hash(data["s"]),  # type: ignore[call-overload]
                                                      BrowserSession.ended_at.is_(None)).values(ended_at=utcnow()))  # type: ignore[union-attr]
            session.commit()
    response.delete_cookie(SESSION_COOKIE, path="/")


def safe_next(target: str | None) -> str:
    """Only a local path may follow a login: no scheme, no host, no ``//`` or backslash tricks."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target or "\n" in target:
        return "/"
    return target
