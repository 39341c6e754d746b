"""Resolution preview and verl interop at the app's edge: untrusted input in, AppErrors out.

The rules themselves live in the worker package (``worker.attention.resolution``, ``worker.interop.verl``); this module
turns their exceptions into errors naming the field, the value and what is valid, and guards the YAML
parser against alias bombs and runaway nesting before the text reaches it. Every import of the app goes
through ``import_spec`` (``POST /api/import`` and the new-run form's import), under the worker's limits
(``MAX_INPUT_BYTES``, ``MAX_YAML_NODES``: one set, defined in ``worker.interop.verl``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import yaml

from app.errors import AppError
from app.services.isolation import IsolatedCalls
from worker.attention.preview import preview
from worker.core.environment import PROFILES, Environment, InvalidEnvironment, UnknownProfileError, environment_from
from worker.interop import verl
from worker.interop.specfile import detect_format
from worker.interop.verl import MAX_INPUT_BYTES, MAX_YAML_NODES
from worker.spec import PASSTHROUGH, PASSTHROUGH_NOTE, Issue, RunSpec, SpecError, parse_spec, spec_to_tree
from worker.spec.confine import Roots, path_issues

ImportFormat = Literal["cli", "yaml", "auto"]
ExportFormat = Literal["cli", "yaml"]


def issue_dicts(issues: list[Issue], prefix: str = "spec") -> list[dict[str, Any]]:
    return [{**i.as_dict(), "field": f"{prefix}.{i.field}" if prefix else i.field} for i in issues]


# --------------------------------------------------------------------------------------------
# Resolution


def environment_of(value: str | dict[str, Any], *, field: str = "environment") -> Environment:
    """A profile name or a probe dict -> Environment (``worker.core.environment.environment_from``), or a 422
    naming ``field`` (or its key), the value and what is valid."""
    try:
        return environment_from(value)
    except UnknownProfileError as exc:
        raise AppError(422, "unknown_environment", str(exc), field=field, value=value, valid=list(PROFILES)) from None
    except InvalidEnvironment as exc:
        raise AppError(422, "invalid_environment", str(exc).replace("environment", field, 1),
                       field=exc.field.replace("environment", field, 1), value=exc.value, valid=exc.valid) from None


def resolve_preview(*, spec: dict[str, Any], environment: str | dict[str, Any],
                    model_roots: list[Path] | None = None, roots: Roots | None = None) -> dict[str, Any]:
    """Per-role resolution of ``spec`` on ``environment`` plus every issue a launch would refuse
    (``worker.attention.preview.preview``, the function ``attnboard resolve`` runs): the model's head counts are
    read from its config.json when it lies in ``model_roots``; paths outside ``roots`` (the app's
    ``Settings.roots``) are issues, as ``POST /api/runs`` refuses them."""
    env = environment_of(environment)
    try:
        run_spec = parse_spec(spec)
    except SpecError as exc:
        raise AppError.from_spec_error(exc) from None
    result = preview(run_spec, env, model_roots=list(model_roots or []))
    confined = path_issues(run_spec, roots or Roots(models=tuple(model_roots or ())))
    return {"resolution": result.resolution.to_dict(), "issues": issue_dicts(confined + result.issues),
            PASSTHROUGH: run_spec.verl_passthrough, "passthrough_note": PASSTHROUGH_NOTE}


# --------------------------------------------------------------------------------------------
# Import


IMPORT_VALID = ("a verl command line (python3 -m verl.trainer.main_ppo key=value ...) or a verl YAML config, "
                "with verl 0.9.1's keys")


def _yaml_position(mark: Any) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "unknown position"


def check_yaml_safety(text: str) -> None:
    """Refuse YAML that is malformed or would expand past MAX_YAML_NODES (a "billion laughs" alias bomb),
    composing the node graph once (aliases stay shared there) and counting nodes with aliases followed."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        raise AppError(422, "invalid_yaml", f"text: invalid YAML at {_yaml_position(exc.problem_mark)}: {exc.problem}",
                       field="text", value=_line_at(text, exc.problem_mark), valid=IMPORT_VALID,
                       issues=[{"field": "text", "message": str(exc.problem),
                                "position": _yaml_position(exc.problem_mark)}]) from None
    except yaml.YAMLError as exc:
        raise AppError(422, "invalid_yaml", f"text: invalid YAML: {exc}", field="text", valid=IMPORT_VALID) from None
    except RecursionError:
        raise AppError(422, "invalid_yaml", "text: YAML nested too deeply", field="text", valid=IMPORT_VALID) from None
    if root is None:
        return
    count = 0
    stack = [root]
    while stack:
        node = stack.pop()
        count += 1
        if count > MAX_YAML_NODES:
            raise AppError(422, "yaml_too_large", f"text: the YAML expands to more than {MAX_YAML_NODES} nodes "
                           f"(aliases followed); a verl config has about 700", field="text",
                           valid=f"<= {MAX_YAML_NODES} nodes")
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                stack.extend((key, value))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)


def _line_at(text: str, mark: Any) -> str | None:
    if mark is None:
        return None
    lines = text.splitlines()
    return lines[mark.line][:200] if 0 <= mark.line < len(lines) else None


