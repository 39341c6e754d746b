"""Saved run specs."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, status

from app.deps import Read, SessionDep, Write
from app.models import INT32_MAX, SpecCreate, SpecPublic, SpecsPublic, SpecUpdate
from app.routes.params import ExportFormatQuery, Limit, NameFilter, Offset
from app.services import interop, specs

router = APIRouter(prefix="/api/specs", tags=["specs"])
SpecId = Annotated[int, Path(ge=1, le=INT32_MAX, description="A saved spec's id.")]


@router.post("", response_model=SpecPublic, status_code=status.HTTP_201_CREATED, dependencies=Write)
def create_spec(session: SessionDep, body: SpecCreate) -> SpecPublic:
    return SpecPublic.model_validate(specs.create_spec(session, data=body))


@router.get("", response_model=SpecsPublic, dependencies=Read)
def list_specs(session: SessionDep, name: NameFilter = None, limit: Limit = 50, offset: Offset = 0) -> SpecsPublic:
    rows, total = specs.list_specs(session, name=name, limit=limit, offset=offset)
    return SpecsPublic(data=[SpecPublic.model_validate(r) for r in rows], total=total, limit=limit, offset=offset)


@router.get("/{spec_id}", response_model=SpecPublic, dependencies=Read)
def get_spec(session: SessionDep, spec_id: SpecId) -> SpecPublic:
    return SpecPublic.model_validate(specs.get_spec(session, spec_id=spec_id))


@router.put("/{spec_id}", response_model=SpecPublic, dependencies=Write)
def update_spec(session: SessionDep, spec_id: SpecId, body: SpecUpdate) -> SpecPublic:
    return SpecPublic.model_validate(specs.update_spec(session, spec_id=spec_id, data=body))


@router.delete("/{spec_id}", status_code=status.HTTP_204_NO_CONTENT, dependencies=Write)
def delete_spec(session: SessionDep, spec_id: SpecId) -> None:
    specs.delete_spec(session, spec_id=spec_id)


@router.get("/{spec_id}/export", dependencies=Read)
def export_spec(session: SessionDep, spec_id: SpecId, format: ExportFormatQuery = "cli") -> dict:
    """The spec as a verl command line (``cli``) or YAML, with warnings where verl behaves differently."""
    return interop.export_spec(tree=specs.get_spec(session, spec_id=spec_id).spec, format=format)
