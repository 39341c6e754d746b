"""The app factory. ``create_app()`` reads the settings, applies migrations at start-up (Alembic, never
``create_all``), and mounts the API routers; ``uvicorn app.main:app`` serves the module-level app."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from app.core.config import Settings, get_settings
from app.db import make_engine, run_migrations
from app.errors import install_error_handlers
from app.middleware import BodySizeLimit
from app.routes import health, pages, runs, specs, tokens, tools
from app.services.auth import bearer_authenticator
from app.services.launcher import Launcher

API_ROUTERS = (health.router, specs.router, runs.router, tools.router, tokens.router)


def create_app(settings: Settings | None = None, *, launcher: Launcher | None = None, migrate: bool = True) -> FastAPI:
    """A configured app. ``launcher`` hands runs to compute (None: runs stay queued);
    ``migrate=False`` skips ``upgrade head`` for callers that already ran it."""
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if migrate:
            run_migrations(settings.DATABASE_URL)
        yield
        app.state.engine.dispose()

    app = FastAPI(
        title="attnboard",
        summary="Configure, launch and watch PPO runs with the attention implementation per role made explicit.",
        version="0.1.0",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.engine = make_engine(settings.DATABASE_URL)
    app.state.launcher = launcher
    # Tried in order for every request; the dashboard appends its session-cookie authenticator.
    app.state.authenticators = [bearer_authenticator]

    app.add_middleware(BodySizeLimit, max_bytes=settings.MAX_BODY_BYTES)
    install_error_handlers(app)
    for router in API_ROUTERS:
        app.include_router(router)

    # ---- dashboard (owned by the dashboard engineer): add the pages router below this line.
    pages.install(app)
    # ---- end dashboard

    return app


def __getattr__(name: str) -> FastAPI:
    """``app.main:app`` for uvicorn, built on first access so importing this module has no side effects."""
    if name == "app":
        globals()["app"] = create_app()
        return globals()["app"]
    raise AttributeError(name)
