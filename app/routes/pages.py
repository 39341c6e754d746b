"""The dashboard's pages: thin handlers that parse the form, call one function, and render a page
or, for htmx, the block of it that changed (see ``app.web.render``)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response
from starlette.datastructures import FormData, QueryParams

from app.run_form import ATTENTION_HELP, FIELDS, FormError, form_to_spec_data, grouped_fields, issues_by_field, \
    spec_to_form_values
from app.web import add_security_headers, render
from worker.environment import PROFILES, Environment
from worker.resolution import Resolution, resolve
from worker.spec import Issue, RunSpec, SpecError, check_spec, parse_spec
from worker.verl import VerlImportError, export_command, export_yaml, import_command, import_yaml

router = APIRouter(tags=["pages"], include_in_schema=False)

DEFAULT_ENV = "cpu"


def starting_spec() -> RunSpec:
    """The spec a new form starts from: the tiny CPU preset when the worker provides it."""
    try:
        from worker.presets import tiny_cpu_spec
    except ImportError:  # the presets module lands with the worker; verl's defaults until then
        return RunSpec()
    return tiny_cpu_spec()


def _multi(data: FormData | QueryParams) -> dict[str, list[str]]:
    return {key: [v for v in data.getlist(key) if isinstance(v, str)] for key in data.keys()}


def _environment(name: str) -> Environment:
    return PROFILES.get(name) or PROFILES[DEFAULT_ENV]


class FormState:
    """What the form page shows: values, the spec if it parsed, issues per input, the preview."""

    def __init__(self, form: dict[str, list[str]] | None = None, *, spec: RunSpec | None = None):
        self.errors: dict[str, list[Issue]] = {}
        self.warnings: list[Issue] = []
        self.spec: RunSpec | None = spec
        self.name = ""
        self.env_name = DEFAULT_ENV
        if form is not None:
            self.name = (form.get("name") or [""])[-1].strip()
            self.env_name = (form.get("env") or [DEFAULT_ENV])[-1]
            try:
                self.spec = parse_spec(form_to_spec_data(form))
            except (FormError, SpecError) as exc:
                self.errors = issues_by_field(exc.issues)
            if form.get("env") and self.env_name not in PROFILES:
                self.errors.setdefault("env", []).append(
                    Issue("env", self.env_name, f"unknown environment {self.env_name!r}; valid: {', '.join(PROFILES)}"))
        if self.spec is not None:
            for issue in check_spec(self.spec):
                if issue.severity == "error":
                    for key, found in issues_by_field([issue]).items():
                        self.errors.setdefault(key, []).extend(found)
                else:
                    self.warnings.append(issue)
        self.values = spec_to_form_values(self.spec) if self.spec is not None and not self.errors else \
            _raw_values(form or {})

    @property
    def resolution(self) -> Resolution | None:
        if self.spec is None or self.errors:
            return None
        return resolve(self.spec, _environment(self.env_name))

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
            "probe_available": False,
            "attention_help": ATTENTION_HELP,
            "export": None,
            **extra,
        }


def _raw_values(form: dict[str, list[str]]) -> dict[str, Any]:
    """Echo what was typed when it does not parse, so nothing the user wrote is lost."""
    values: dict[str, Any] = {}
    for f in FIELDS:
        given = form.get(f.key) or [""]
        values[f.key] = given[-1] == "true" if f.widget == "checkbox" else given[-1]
    return values


def page_context(request: Request) -> dict[str, Any]:
    """What every page's layout needs: the principal and the CSRF token (see ``app.auth_browser``)."""
    return {
        "principal": getattr(request.state, "principal", None),
        "csrf_token": getattr(request.state, "csrf_token", ""),
    }


# --------------------------------------------------------------------------------------------
# New run


@router.get("/runs/new")
def new_run(request: Request) -> Response:
    state = FormState(spec=starting_spec())
    return render(request, "run_new.html", {**page_context(request), **state.context()})


@router.post("/runs/preview")
async def preview(request: Request) -> Response:
    state = FormState(_multi(await request.form()))
    return render(request, "run_new.html", {**page_context(request), **state.context()}, block="preview")


@router.post("/runs/import")
async def import_verl(request: Request) -> Response:
    form = _multi(await request.form())
    text = (form.get("verl_text") or [""])[-1]
    importer = import_yaml if _looks_like_yaml(text) else import_command
    try:
        result = importer(text)
    except VerlImportError as exc:
        state = FormState(spec=starting_spec())
        issues = list(exc.issues) or [Issue("verl_text", exc.token, str(exc))]
        state.errors = {"(import)": issues}
        return render(request, "run_new.html",
                      {**page_context(request), **state.context(verl_text=text, import_open=True)},
                      block="form_area", status_code=422)
    state = FormState(spec=result.spec)
    notes = [f"{len(result.overrides)} setting{'s' if len(result.overrides) != 1 else ''} imported"] + result.warnings
    return render(request, "run_new.html",
                  {**page_context(request), **state.context(verl_text=text, import_notes=notes, import_open=True)},
                  block="form_area")


def _looks_like_yaml(text: str) -> bool:
    """A verl command has ``key=value`` words; YAML has ``key:`` lines and no ``=`` before them."""
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        head = stripped.split()[0]
        return "=" not in head and head.endswith(":") or (":" in head and "=" not in head and not head.startswith("python"))
    return False


# --------------------------------------------------------------------------------------------
# Export of the current form


@router.get("/runs/export/command")
def export_form_command(request: Request) -> Response:
    state = FormState(_multi(request.query_params))
    if state.spec is None or state.errors:
        return render(request, "run_new.html", {**page_context(request), **state.context()}, block="preview",
                      status_code=422)
    return render(request, "run_new.html", {**page_context(request), **state.context(export=export_command(state.spec))},
                  block="export")


@router.get("/runs/export.yaml")
def export_form_yaml(request: Request) -> Response:
    state = FormState(_multi(request.query_params))
    if state.spec is None or state.errors:
        return render(request, "run_new.html", {**page_context(request), **state.context()}, status_code=422)
    result = export_yaml(state.spec)
    filename = "".join(c if c.isalnum() or c in "-_" else "-" for c in (state.name or "run")) + ".yaml"
    return add_security_headers(Response(result.text, media_type="application/yaml",
                                         headers={"Content-Disposition": f'attachment; filename="{filename}"'}))


def redirect(url: str) -> RedirectResponse:
    return RedirectResponse(url, status_code=303)
