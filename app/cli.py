"""The ``attnboard`` command line: serve the app, migrate, create tokens, the pure spec tools
(resolve, import, export) that need no server, and ``run`` (the engine alone, ``python -m worker run``).
Every command takes ``--json`` for machines.

Exit codes: 0 success, 2 invalid input (bad spec, file, profile), 1 anything else; ``submit`` adds
3 (the run was cancelled), 4 (server or Ray unreachable) and 5 (still running at ``--timeout``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from worker.attention.preview import preview
from worker.attention.resolution import Resolution
from worker.core.environment import PROFILES, Environment, UnknownProfileError, environment_from
from worker.interop.specfile import load_spec_file
from worker.interop.verl import VerlImportError, export_command, export_yaml
from worker.spec import PASSTHROUGH, SpecError

EXIT_INVALID = 2

cli = typer.Typer(
    name="attnboard",
    help="Configure, launch and watch PPO runs with the attention implementation per role made explicit.",
    no_args_is_help=True,
    add_completion=False,
)
token_cli = typer.Typer(help="API tokens for CI and the browser login.", no_args_is_help=True)
cli.add_typer(token_cli, name="token")

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for machines instead of tables.")]


def _fail(message: str, *, as_json: bool, code: int = EXIT_INVALID, **extra: Any) -> NoReturn:
    if as_json:
        print(json.dumps({"error": {"message": message, **extra}}))
    else:
        err.print(Text.assemble(("error: ", "bold red"), message))
    raise typer.Exit(code)


def _load(spec_path: Path, as_json: bool):
    try:
        return load_spec_file(spec_path)
    except FileNotFoundError as exc:
        _fail(str(exc), as_json=as_json, field="SPEC", value=str(spec_path))
    except VerlImportError as exc:
        issues = [i.as_dict() for i in exc.issues]
        _fail(str(exc), as_json=as_json, token=exc.token, position=exc.position, issues=issues)
    except SpecError as exc:
        _fail(str(exc), as_json=as_json, issues=[i.as_dict() for i in exc.issues])


def _environment(env: str, env_file: Path | None, as_json: bool) -> Environment:
    try:
        if env_file is not None:
            return environment_from(json.loads(env_file.read_text(encoding="utf-8")))
        return environment_from(env)
    except UnknownProfileError as exc:
        _fail(str(exc), as_json=as_json, field="--env", value=env, valid=list(PROFILES))
    except (OSError, ValueError) as exc:
        _fail(f"--env-file {env_file}: {exc}", as_json=as_json, field="--env-file")


STATUS_STYLE = {"ok": "green", "forced": "yellow", "fallback": "dark_orange", "error": "bold red"}


def _warn(text: str) -> None:
    err.print(Text.assemble(("warning: ", "yellow"), text))


def print_resolution(resolution: Resolution) -> None:
    """A table of the four roles (with what verl's rollout engine runs, where it picks its own backend), then
    each role's ordered reasons (rule id and sentence)."""
    table = Table(title=f"attention per role on {resolution.environment} (policy {resolution.policy}, "
                        f"verl model_engine={resolution.model_engine})",
                  title_justify="left")
    for column in ("role", "requested", "source", "effective", "status", "under verl"):
        table.add_column(column, no_wrap=True)
    for role in resolution.roles.values():
        status = Text(role.status, style=STATUS_STYLE.get(role.status, ""))
        engine = role.verl_engine
        under_verl = (role.under_verl.effective if role.under_verl
                      else (engine.effective or "refused") if engine else "-")
        table.add_row(role.role, role.requested, role.source, role.effective or "-", status, under_verl)
    out.print(table)
    for role in resolution.roles.values():
        out.print(Text(f"{role.role}:", style="bold"))
        for reason in role.reasons:
            out.print(Text.assemble("  ", (f"[{reason.rule}]", "cyan"), f" {reason.text}"))
        if role.error:
            out.print(Text.assemble("  ", ("error: ", "bold red"), role.error))
        if role.verl_engine:
            engine = role.verl_engine
            out.print(Text(f"  under verl (model_engine={engine.engine}): {engine.key}={engine.requested} "
                           f"({engine.source}) -> {engine.effective or 'refused'}"))
            for reason in engine.reasons:
                out.print(Text.assemble("    ", (f"[{reason.rule}]", "cyan"), f" {reason.text}"))
            if engine.error:
                out.print(Text.assemble("    ", ("verl error: ", "bold red"), engine.error))


@cli.command("resolve")
def resolve_cmd(
    spec: Annotated[Path, typer.Argument(help="Spec file: YAML/JSON, or a verl command line.")],
    env: Annotated[str, typer.Option("--env", help=f"Target profile: {', '.join(PROFILES)}.")] = "cpu",
    env_file: Annotated[Path | None, typer.Option("--env-file", help="A probe result (JSON) instead of a profile.")] = None,
    confine: Annotated[bool, typer.Option(
        "--confine", help="Also check the spec's paths against the server's allowed folders (ATTNBOARD_MODEL_ROOTS, "
                          "ATTNBOARD_DATA_ROOTS, the checkpoint folder), as POST /api/runs does.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Show, per role, which attention implementation will run and why, and every issue a launch would
    refuse (the checks of POST /api/resolve: Ulysses sizes against the model folder's head counts, batch
    arithmetic, ...; with --confine, paths outside the server's allowed folders). Exit 2 on an invalid spec,
    1 when a role cannot load."""
    imported = _load(spec, as_json)
    environment = _environment(env, env_file, as_json)
    result = preview(imported.spec, environment)
    if confine:
        from app.core.config import get_settings
        from worker.spec.confine import path_issues

        result.issues[:0] = path_issues(imported.spec, get_settings().roots)
    errors = result.errors
    if as_json:
        print(json.dumps({**result.resolution.to_dict(), "issues": [i.as_dict() for i in result.issues],
                          "warnings": imported.warnings}))
    else:
        print_resolution(result.resolution)
        for issue in result.issues:
            line = Text.assemble((f"{issue.severity}: ", "bold red" if issue.severity == "error" else "yellow"),
                                 f"{issue.field}: {issue.message}")
            (err if issue.severity == "error" else out).print(line)
        for warning in imported.warnings:
            _warn(warning)
    raise typer.Exit(EXIT_INVALID if errors else (0 if result.resolution.ok else 1))


@cli.command("import")
def import_cmd(
    file: Annotated[Path, typer.Argument(help="A verl command line or YAML file.")],
    as_json: JsonOpt = False,
) -> None:
    """Import a verl command line or YAML into an attnboard spec (printed as YAML, or JSON with --json)."""
    imported = _load(file, as_json)
    if as_json:
        print(json.dumps({"spec": imported.spec.model_dump(mode="json"), "warnings": imported.warnings,
                          "overrides": imported.overrides, PASSTHROUGH: imported.spec.verl_passthrough}))
        return
    out.print(export_yaml(imported.spec).text, markup=False)
    for warning in imported.warnings:
        _warn(warning)


@cli.command("export")
def export_cmd(
    spec: Annotated[Path, typer.Argument(help="Spec file: YAML/JSON, or a verl command line.")],
    fmt: Annotated[str, typer.Option("--format", help="cli (a verl command line) or yaml.")] = "cli",
    full: Annotated[bool, typer.Option(
        "--full", help="Emit every key, not only those that differ from verl's defaults.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Export a spec as a verl command line (with the right + prefixes) or YAML."""
    if fmt not in ("cli", "yaml"):
        _fail(f"--format {fmt!r} is not valid; valid: cli, yaml", as_json=as_json, field="--format", value=fmt,
              valid=["cli", "yaml"])
    imported = _load(spec, as_json)
    result = export_command(imported.spec, full=full) if fmt == "cli" else export_yaml(imported.spec, full=True)
    if as_json:
        print(json.dumps({"format": fmt, "text": result.text, "warnings": result.warnings}))
        return
    out.print(result.text, markup=False)
    for warning in result.warnings:
        _warn(warning)


@cli.command("migrate")
def migrate_cmd(as_json: JsonOpt = False) -> None:
    """Apply the database migrations (Alembic upgrade head) to ATTNBOARD_DATABASE_URL."""
    from app.core.config import get_settings
    from app.db import run_migrations

    settings = get_settings()
    run_migrations(settings.DATABASE_URL)
    shown = _redact(settings.DATABASE_URL)
    if as_json:
        print(json.dumps({"migrated": True, "database": shown}))
    else:
        out.print(f"database {shown} is at the latest revision")


def _redact(url: str) -> str:
    """A database URL without its password, for printing."""
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


@cli.command("serve")
def serve_cmd(
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
    reload: Annotated[bool, typer.Option(help="Reload on code changes (development).")] = False,
    proxy_headers: Annotated[bool, typer.Option(
        help="Behind a reverse proxy: take the client address and the scheme (https) from X-Forwarded-For and "
             "X-Forwarded-Proto, so cookies get Secure and answers carry HSTS.")] = False,
    forwarded_allow_ips: Annotated[str, typer.Option(
        help="Proxies whose X-Forwarded-* headers are trusted (comma-separated addresses, or *).")] = "127.0.0.1",
) -> None:
    """Serve the dashboard and the REST API (migrations are applied at start-up)."""
    import uvicorn

    from app.core.config import get_settings, record_served

    record_served(get_settings())
    uvicorn.run("app.main:create_served_app", factory=True, host=host, port=port, reload=reload,
                proxy_headers=proxy_headers, forwarded_allow_ips=forwarded_allow_ips)


EXIT_FAILED, EXIT_CANCELLED, EXIT_UNREACHABLE, EXIT_TIMEOUT = 1, 3, 4, 5
SUBMIT_EXIT_CODES = {"succeeded": 0, "failed": EXIT_FAILED, "cancelled": EXIT_CANCELLED}
WAIT_CHUNK_S = 300.0


def _attention_rows(attention: dict[str, Any], effective: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Per role: requested -> effective (and what ran); from the wait answer, else the run's summary."""
    rows = [{"role": role, **{k: info.get(k) for k in ("requested", "effective", "observed", "status")}}
            for role, info in attention.items()]
    seen = {row["role"] for row in rows}
    rows += [{"role": role, "requested": None, "effective": value, "observed": None, "status": None}
             for role, value in (effective or {}).items() if role not in seen]
    return rows


def _print_outcome(run: dict[str, Any], attention: dict[str, Any], base: str) -> None:
    out.print(f"run {run['id']} {run['status']}: {run.get('status_reason') or ''}  ({base}/runs/{run['id']})",
              markup=False)
    rows = _attention_rows(attention, run.get("effective_attention"))
    if rows:
        table = Table(title="effective attention per role", title_justify="left")
        for column in ("role", "requested", "effective", "observed", "status"):
            table.add_column(column, no_wrap=True)
        for row in rows:
            table.add_row(*(str(row[c]) if row[c] is not None else "-" for c in
                            ("role", "requested", "effective", "observed", "status")))
        out.print(table)


@cli.command("submit")
def submit_cmd(
    spec: Annotated[Path, typer.Argument(help="Spec file: YAML/JSON, or a verl command line.")],
    server: Annotated[str, typer.Option("--server", envvar="ATTNBOARD_SERVER",
                                        help="The attnboard server (env ATTNBOARD_SERVER).")] = "http://127.0.0.1:8000",
    token: Annotated[str | None, typer.Option("--token", envvar="ATTNBOARD_TOKEN",
                                                 help="An API token with the write scope (env ATTNBOARD_TOKEN).")] = None,
    name: Annotated[str | None, typer.Option("--name", help="The run's name.")] = None,
    wait: Annotated[bool, typer.Option("--wait", help="Wait until the run finishes; the exit code tells how.")] = False,
    timeout: Annotated[float, typer.Option("--timeout", min=1, help="With --wait: give up after this many seconds.")] = 3600,
    as_json: JsonOpt = False,
) -> None:
    """Submit a run to a server; with --wait, wait for it and print the effective attention per role.

    Exit codes: 0 submitted (or, with --wait, succeeded); 1 the run failed; 2 invalid spec or request
    (bad file, refused spec, bad token); 3 the run was cancelled; 4 the server (or its Ray) is
    unreachable; 5 still running at --timeout.
    """
    import time

    import httpx

    imported = _load(spec, as_json)
    base = server.rstrip("/")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    body: dict[str, Any] = {"spec": imported.spec.model_dump(mode="json")}
    if name:
        body["name"] = name
    client = httpx.Client(base_url=base, headers=headers, timeout=httpx.Timeout(30.0, read=WAIT_CHUNK_S + 30))

    def call(method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return client.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            _fail(f"cannot reach the attnboard server at {base}: {exc}", as_json=as_json, code=EXIT_UNREACHABLE,
                  field="--server", value=base)

    def refused(resp: httpx.Response) -> NoReturn:
        try:
            error = resp.json().get("error", {})
        except ValueError:
            error = {"message": resp.text[:500]}
        code = EXIT_UNREACHABLE if resp.status_code >= 500 else EXIT_INVALID
        extra = {k: v for k, v in error.items() if k not in ("message", "code")}
        _fail(f"HTTP {resp.status_code}: {error.get('message', resp.reason_phrase)}", as_json=as_json, code=code,
              http_status=resp.status_code, error_code=error.get("code"), **extra)

    resp = call("POST", "/api/runs", json=body)
    if resp.status_code != 201:
        refused(resp)
    run = resp.json()
    for warning in imported.warnings:
        _warn(warning)
    if not wait:
        if as_json:
            print(json.dumps({"run": run, "url": f"{base}/runs/{run['id']}"}))
        else:
            out.print(f"run {run['id']} submitted ({run['status']}): {base}/runs/{run['id']}", markup=False)
        raise typer.Exit(0)
    deadline = time.monotonic() + timeout
    while True:
        chunk = max(1.0, min(WAIT_CHUNK_S, deadline - time.monotonic()))
        resp = call("GET", f"/api/runs/{run['id']}/wait", params={"timeout": chunk})
        if resp.status_code != 200:
            refused(resp)
        answer = resp.json()
        if not answer["timed_out"] or time.monotonic() >= deadline:
            break
    run, attention = answer["run"], answer["attention"]
    code = EXIT_TIMEOUT if answer["timed_out"] else SUBMIT_EXIT_CODES[run["status"]]
    if as_json:
        print(json.dumps({"run_id": run["id"], "status": run["status"], "status_reason": run["status_reason"],
                          "timed_out": answer["timed_out"], "exit_code": code,
                          "attention": _attention_rows(attention, run.get("effective_attention")),
                          "url": f"{base}/runs/{run['id']}"}))
    else:
        _print_outcome(run, attention, base)
    raise typer.Exit(code)


@cli.command("run", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def run_cmd(ctx: typer.Context) -> None:
    """Run a spec without the app: the engine alone on a local Ray (or RAY_ADDRESS), with a progress bar.

    The arguments are those of ``python -m worker run``: SPEC [--resume DIR] [--save-actor DIR]
    [--artefact-dir DIR] [--json] [--run-id ID] [--cache-dir DIR]. --resume resumes from a global_step_N
    checkpoint folder or a folder of them. Exit codes: 0 succeeded, 1 failed, 2 invalid input, 3 cancelled.
    """
    from worker.__main__ import main as worker_main

    raise typer.Exit(worker_main(["run", *ctx.args]))


TOKEN_SCOPES = {"read": ["read"], "write": ["read", "write"], "admin": ["admin", "read", "write"]}


def _token_database(as_json: bool):
    """The server's database, found as ``attnboard serve`` finds it (ATTNBOARD_* variables, ``.env``, else
    ``./data``); when that is a SQLite file that does not exist and no variable names one, the database the last
    ``attnboard serve`` noted (``served_pointer_path``); refused (exit 2) when none exists, so a token is never
    written into a fresh database the server does not read."""
    from app.core.config import get_settings, served_settings, sqlite_path
    from app.db import make_engine, run_migrations

    settings = get_settings()
    db_file = sqlite_path(settings.DATABASE_URL)
    named = any(os.environ.get(f"ATTNBOARD_{key}") for key in ("DATA_DIR", "DATABASE_URL"))
    if db_file is not None and not db_file.exists() and not named:
        served = served_settings()
        if served is not None:
            settings = served
            db_file = sqlite_path(settings.DATABASE_URL)
    if db_file is not None and not db_file.exists():
        _fail(f"no attnboard database at {db_file.resolve()}: run this where the server runs (its folder or its .env), "
              "or set ATTNBOARD_DATA_DIR or ATTNBOARD_DATABASE_URL as the server has them", as_json=as_json,
              field="ATTNBOARD_DATA_DIR", value=str(settings.DATA_DIR.resolve()),
              valid="the server's data folder (attnboard migrate creates a new one)")
    run_migrations(settings.DATABASE_URL)
    return make_engine(settings.DATABASE_URL), _redact(settings.DATABASE_URL)


@token_cli.command("create")
def token_create_cmd(
    name: Annotated[str, typer.Argument(help="A label for the token, e.g. nightly-ci.")],
    scope: Annotated[str, typer.Option(help="write (launch, cancel, retry; implies read), read, or admin "
                                            "(also mints and revokes tokens).")] = "write",
    as_json: JsonOpt = False,
) -> None:
    """Create an API token; its secret is shown once, only its hash is stored."""
    from sqlmodel import Session

    from app.services.tokens import create_token

    valid = list(TOKEN_SCOPES)
    if scope not in valid:
        _fail(f"--scope {scope!r} is not valid; valid: {', '.join(valid)}", as_json=as_json, field="--scope",
              value=scope, valid=valid)
    if not name.strip() or len(name) > 200:
        _fail("the token name must be 1 to 200 characters", as_json=as_json, field="NAME", value=name[:200])
    scopes = TOKEN_SCOPES[scope]
    engine, database = _token_database(as_json)
    try:
        with Session(engine) as session:
            token, secret = create_token(session, name=name, scopes=scopes)  # type: ignore[arg-type]
            token_id = token.id
    finally:
        engine.dispose()
    if as_json:
        print(json.dumps({"id": token_id, "name": name, "scopes": scopes, "token": secret, "database": database}))
    else:
        out.print(f"token {name!r} ({scope}) created in database {database}. It is shown once; store it now:\n{secret}",
                  markup=False)


@token_cli.command("list")
def token_list_cmd(as_json: JsonOpt = False) -> None:
    """The tokens of the server's database: id, name, scopes, prefix, last use, revoked (never the secret)."""
    from sqlmodel import Session

    from app.models import ApiTokenPublic
    from app.services.tokens import list_tokens

    engine, database = _token_database(as_json)
    try:
        with Session(engine) as session:
            rows = [ApiTokenPublic.model_validate(r).model_dump(mode="json") for r in list_tokens(session)]
    finally:
        engine.dispose()
    if as_json:
        print(json.dumps({"database": database, "tokens": rows}))
        return
    out.print(f"tokens in database {database}:", markup=False)
    for r in rows:
        state = "revoked" if r["revoked"] else f"last used {r['last_used_at'] or 'never'}"
        out.print(f"{r['id']:>4}  {r['name']:<24} {','.join(r['scopes']):<18} {r['prefix']}...  {state}", markup=False)


@token_cli.command("revoke")
def token_revoke_cmd(
    token_id: Annotated[int, typer.Argument(help="The token's id (see `attnboard token list`).")],
    as_json: JsonOpt = False,
) -> None:
    """Revoke a token: its API calls and the browser sessions signed in with it stop at once."""
    from sqlmodel import Session

    from app.errors import AppError
    from app.services.tokens import revoke_token

    engine, database = _token_database(as_json)
    try:
        with Session(engine) as session:
            try:
                row = revoke_token(session, token_id=token_id)
            except AppError as exc:
                _fail(exc.message, as_json=as_json, field="TOKEN_ID", value=token_id)
            name = row.name
    finally:
        engine.dispose()
    if as_json:
        print(json.dumps({"id": token_id, "name": name, "revoked": True, "database": database}))
    else:
        out.print(f"token {token_id} ({name!r}) revoked in database {database}", markup=False)


def main() -> None:
    cli(prog_name="attnboard")


if __name__ == "__main__":
    sys.exit(main())
