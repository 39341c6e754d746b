"""The one settings object. Every setting is an ``ATTNBOARD_*`` environment variable (or a line in
``.env``), has help text, and is checked when the app starts: a bad value stops start-up with a
message naming the variable, the value and what is valid.

``settings_table_markdown()`` renders the table README.md carries (a test keeps them identical);
``python -m app.core.config`` prints it.
"""

from __future__ import annotations

import os
import re
import secrets
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from worker.spec.confine import Roots

ENV_PREFIX = "ATTNBOARD_"
SECRET_KEY_FILE = "secret_key"
_RAY_ADDRESS = re.compile(r"^(auto|(ray://)?[A-Za-z0-9_.\-\[\]:]+:\d{1,5})$")


def normalise_database_url(url: str) -> str:
    """``postgresql://`` and ``postgres://`` -> ``postgresql+psycopg://`` (the driver attnboard ships);
    SQLite URLs pass through. Anything else raises ValueError naming the valid schemes."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ValueError(f"{url!r} is not a database URL; valid: sqlite:///PATH or postgresql://USER@HOST:PORT/DB")
    if scheme in ("postgresql", "postgres", "postgresql+psycopg"):
        return f"postgresql+psycopg://{rest}"
    if scheme in ("sqlite", "sqlite+pysqlite"):
        return f"sqlite://{rest}"
    raise ValueError(f"unsupported database scheme {scheme!r} in {url!r}; valid: sqlite, postgresql, postgresql+psycopg")


def sqlite_path(url: str) -> Path | None:
    """The file behind a SQLite URL, or None for PostgreSQL and in-memory SQLite."""
    if not url.startswith("sqlite://"):
        return None
    path = url[len("sqlite:///"):].split("?", 1)[0]
    return None if path in ("", ":memory:") else Path(path)


def database_identity(url: str) -> str:
    """The database a URL names, stable across spellings: a SQLite file's absolute path, or the URL without
    its password. Keys the app's engine host, since run ids are only unique within one database.

    >>> database_identity("postgresql+psycopg://u:secret@db:5432/attnboard")
    'postgresql+psycopg://u@db:5432/attnboard'
    """
    db_file = sqlite_path(url)
    if db_file is not None:
        return f"sqlite:{db_file.resolve()}"
    return re.sub(r"//([^:/@]+):[^@]*@", r"//\1@", url)


class Settings(BaseSettings):
    """attnboard's configuration. Field names are the variable names without the prefix."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_file=".env", extra="ignore", case_sensitive=False)

    DATA_DIR: Path = Field(
        Path("./data"),
        description="Folder for the SQLite database, the generated secret key and run artefacts; created when missing.",
    )
    DATABASE_URL: str = Field(
        "",
        description="SQLAlchemy URL of the database: sqlite:///PATH (WAL mode) or postgresql://USER@HOST:PORT/DB "
        "(rewritten to postgresql+psycopg://). Empty means sqlite:///<DATA_DIR>/attnboard.db.",
    )
    REQUIRE_TOKEN_FOR_READS: bool = Field(
        False,
        description="When true, GET endpoints need a bearer token with the read scope too; "
        "mutating endpoints always need one with the write scope.",
    )
    SECRET_KEY: str = Field(
        "",
        description="Key that signs browser sessions (at least 32 characters). Empty means generated once "
        "and kept in <DATA_DIR>/secret_key.",
    )
    RAY_ADDRESS: str = Field(
        "",
        description="Ray cluster to submit runs to (auto, HOST:PORT or ray://HOST:PORT). Empty means the app "
        "starts a local Ray on 127.0.0.1.",
    )
    RAY_NUM_CPUS: int = Field(
        0,
        ge=0,
        le=4096,
        description="CPUs the embedded Ray head offers (a run's CPU ranks share them, each running as many torch "
        "threads as it holds, unless the spec sets attnboard.rank_cpus); 0 means the machine's CPU count. Ignored "
        "when RAY_ADDRESS is set.",
    )
    WARM_RANKS: int = Field(
        1,
        ge=0,
        le=1024,
        description="Rank workers the engine keeps started between runs, so a run that fits in them starts "
        "without waiting for new processes; each holds what a rank of a run of that many ranks asks Ray for "
        "(its share of the CPUs, plus 1 GPU on cuda) and the scheduler counts idle ones as free. 0 starts new rank "
        "workers for every run.",
    )
    WARM_DEVICE: Literal["cpu", "cuda"] = Field(
        "cpu",
        description="Device of the warm rank workers: cpu, or cuda for runs with trainer.device=cuda.",
    )
    MODEL_ROOTS: Annotated[list[Path], NoDecode] = Field(
        default_factory=list,
        description="Folders local Hugging Face models may be loaded from, separated by ':' (or a JSON list); "
        "each must exist. Empty allows only the built-in models.",
    )
    DATA_ROOTS: Annotated[list[Path], NoDecode] = Field(
        default_factory=list,
        description="Folders data files (data.train_files) may be read from, separated by ':' (or a JSON list); "
        "each must exist. Empty allows only the built-in tasks. A path outside them is refused at submit (422 "
        "naming the key), the same whether or not it exists.",
    )
    CHECKPOINT_DIR: str = Field(
        "",
        description="Folder of the runs' artefacts: run N's relative trainer.default_local_dir (its checkpoints) "
        "goes under <CHECKPOINT_DIR>/N, and absolute checkpoint paths in a spec must lie inside it. On a cluster, "
        "a path every Ray node and the app reach (shared storage). Empty means <DATA_DIR>/runs.",
    )
    MAX_BODY_BYTES: int = Field(
        1_048_576,
        ge=1024,
        le=1_073_741_824,
        description="Largest request body accepted, in bytes; bigger requests get 413.",
    )

    IMPORT_TIMEOUT_S: float = Field(
        1.5,
        gt=0,
        le=600,
        description="Wall clock of one import of a verl script or YAML (POST /api/import, the form's import box), "
        "in seconds: the text is read in a child process, killed when it overruns, and the import answers 422 "
        "import_timeout; the server keeps answering meanwhile.",
    )

    ALLOWED_HOSTS: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Host names the server answers to, separated by ',' (* any, *.example.com its subdomains); "
        "other Host headers get 400, so a page on another domain rebound to this address reads nothing. Empty "
        "means the loopback names, this machine's names and the address a connection reached.",
    )

    @field_validator("ALLOWED_HOSTS", mode="before")
    @classmethod
    def _split_hosts(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("DATABASE_URL")
    @classmethod
    def _check_url(cls, value: str) -> str:
        return normalise_database_url(value) if value else value

    @field_validator("RAY_ADDRESS")
    @classmethod
    def _check_ray(cls, value: str) -> str:
        value = value.strip()
        if value and not _RAY_ADDRESS.match(value):
            raise ValueError(f"{value!r} is not a Ray address; valid: empty (local Ray), auto, HOST:PORT or ray://HOST:PORT")
        return value

    @field_validator("MODEL_ROOTS", "DATA_ROOTS", mode="before")
    @classmethod
    def _split_roots(cls, value: Any) -> Any:
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                import json

                try:
                    return json.loads(text)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{value!r} is not a JSON list of folders: {exc.msg}") from None
            return [part for part in text.split(os.pathsep) if part]
        return value

    @field_validator("MODEL_ROOTS", "DATA_ROOTS")
    @classmethod
    def _roots_exist(cls, value: list[Path], info: Any) -> list[Path]:
        roots = []
        for root in value:
            resolved = root.expanduser().resolve()
            if not resolved.is_dir():
                what = "model" if info.field_name == "MODEL_ROOTS" else "data"
                raise ValueError(f"{what} root {str(root)!r} is not an existing folder")
            roots.append(resolved)
        return roots

    @field_validator("CHECKPOINT_DIR")
    @classmethod
    def _check_checkpoint_dir(cls, value: str) -> str:
        value = value.strip()
        if value and Path(value).expanduser().exists() and not Path(value).expanduser().is_dir():
            raise ValueError(f"checkpoint folder {value!r} exists and is not a folder")
        return value

    @property
    def checkpoint_root(self) -> Path:
        """Where run N's artefacts go (``<root>/N``): CHECKPOINT_DIR, or <DATA_DIR>/runs; absolute, since the
        engine runs in other processes with other working folders."""
        chosen = Path(self.CHECKPOINT_DIR).expanduser() if self.CHECKPOINT_DIR else self.DATA_DIR / "runs"
        return chosen.resolve()

    @property
    def roots(self) -> Roots:
        """The folders a submitted spec's paths must lie in (``worker.spec.confine``)."""
        return Roots(models=tuple(self.MODEL_ROOTS), data=tuple(self.DATA_ROOTS), checkpoints=self.checkpoint_root)

    @field_validator("SECRET_KEY")
    @classmethod
    def _check_secret(cls, value: str) -> str:
        if value and len(value) < 32:
            raise ValueError(f"a secret key of {len(value)} characters is too short; valid: at least 32 characters")
        return value

    @model_validator(mode="after")
    def _materialise(self) -> Settings:
        """Create the data folder, derive the default database URL, load or generate the secret key."""
        try:
            self.DATA_DIR.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ValueError(f"DATA_DIR {str(self.DATA_DIR)!r} cannot be created: {exc.strerror}") from None
        if not self.DATABASE_URL:
            self.DATABASE_URL = f"sqlite:///{self.DATA_DIR / 'attnboard.db'}"
        db_file = sqlite_path(self.DATABASE_URL)
        if db_file is not None:
            db_file.parent.mkdir(parents=True, exist_ok=True)
        if not self.SECRET_KEY:
            self.SECRET_KEY = _load_or_create_secret(self.DATA_DIR / SECRET_KEY_FILE)
        return self


def _load_or_create_secret(path: Path) -> str:
    if path.exists():
        key = path.read_text().strip()
        if len(key) >= 32:
            return key
    key = secrets.token_urlsafe(48)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(key + "\n")
    return key


def served_pointer_path() -> Path:
    """Where ``attnboard serve`` notes the database it serves, so the CLI run from another folder finds it:
    ``$XDG_CONFIG_HOME/attnboard/served.json`` (``~/.config`` by default), readable by this user only."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "attnboard" / "served.json"


def record_served(settings: Settings) -> None:
    """Note the served data folder and database (called by ``attnboard serve``); a failure to write is harmless."""
    import json

    path = served_pointer_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump({"DATA_DIR": str(settings.DATA_DIR.resolve()), "DATABASE_URL": settings.DATABASE_URL}, fh)
    except OSError:
        pass


def served_settings() -> Settings | None:
    """The settings of the database ``attnboard serve`` last served, from ``served_pointer_path()``; None without."""
    import json

    try:
        noted = json.loads(served_pointer_path().read_text())
        return Settings(DATA_DIR=Path(noted["DATA_DIR"]), DATABASE_URL=noted["DATABASE_URL"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


@lru_cache
def get_settings() -> Settings:
    """The process's settings, read from the environment once."""
    return Settings()


def settings_table_markdown() -> str:
    """The README table of settings: variable, default, description; one row per field."""
    rows = ["| Variable | Default | Description |", "| --- | --- | --- |"]
    for name, info in Settings.model_fields.items():
        if info.default_factory is not None:
            default = repr(info.default_factory())
        elif isinstance(info.default, Path):
            default = info.default.as_posix() if info.default.is_absolute() else f"./{info.default.as_posix()}"
        else:
            default = repr(info.default) if info.default != "" else "(empty)"
        if default == "[]":
            default = "(empty)"
        rows.append(f"| `{ENV_PREFIX}{name}` | `{default}` | {info.description} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(settings_table_markdown(), end="")