def import_spec(*, text: str, format: ImportFormat = "auto") -> tuple[str, verl.ImportResult]:
    """A verl command line or YAML -> (its format, the import), behind the size and YAML guards; every
    refusal is an AppError naming the field (``text``, or the spec key at fault), the value and what is valid."""
    size = len(text.encode("utf-8", errors="replace"))
    if size > MAX_INPUT_BYTES:
        raise AppError(422, "text_too_long", f"text: {size} bytes is too long; valid: at most {MAX_INPUT_BYTES} bytes",
                       field="text", value=size, valid=f"<= {MAX_INPUT_BYTES} bytes")
    if not text.strip():
        raise AppError(422, "empty_text", "text: nothing to import; paste a verl command line or YAML", field="text",
                       value=text, valid=IMPORT_VALID)
    fmt = detect_format(text) if format == "auto" else format
    if fmt == "yaml":
        check_yaml_safety(text)
    try:
        return fmt, verl.import_yaml(text) if fmt == "yaml" else verl.import_command(text)
    except yaml.MarkedYAMLError as exc:  # a tag no safe loader constructs (!foo, !!python/object/apply:...)
        raise AppError(422, "invalid_yaml", f"text: YAML at {_yaml_position(exc.problem_mark)} cannot be read: "
                       f"{exc.problem}", field="text", value=_line_at(text, exc.problem_mark),
                       valid="plain YAML (mappings, lists, strings, numbers, booleans; no tags)") from None
    except yaml.YAMLError as exc:
        raise AppError(422, "invalid_yaml", f"text: invalid YAML: {exc}", field="text", valid=IMPORT_VALID) from None
    except verl.VerlImportError as exc:
        spec_issues = [_plain(i) for i in exc.issues]
        field = spec_issues[0]["field"] if spec_issues and isinstance(spec_issues[0], dict) else "text"
        valid = next((i["valid"] for i in spec_issues if isinstance(i, dict) and i.get("valid") is not None),
                      IMPORT_VALID)
        raise AppError(422, "import_error", f"text: {exc.message} (at character {exc.position}: {exc.token[:80]!r})",
                       field=field, value=exc.token, valid=valid,
                       issues=[{"field": "text", "message": exc.message, "token": exc.token, "position": exc.position,
                                "severity": "error"}, *spec_issues]) from None
    except SpecError as exc:
        raise AppError.from_spec_error(exc) from None
    except RecursionError:
        raise AppError(422, "import_error", "text: nested too deeply", field="text", valid=IMPORT_VALID) from None


def import_text(*, text: str, format: ImportFormat = "auto") -> dict[str, Any]:
    """A verl command line or YAML -> {"format", "spec", "warnings", "overrides"}."""
    fmt, result = import_spec(text=text, format=format)
    spec = result.spec
    tree = spec_to_tree(spec) if isinstance(spec, RunSpec) else spec
    return {"format": fmt, "spec": tree, "warnings": _plain(result.warnings),
            "overrides": _plain(getattr(result, "overrides", None)),
            PASSTHROUGH: _plain(spec.verl_passthrough), "passthrough_note": PASSTHROUGH_NOTE}


IMPORT_TIMEOUT_CODE = "import_timeout"


def import_timeout_error(timeout_s: float) -> Callable[[float], AppError]:
    """The 422 an import that overran ``ATTNBOARD_IMPORT_TIMEOUT_S`` answers (it ran in a child, now killed)."""
    def error(elapsed: float) -> AppError:
        return AppError(422, IMPORT_TIMEOUT_CODE, f"text: reading the script took more than {timeout_s:g} s and was "
                        f"stopped (a pattern or loop that does not finish?); simplify the script or paste the "
                        f"verl command line alone", field="text", value=f"stopped after {elapsed:.1f} s",
                        valid=f"a script read within ATTNBOARD_IMPORT_TIMEOUT_S={timeout_s:g} s")
    return error


def import_isolated(calls: IsolatedCalls, *, text: str, format: ImportFormat = "auto") -> dict[str, Any]:
    """``import_text`` in a child process with the app's wall clock (``app.services.isolation``)."""
    return calls.call(__name__, "import_text", text=text, format=format)


def import_spec_isolated(calls: IsolatedCalls, *, text: str, format: ImportFormat = "auto") -> tuple[str, verl.ImportResult]:
    """``import_spec`` in a child process with the app's wall clock: what the form's import box runs."""
    return calls.call(__name__, "import_spec", text=text, format=format)


def import_calls(timeout_s: float) -> IsolatedCalls:
    """The app's pool of import children (made by the app factory, closed at shutdown)."""
    return IsolatedCalls(timeout_s=timeout_s, preload=(__name__,), on_timeout=import_timeout_error(timeout_s))


# --------------------------------------------------------------------------------------------
# Export


def export_spec(*, tree: dict[str, Any], format: ExportFormat) -> dict[str, Any]:
    """A stored spec tree -> {"format", "text", "warnings"} (a verl command line or YAML)."""
    try:
        spec = parse_spec(tree)
    except SpecError as exc:
        raise AppError.from_spec_error(exc) from None
    result = verl.export_command(spec) if format == "cli" else verl.export_yaml(spec)
    return {"format": format, "text": result.text, "warnings": _plain(result.warnings)}


def _plain(value: Any) -> Any:
    """Warnings may be Issues, dataclasses or strings: make them JSON."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "as_dict"):
        return value.as_dict()
    if hasattr(value, "to_dict"):
        return value.to_dict()
    return str(value)
