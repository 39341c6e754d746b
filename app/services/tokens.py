"""API tokens: ``atb_`` + 32 random bytes (urlsafe). Only the sha256 is stored; the plaintext is shown once."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import timedelta

from sqlmodel import Session, col, select

from app.errors import not_found
from app.models import ApiToken, Scope, utcnow

TOKEN_PREFIX = "atb_"
LAST_USED_RESOLUTION = timedelta(minutes=1)
"""``last_used_at`` is written at most this often per token, so reads stay reads."""


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def new_token_secret() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def create_token(session: Session, *, name: str, scopes: list[Scope]) -> tuple[ApiToken, str]:
    """A new token row and its plaintext (never stored, never shown again)."""
    plaintext = new_token_secret()
    row = ApiToken(name=name, token_hash=hash_token(plaintext), prefix=plaintext[:10],
                   scopes=sorted(set(scopes)))
    session.add(row)
    session.commit()
    session.refresh(row)
    return row, plaintext


def authenticate_token(session: Session, *, token: str) -> ApiToken | None:
    """The live token row for ``token``, or None when unknown or revoked."""
    if not token.startswith(TOKEN_PREFIX) or len(token) > 200:
        return None
    digest = hash_token(token)
    row = session.exec(select(ApiToken).where(ApiToken.token_hash == digest)).first()
    # The lookup is by hash; compare again in constant time so no path leaks timing on the secret.
    if row is None or row.revoked or not hmac.compare_digest(row.token_hash, digest):
        return None
    now = utcnow()
    last = row.last_used_at
    if last is None or now - (last if last.tzinfo else last.replace(tzinfo=now.tzinfo)) > LAST_USED_RESOLUTION:
        row.last_used_at = now
        session.add(row)
        session.commit()
    return row


def list_tokens(session: Session) -> list[ApiToken]:
    return list(session.exec(select(ApiToken).order_by(col(ApiToken.id))).all())


def revoke_token(session: Session, *, token_id: int) -> ApiToken:
    row = session.get(ApiToken, token_id)
    if row is None:
        raise not_found("token", token_id, field="token_id")
    row.revoked = True
    session.add(row)
    session.commit()
    session.refresh(row)
    return row
