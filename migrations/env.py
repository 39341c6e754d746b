"""Alembic environment: migrates the database given by the caller's connection (app.db.run_migrations)
or, from the alembic command line, by ATTNBOARD_DATABASE_URL through the app settings."""

from __future__ import annotations

from logging.config import fileConfig

from alembic import context
from sqlalchemy import Connection

from app import models, models_troubleshooting  # noqa: F401  (registers the tables on the metadata)
from app.db import make_engine
from app.models import metadata

config = context.config
target_metadata = metadata


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        compare_type=True,
        # SQLite cannot ALTER most things: batch mode copies the table.
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        return
    if config.config_file_name is not None:
        fileConfig(config.config_file_name, disable_existing_loggers=False)
    url = config.get_main_option("sqlalchemy.url")
    if not url:
        from app.core.config import get_settings

        url = get_settings().DATABASE_URL
    engine = make_engine(url)
    with engine.connect() as conn:
        _configure(conn)
        conn.commit()
    engine.dispose()


if context.is_offline_mode():
    raise SystemExit("attnboard migrations run online only: use `attnboard migrate` or `alembic upgrade head`")
run_migrations_online()
