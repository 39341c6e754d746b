"""Alembic is the only way the schema changes: migrations apply from nothing, go down and up again,
and match the models exactly (autogenerate finds no difference) on SQLite and PostgreSQL."""

from __future__ import annotations

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, text

import app.main  # noqa: F401  (imports every model module the app uses, so the metadata is complete)
from app.db import alembic_config, make_engine, run_migrations
from app.models import metadata

TABLES = set(metadata.tables)


def _diff(url: str) -> list:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": True, "compare_server_default": True})
            return compare_metadata(ctx, metadata)
    finally:
        engine.dispose()


def _tables(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return set(inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def test_upgrade_from_nothing_creates_every_table_and_is_repeatable(empty_db_url):
    assert _tables(empty_db_url) == set()
    run_migrations(empty_db_url)
    run_migrations(empty_db_url)  # a second start-up changes nothing
    assert _tables(empty_db_url) == TABLES


def test_models_and_migrations_do_not_drift(empty_db_url):
    run_migrations(empty_db_url)
    assert _diff(empty_db_url) == []


def test_drift_is_detected(empty_db_url):
    """The drift check can fail: a column the models lack shows up as a difference."""
    run_migrations(empty_db_url)
    engine = make_engine(empty_db_url)
    with engine.begin() as conn:
        conn.execute(text("ALTER TABLE run ADD COLUMN stray INTEGER"))
    engine.dispose()
    assert any(d[0] == "remove_column" and d[3].name == "stray" for d in _diff(empty_db_url))


def test_downgrade_to_base_and_up_again(empty_db_url):
    run_migrations(empty_db_url)
    command.downgrade(alembic_config(empty_db_url), "base")
    assert _tables(empty_db_url) == set()
    run_migrations(empty_db_url)
    assert _tables(empty_db_url) == TABLES


def test_one_head():
    script = ScriptDirectory.from_config(alembic_config("sqlite://"))
    assert len(script.get_heads()) == 1


def test_sqlite_connections_use_wal_busy_timeout_and_foreign_keys(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path / 'x.db'}")
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30_000
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    engine.dispose()


def test_app_code_never_calls_create_all():
    from pathlib import Path

    app_dir = Path(__file__).resolve().parents[2] / "app"
    offenders = [p for p in app_dir.rglob("*.py") if "create_all(" in p.read_text()]
    assert offenders == []


def test_app_start_up_applies_migrations(empty_db_url, tmp_path):
    from fastapi.testclient import TestClient

    from app.core.config import Settings
    from app.main import create_app

    api = create_app(Settings(DATA_DIR=tmp_path / "data", DATABASE_URL=empty_db_url))
    with TestClient(api) as client:
        assert client.get("/api/runs").json()["total"] == 0
    assert _tables(empty_db_url) == TABLES and _diff(empty_db_url) == []
