"""Settings: defaults, fail-fast validation with messages naming the variable, and the README table."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from app.core.config import ENV_PREFIX, Settings, normalise_database_url, settings_table_markdown

README = Path(__file__).resolve().parents[2] / "README.md"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch, tmp_path):
    for name in Settings.model_fields:
        monkeypatch.delenv(ENV_PREFIX + name, raising=False)
    monkeypatch.chdir(tmp_path)  # no stray .env, and ./data lands in tmp


def test_defaults_create_the_data_folder_and_a_sqlite_url(tmp_path):
    s = Settings()
    assert (tmp_path / "data").is_dir()
    assert s.DATABASE_URL == "sqlite:///data/attnboard.db"
    assert s.REQUIRE_TOKEN_FOR_READS is False and s.RAY_ADDRESS == "" and s.MODEL_ROOTS == []


def test_secret_key_is_generated_once_and_kept(tmp_path):
    first = Settings(DATA_DIR=tmp_path / "d").SECRET_KEY
    assert len(first) >= 32
    assert (tmp_path / "d" / "secret_key").stat().st_mode & 0o777 == 0o600
    assert first == Settings(DATA_DIR=tmp_path / "d").SECRET_KEY


def test_environment_variables_are_read(monkeypatch, tmp_path):
    root = tmp_path / "models"
    root.mkdir()
    monkeypatch.setenv("ATTNBOARD_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/x")
    monkeypatch.setenv("ATTNBOARD_REQUIRE_TOKEN_FOR_READS", "true")
    monkeypatch.setenv("ATTNBOARD_MODEL_ROOTS", f"{root}")
    monkeypatch.setenv("ATTNBOARD_RAY_ADDRESS", "ray://10.0.0.1:10001")
    s = Settings()
    assert s.DATABASE_URL == "postgresql+psycopg://postgres@127.0.0.1:5432/x"
    assert s.REQUIRE_TOKEN_FOR_READS is True
    assert [root.resolve()] == s.MODEL_ROOTS
    assert s.RAY_ADDRESS == "ray://10.0.0.1:10001"


@pytest.mark.parametrize("url,expected", [
    ("postgresql://u@h:5432/db", "postgresql+psycopg://u@h:5432/db"),
    ("postgres://u@h/db", "postgresql+psycopg://u@h/db"),
    ("postgresql+psycopg://u@h/db", "postgresql+psycopg://u@h/db"),
    ("sqlite:///./data/a.db", "sqlite:///./data/a.db"),
])
def test_database_urls_are_normalised(url, expected):
    assert normalise_database_url(url) == expected


@pytest.mark.parametrize("field,value,message", [
    ("DATABASE_URL", "mysql://root@localhost/db", "unsupported database scheme 'mysql'"),
    ("DATABASE_URL", "attnboard.db", "is not a database URL"),
    ("RAY_ADDRESS", "not an address", "is not a Ray address"),
    ("SECRET_KEY", "short", "too short"),
    ("MODEL_ROOTS", "/definitely/not/here", "is not an existing folder"),
    ("MODEL_ROOTS", "[broken", "is not a JSON list"),
    ("MAX_BODY_BYTES", 10, "greater than or equal to 1024"),
    ("REQUIRE_TOKEN_FOR_READS", "perhaps", "valid boolean"),
])
def test_bad_settings_fail_fast_naming_the_variable(monkeypatch, field, value, message):
    monkeypatch.setenv(ENV_PREFIX + field, str(value))
    with pytest.raises(ValidationError) as info:
        Settings()
    text = str(info.value)
    assert field in text and message in text


def test_every_setting_has_help_text():
    assert all(info.description and len(info.description) > 20 for info in Settings.model_fields.values())


def test_settings_table_lists_every_setting():
    table = settings_table_markdown()
    for name in Settings.model_fields:
        assert f"`{ENV_PREFIX}{name}`" in table


def test_readme_documents_every_setting():
    """README.md carries the table verbatim; regenerate it with `python -m app.core.config`."""
    assert settings_table_markdown() in README.read_text(), (
        "README.md's settings table is missing or stale; paste the output of `python -m app.core.config`"
    )
