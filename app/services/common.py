"""Helpers shared by the services: spec validation into AppErrors, pagination bounds."""

from __future__ import annotations

from typing import Any

from app.errors import AppError
from worker.spec import Issue, RunSpec, SpecError, spec_to_tree, validate_spec

MAX_LIMIT = 500


def validated_spec(data: Any, *, prefix: str = "spec", launch: bool = False) -> tuple[RunSpec, dict[str, Any], list[Issue]]:
    """Untrusted spec data -> (RunSpec, canonical tree, warnings), or a 422 naming every bad field.
    ``launch``: also refuse what attnboard's engine does not run (``worker.spec.engine_issues``)."""
    try:
        spec, warnings = validate_spec(data, launch=launch)
    except SpecError as exc:
        raise AppError.from_spec_error(exc, prefix=prefix) from None
    except RecursionError:
        raise AppError(422, "invalid_spec", f"{prefix}: nested too deeply", field=prefix) from None
    return spec, spec_to_tree(spec), warnings
