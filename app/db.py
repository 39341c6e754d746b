"""Engines and migrations.

SQLite (the embedded default) runs in WAL mode with a 30 s busy timeout and foreign keys on, so the
web process, the event ingester and the CLI can share the file. PostgreSQL URLs use psycopg 3.

Alembic is the only way the schema changes: ``run_migrations(url)`` applies ``upgrade head`` and is
called at app start-up and by ``attnboard migrate``. Nothing here calls ``create_all``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.pool import NullPool

from app.core.config import normalise_database_url, sqlite_path

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"
"""``migrations/`` at the repository root (alembic.ini sits beside it for the alembic CLI)."""

SQLITE_BUSY_TIMEOUT_MS = 30_000


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def make_engine(url: str, **kwargs: Any) -> Engine:
    """An engine for a SQLite or PostgreSQL URL (``postgresql://`` is rewritten to psycopg 3)."""
    url = normalise_database_url(url)
    if url.startswith("sqlite"):
        db_file = sqlite_path(url)
        if db_file is not None:
            db_file.parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000},
            **kwargs,
        )
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    kwargs.setdefault("pool_pre_ping", True)
    if "poolclass" not in kwargs:
        kwargs.setdefault("pool_size", 10)
        kwargs.setdefault("max_overflow", 20)
    return create_engine(url, **kwargs)


def alembic_config(url: str) -> Config:
    """An Alembic config for ``url`` without reading alembic.ini (and without touching logging)."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", normalise_database_url(url).replace("%", "%%"))
    return cfg


def run_migrations(url: str, revision: str = "head") -> None:
    """Bring the database at ``url`` to ``revision`` (``alembic upgrade head``)."""
    engine = make_engine(url, poolclass=NullPool)
    try:
        with engine.begin() as connection:
            cfg = alembic_config(url)
            cfg.attributes["connection"] = connection
            command.upgrade(cfg, revision)
    finally:
        engine.dispose()

