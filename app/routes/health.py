"""Liveness and readiness for load balancers and compose health checks (no auth)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from app.deps import reader_of
from app.services import reads

router = APIRouter(prefix="/api", tags=["health"])


@router.get("/health")
async def health(request: Request) -> dict[str, Any]:
    """The database answers ``SELECT 1``."""
    reader = reader_of(request)
    await reader(reads.ping)
    return {"status": "ok", "database": reader.engine.dialect.name, "launcher": request.app.state.launcher is not None}
