"""What the new-run form page shows (``run_new.html``): the values, the spec if it parsed, the issues per
input and the preview; and where a new form starts. Built from the form data by ``FormState``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from starlette.datastructures import FormData, QueryParams

from app.services.probes import NodeProbe
from app.views.run_form import (
    ATTENTION_HELP,
    FIELDS,
    FormError,
    form_to_spec_data,
    grouped_fields,
    issues_by_field,
    spec_to_form_values,
)
from worker.attention.preview import preview
from worker.attention.resolution import Resolution
from worker.core.environment import PROFILES, Environment
from worker.spec import PASSTHROUGH_NOTE, Issue, RunSpec, SpecError, parse_spec

DEFAULT_ENV = "cpu"
PROBE_ENV = "probe"


def starting_spec() -> RunSpec:
    """The spec a new form starts from: the tiny CPU preset when the worker provides it."""
    try:
        from worker.spec.presets import tiny_cpu_spec
    except ImportError:  # the presets module lands with the worker; verl's defaults until then
        return RunSpec()
    return tiny_cpu_spec()


def multi(data: FormData | QueryParams) -> dict[str, list[str]]:
    """Form data or a query string as ``{key: [values]}`` (files dropped), what ``FormState`` reads."""
    return {key: [v for v in data.getlist(key) if isinstance(v, str)] for key in data}


def _environment(name: str, probe: NodeProbe | None = None) -> Environment:
    if name == PROBE_ENV and probe is not None:
        return probe.environment
    return PROFILES.get(name) or PROFILES[DEFAULT_ENV]


class FormState:
    """What the form page shows: values, the spec if it parsed, issues per input, the preview.

    The preview is ``worker.attention.preview.preview``, the function ``POST /api/resolve`` and
    ``attnboard resolve`` run, with the same model information: the head counts of a model folder inside
    ``model_roots`` (``ATTNBOARD_MODEL_ROOTS``). Its errors are the form's, beside their inputs; the
    resolution is shown whenever the spec parsed on a known environment, so a launch's refusal and what
    would run are on the page together. ``probe``: the newest probe of a worker node (``NodeProbe``),
    offered as the ``probe`` environment."""

    def __init__(self, form: dict[str, list[str]] | None = None, *, model_roots: list[Path],
                 spec: RunSpec | None = None, probe: NodeProbe | None = None):
        self.errors: dict[str, list[Issue]] = {}
        self.warnings: list[Issue] = []
        self.resolution: Resolution | None = None
        self.spec: RunSpec | None = spec
        self.name = ""
        self.env_name = DEFAULT_ENV
        self.probe = probe
        if form is not None:
            self.name = (form.get("name") or [""])[-1].strip()
            self.env_name = (form.get("env") or [DEFAULT_ENV])[-1]
            try:
                self.spec = parse_spec(form_to_spec_data(form))
            except (FormError, SpecError) as exc:
                self.errors = issues_by_field(exc.issues)
            valid = [*PROFILES, *([PROBE_ENV] if probe is not None else [])]
            if form.get("env") and self.env_name not in valid:
                why = " (no worker node has been probed yet: a run's env_probe event provides one)" \
                    if self.env_name == PROBE_ENV else ""
                self.errors.setdefault("env", []).append(
                    Issue("env", self.env_name, f"unknown environment {self.env_name!r}{why}; valid: {', '.join(valid)}"))
        if self.spec is not None and "env" not in self.errors:
            shown = preview(self.spec, _environment(self.env_name, self.probe), model_roots=model_roots)
            self.resolution = shown.resolution
            for key, found in issues_by_field(shown.errors).items():
                self.errors.setdefault(key, []).extend(found)
            self.warnings = [i for i in shown.issues if i.severity != "error"]
        self.values = spec_to_form_values(self.spec) if self.spec is not None and not self.errors else \
            _raw_values(form or {})

    @property
    def environment(self) -> str | dict[str, Any]:
        """What a launched run records as its target environment: a profile name, or the probe's fields."""
        if self.env_name == PROBE_ENV and self.probe is not None:
            return self.probe.environment.to_dict()
        return self.env_name

    def context(self, **extra: Any) -> dict[str, Any]:
        return {
            "groups": grouped_fields(),
            "values": self.values,
            "errors": self.errors,
            "error_count": sum(len(v) for v in self.errors.values()),
            "field_ids": {f.key: f.input_id for f in FIELDS},
            "warnings": self.warnings,
            "resolution": self.resolution,
            "name": self.name,
            "env_name": self.env_name,
            "profiles": list(PROFILES.values()),
            "probe_available": self.probe is not None,
            "probe_label": self.probe.label if self.probe is not None else None,
            "attention_help": ATTENTION_HELP,
            "export": None,
            "passthrough": self.spec.verl_passthrough if self.spec is not None and not self.errors else {},
            "passthrough_note": PASSTHROUGH_NOTE,
            **extra,
        }


def _raw_values(form: dict[str, list[str]]) -> dict[str, Any]:
    """Echo what was typed when it does not parse, so nothing the user wrote is lost."""
    values: dict[str, Any] = {}
    for f in FIELDS:
        given = form.get(f.key) or [""]
        values[f.key] = given[-1] == "true" if f.widget == "checkbox" else given[-1]
    return values
