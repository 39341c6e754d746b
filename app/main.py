"""The app factory. ``create_app()`` reads the settings, applies migrations at start-up (Alembic, never
``create_all``), and mounts the API routers; ``uvicorn app.main:app`` serves the module-level app.

``create_app(ray=True)`` (what ``attnboard serve`` and ``app.main:app`` use) also joins Ray at start-up
(``app.services.ray_runtime``) and runs the supervisor thread that schedules queued runs and moves
every worker event into the database (``app.services.pump``); at shutdown it stops the supervisor and
leaves Ray as ``ray_runtime`` describes."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles
from sqlalchemy import func
from sqlmodel import Session, col, select

from app import auth_browser
from app.core.config import Settings, database_identity, get_settings
from app.db import make_engine, run_migrations
from app.errors import ERROR_RESPONSES, install_error_handlers
from app.middleware import BodySizeLimit, DocsReadRule, LoginThrottle, NoNulInQuery, TrustedHosts, default_allowed_hosts
from app.models import Run
from app.models_troubleshooting import Trial
from app.routes import (
    compare,
    health,
    live_run,
    login,
    new_run,
    runs,
    runs_list,
    specs,
    tokens,
    tokens_page,
    tools,
    trials,
    troubleshooting,
)
from app.services import trials as trials_service
from app.services.auth import bearer_authenticator
from app.services.feeds import RunFeeds
from app.services.interop import import_calls
from app.services.launcher import Launcher
from app.services.pump import RunChanges, Supervisor
from app.services.ray_launcher import ACTIVE, TRIAL_ACTIVE, RayLauncher
from app.services.ray_runtime import RayRuntime, RayUnavailable
from app.web import STATIC_DIR
from worker.core.contract import host_name

log = logging.getLogger("attnboard")

API_ROUTERS = (health.router, specs.router, runs.router, tools.router, tokens.router)
# The dashboard, one module per page; /runs/new before /runs/{run_id}.
PAGE_ROUTERS = (new_run.router, live_run.router, runs_list.router, login.router, compare.router, tokens_page.router)


def create_app(settings: Settings | None = None, *, launcher: Launcher | None = None, migrate: bool = True,
               ray: bool = False) -> FastAPI:
    """A configured app. ``launcher`` hands runs to compute (None: runs stay queued); ``ray=True`` builds the
    Ray launcher and its supervisor at start-up instead; ``migrate=False`` skips ``upgrade head`` for
    callers that already ran it."""
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if migrate:
            run_migrations(settings.DATABASE_URL)
        with Session(app.state.engine) as session:
            trials_service.fail_orphaned_trials(session)
        app.state.run_changes.bind(asyncio.get_running_loop())
        # On the main thread (blocking start-up and shutdown is fine): Ray's driver wants its signal handlers
        # there and aborts the process when it is shut down from another thread.
        supervisor = _start_ray(app, settings) if ray else None
        if ray:
            app.state.imports.warm(app.state.imports.max_children)  # the served app's imports find children ready
        yield
        if supervisor is not None:
            _stop_ray(app, supervisor)
        app.state.imports.close()
        app.state.engine.dispose()

    app = FastAPI(
        title="attnboard",
        summary="Configure, launch and watch PPO runs with the attention implementation per role made explicit.",
        version="0.1.0",
        lifespan=lifespan,
        responses=ERROR_RESPONSES,
    )
    app.state.settings = settings
    app.state.engine = make_engine(settings.DATABASE_URL)
    app.state.launcher = launcher
    app.state.run_changes = RunChanges()
    app.state.imports = import_calls(settings.IMPORT_TIMEOUT_S)  # scripts are read in child processes
    app.state.run_feeds = RunFeeds(app.state.engine, app.state.run_changes)
    # Tried in order for every request; the dashboard appends its session-cookie authenticator.
    app.state.authenticators = [bearer_authenticator]

    app.add_middleware(BodySizeLimit, max_bytes=settings.MAX_BODY_BYTES)
    app.add_middleware(NoNulInQuery)
    app.add_middleware(LoginThrottle)
    app.add_middleware(DocsReadRule)
    app.add_middleware(TrustedHosts, allowed=settings.ALLOWED_HOSTS or default_allowed_hosts())  # runs first
    install_error_handlers(app)
    for router in API_ROUTERS:
        app.include_router(router)

    # The dashboard: its pages, its static files, and the session cookie as a second authenticator.
    for router in PAGE_ROUTERS:
        app.include_router(router)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    app.state.authenticators.append(auth_browser.session_authenticator)
    for module in (troubleshooting, trials):  # the troubleshooting log and the attention trials (issue 6)
        app.include_router(module.router)
        app.include_router(module.pages)

    return app


def _start_ray(app: FastAPI, settings: Settings) -> Supervisor:
    """Join Ray (starting the embedded head when no address is set) and start the supervisor. Ray being
    down does not stop the app: submissions answer 503 and the supervisor retries."""
    runtime = RayRuntime(address=settings.RAY_ADDRESS, data_dir=settings.DATA_DIR, num_cpus=settings.RAY_NUM_CPUS)
    launcher = RayLauncher(runtime, model_roots=[str(root) for root in settings.MODEL_ROOTS],
                           warm_ranks=settings.WARM_RANKS, warm_device=settings.WARM_DEVICE,
                           engine_name=host_name(database_identity(settings.DATABASE_URL)),
                           checkpoint_root=settings.checkpoint_root)
    try:
        runtime.ensure()
        launcher.warm()
    except RayUnavailable as exc:
        log.error("Ray is not available yet (%s); runs stay queued until it is", exc)
    except Exception:
        log.exception("could not start the engine host now; the first run starts it")
    app.state.launcher = launcher
    supervisor = Supervisor(app.state.engine, launcher, app.state.run_changes)
    supervisor.start()
    return supervisor


def _stop_ray(app: FastAPI, supervisor: Supervisor) -> None:
    supervisor.stop()
    with Session(app.state.engine) as session:
        active = session.exec(select(func.count()).select_from(Run)
                              .where(col(Run.status).in_(ACTIVE), col(Run.ray_job).is_not(None))).one()
        active += session.exec(select(func.count()).select_from(Trial)  # trials run in the engine host too
                               .where(col(Trial.status).in_(TRIAL_ACTIVE), col(Trial.engine_job).is_not(None))).one()
    if not active:
        supervisor.launcher.stop_host()
    supervisor.launcher.runtime.shutdown(active_runs=active)


def create_served_app() -> FastAPI:
    """The app ``attnboard serve`` runs: settings from the environment, runs launched on Ray."""
    return create_app(ray=True)


def __getattr__(name: str) -> FastAPI:
    """``app.main:app`` for uvicorn, built on first access so importing this module has no side effects."""
    if name == "app":
        globals()["app"] = create_served_app()
        return globals()["app"]
    raise AttributeError(name)
