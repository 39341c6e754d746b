"""Liveness and readiness for load balancers and compose health checks (no auth)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from sqlalchemy import text

from app.deps import LauncherDep, SessionDep

router = APIRouter(prefix="/api", tags=["health"])


@router.get("/health")
def health(session: SessionDep, launcher: LauncherDep) -> dict[str, Any]:
    session.exec(text("SELECT 1"))  # type: ignore[call-overload]
    return {"status": "ok", "database": session.get_bind().dialect.name, "launcher": launcher is not None}
