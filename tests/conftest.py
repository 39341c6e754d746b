"""Shared fixtures. Database fixtures run every test that uses them twice: on a SQLite file and on
the local PostgreSQL (127.0.0.1:5432, user postgres), where a fresh, uniquely named database is
created for the test session and dropped after it.

- ``db_url``: a migrated database URL (one per backend per test session); rows are deleted after
  every test, so each test starts empty.
- ``engine`` / ``session``: SQLAlchemy access to it.
- ``empty_db_url``: a brand-new, unmigrated database (for migration tests).
- ``settings`` / ``api`` (the FastAPI app) / ``client`` (its TestClient) / ``write_headers`` /
  ``read_headers``: the app on ``db_url``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text
from sqlmodel import Session

# A local ray.init in the tests (``local_ray``) keeps its node on 127.0.0.1: without this Ray swaps it for the
# machine's outward address. Read when ray is imported, so set here, before any test module imports it; a plain
# ``pytest`` run then matches ``scripts/test.sh``.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


def _pg_create(prefix: str) -> str:
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return name


def _pg_drop(name: str) -> None:
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _pg_url(name: str) -> str:
    return f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"


@pytest.fixture(scope="session", params=BACKENDS)
def db_backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="session")
def _migrated_url(db_backend: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from app.db import run_migrations

    if db_backend == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('db') / 'attnboard.db'}"
        run_migrations(url)
        yield url
        return
    name = _pg_create("attnboard_test")
    try:
        run_migrations(_pg_url(name))
        yield _pg_url(name)
    finally:
        _pg_drop(name)


@pytest.fixture(scope="session")
def _session_engine(_migrated_url: str) -> Iterator[Engine]:
    from app.db import make_engine

    engine = make_engine(_migrated_url)
    yield engine
    engine.dispose()


def _wipe(engine: Engine) -> None:
    """Empty every table the models define (children first), so the next test starts clean."""
    import app.main  # noqa: F401  (every model module the app uses)
    from app.models import metadata

    tables = [t.name for t in reversed(metadata.sorted_tables)]
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            conn.execute(text(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE"))
        else:
            for table in tables:
                conn.execute(text(f"DELETE FROM {table}"))


@pytest.fixture
def db_url(_migrated_url: str, _session_engine: Engine) -> Iterator[str]:
    yield _migrated_url
    _wipe(_session_engine)


@pytest.fixture
def engine(db_url: str, _session_engine: Engine) -> Engine:
    return _session_engine


@pytest.fixture
def session(engine: Engine) -> Iterator[Session]:
    with Session(engine, expire_on_commit=False) as s:
        yield s


@pytest.fixture
def empty_db_url(db_backend: str, tmp_path) -> Iterator[str]:
    if db_backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'empty.db'}"
        return
    name = _pg_create("attnboard_empty")
    try:
        yield _pg_url(name)
    finally:
        _pg_drop(name)


@pytest.fixture(scope="session")
def _session_settings(_migrated_url: str, tmp_path_factory: pytest.TempPathFactory):
    from app.core.config import Settings

    return Settings(DATA_DIR=tmp_path_factory.mktemp("data"), DATABASE_URL=_migrated_url)


@pytest.fixture(scope="session")
def _session_client(_session_settings) -> Iterator[TestClient]:
    """One app per backend for the whole session (building an app and its routes costs ~0.3 s)."""
    from app.main import create_app

    app = create_app(_session_settings, migrate=False)
    # raise_server_exceptions: a bug (a would-be 500) fails the test with its traceback.
    with TestClient(app, raise_server_exceptions=True) as c:
        yield c
    app.state.engine.dispose()


@pytest.fixture
def settings(_session_settings, db_url: str):
    return _session_settings


@pytest.fixture
def api(_session_client: TestClient, db_url: str) -> Iterator[FastAPI]:
    """The shared app; dependency overrides and launcher changes are undone after the test."""
    app = _session_client.app
    launcher = app.state.launcher
    yield app
    app.dependency_overrides.clear()
    app.state.launcher = launcher


@pytest.fixture
def client(api: FastAPI, _session_client: TestClient) -> TestClient:
    return _session_client


@pytest.fixture
def make_client(db_url: str, tmp_path) -> Iterator:
    """A separate app with other settings: ``make_client(REQUIRE_TOKEN_FOR_READS=True)``."""
    from app.core.config import Settings
    from app.main import create_app

    opened = []

    def make(**overrides) -> TestClient:
        app = create_app(Settings(DATA_DIR=tmp_path / "data", DATABASE_URL=db_url, **overrides), migrate=False)
        client = TestClient(app, raise_server_exceptions=True)
        client.__enter__()
        opened.append(client)
        return client

    yield make
    for client in opened:
        client.__exit__(None, None, None)
        client.app.state.engine.dispose()


def _token_headers(session: Session, scopes: list[str]) -> dict[str, str]:
    from app.services.tokens import create_token

    _, plaintext = create_token(session, name=f"test-{'-'.join(scopes)}", scopes=scopes)  # type: ignore[arg-type]
    return {"Authorization": f"Bearer {plaintext}"}


@pytest.fixture
def write_headers(session: Session) -> dict[str, str]:
    return _token_headers(session, ["read", "write"])


@pytest.fixture
def admin_headers(session: Session) -> dict[str, str]:
    """A token that may also mint and revoke tokens."""
    return _token_headers(session, ["read", "write", "admin"])


@pytest.fixture
def read_headers(session: Session) -> dict[str, str]:
    return _token_headers(session, ["read"])


# --------------------------------------------------------------------------------------------
# Ray for the modules that run the engine in-process: one local instance per module, on loopback.


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=4, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False,
                 namespace="attnboard-tests")
    yield
    if started:
        ray.shutdown()


@pytest.fixture(scope="module")
def world_of_one() -> Iterator[None]:
    """A gloo process group of one rank in this process (FSDP needs one), torn down afterwards."""
    import torch.distributed as dist

    from worker.engine.rank import free_port

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()
