"""Saved run specs: create, list, get, update, delete. Stored as the canonical tree of a validated RunSpec."""

from __future__ import annotations

from sqlalchemy import func
from sqlmodel import Session, col, select

from app.errors import not_found
from app.models import Spec, SpecCreate, SpecUpdate, utcnow
from app.services.common import validated_spec


def create_spec(session: Session, *, data: SpecCreate) -> Spec:
    _, tree, _ = validated_spec(data.spec)
    row = Spec(name=data.name, description=data.description, spec=tree)
    session.add(row)
    session.commit()
    session.refresh(row)
    return row


def get_spec(session: Session, *, spec_id: int) -> Spec:
    row = session.get(Spec, spec_id)
    if row is None:
        raise not_found("spec", spec_id, field="spec_id")
    return row


def list_specs(session: Session, *, name: str | None = None, limit: int = 50, offset: int = 0) -> tuple[list[Spec], int]:
    """Newest first; ``name`` matches a case-insensitive substring. Returns (page, total)."""
    query = select(Spec)
    if name:
        query = query.where(col(Spec.name).icontains(name, autoescape=True))
    total = session.exec(select(func.count()).select_from(query.subquery())).one()
    rows = session.exec(query.order_by(col(Spec.id).desc()).limit(limit).offset(offset)).all()
    return list(rows), total


def update_spec(session: Session, *, spec_id: int, data: SpecUpdate) -> Spec:
    """Changes a saved spec; runs already submitted keep their own copy."""
    row = get_spec(session, spec_id=spec_id)
    if data.spec is not None:
        _, row.spec, _ = validated_spec(data.spec)
    if data.name is not None:
        row.name = data.name
    if data.description is not None:
        row.description = data.description
    row.updated_at = utcnow()
    session.add(row)
    session.commit()
    session.refresh(row)
    return row


def delete_spec(session: Session, *, spec_id: int) -> None:
    """Runs made from it keep their copy; their ``spec_id`` becomes null."""
    row = get_spec(session, spec_id=spec_id)
    session.delete(row)
    session.commit()
