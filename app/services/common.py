"""Helpers shared by the services: spec validation into AppErrors, pagination bounds, restart limits."""

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


def max_restarts_of(spec: dict[str, Any]) -> int:
    """``attnboard.max_restarts`` of a stored spec tree (its default when a spec stored before the key lacks it):
    how often a run, or a trial, is started again after its engine host died."""
    from worker.spec import AttnboardSection

    value = (spec.get("attnboard") or {}).get("max_restarts") if isinstance(spec, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else \
        AttnboardSection.model_fields["max_restarts"].default
