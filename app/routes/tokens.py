"""API tokens. The first one comes from the CLI (`attnboard token create`, admin by default); later ones from
here, with a token that holds the admin scope."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, status

from app.deps import SessionDep, require_admin
from app.models import INT32_MAX, ApiTokenCreate, ApiTokenCreated, ApiTokenPublic
from app.services import tokens

router = APIRouter(prefix="/api/tokens", tags=["tokens"], dependencies=[Depends(require_admin)])


@router.post("", response_model=ApiTokenCreated, status_code=status.HTTP_201_CREATED)
def create_token(session: SessionDep, body: ApiTokenCreate) -> ApiTokenCreated:
    """Shows the secret once; only its sha256 is kept."""
    row, plaintext = tokens.create_token(session, name=body.name, scopes=body.scopes)
    return ApiTokenCreated(**ApiTokenPublic.model_validate(row).model_dump(), token=plaintext)


@router.get("", response_model=list[ApiTokenPublic])
def list_tokens(session: SessionDep) -> list[ApiTokenPublic]:
    return [ApiTokenPublic.model_validate(r) for r in tokens.list_tokens(session)]


@router.post("/{token_id}/revoke", response_model=ApiTokenPublic)
def revoke_token(session: SessionDep, token_id: Annotated[int, Path(ge=1, le=INT32_MAX)]) -> ApiTokenPublic:
    return ApiTokenPublic.model_validate(tokens.revoke_token(session, token_id=token_id))
