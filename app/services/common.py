"""Helpers shared by the services: spec validation into AppErrors, pagination bounds, restart limits."""

from __future__ import annotations

from typing import Any

from sqlmodel import Session

from app.errors import AppError
from worker.spec import Issue, RunSpec, SpecError, spec_to_tree, validate_spec
from worker.spec.confine import Roots, path_issues

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


ROOTS = "roots"
"""``session.info[ROOTS]``: the folders the app allows a submitted spec's paths in (``Settings.roots``). Every
request's session carries them (``app.deps.get_session``), so each way a run is made (the API, the form, retry,
clone, resume) checks its paths; a session without them allows the built-in models and tasks only."""


def check_paths(session: Session, spec: RunSpec, *, prefix: str = "spec") -> None:
    """422 naming every key whose path lies outside the allowed folders (``worker.spec.confine``)."""
    issues = path_issues(spec, session.info.get(ROOTS) or Roots())
    if issues:
        raise AppError.from_spec_error(SpecError(issues), prefix=prefix)


def max_restarts_of(spec: dict[str, Any]) -> int:
    """``attnboard.max_restarts`` of a stored spec tree (its default when a spec stored before the key lacks it):
    how often a run, or a trial, is started again after its engine host died."""
    from worker.spec import AttnboardSection

    value = (spec.get("attnboard") or {}).get("max_restarts") if isinstance(spec, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else \
        AttnboardSection.model_fields["max_restarts"].default
