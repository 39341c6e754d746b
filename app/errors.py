"""One error type and one handler.

Every error a user can cause is an ``AppError`` naming the field, the bad value and what is valid.
``install_error_handlers`` maps it, FastAPI's validation errors, Starlette's HTTP errors (unknown
routes, bad methods, unparseable bodies) and, last, real bugs into one JSON shape::

    {"error": {"code", "message", "field", "value", "valid", "issues": [...]}}

``render_error`` is the one place an error becomes a response: that JSON for ``/api/...`` and for
clients that do not ask for HTML; for a browser, the error page (``error.html``), or only its ``error``
block when htmx asked (``HX-Request: true``). A page that needs a principal raises ``LoginRequired``,
answered with a redirect to /login.
"""

from __future__ import annotations

import logging
from typing import Any, get_args

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.web import is_htmx, page_context, redirect, render
from worker.core.pydantic_errors import valid_for
from worker.spec import Issue, SpecError

log = logging.getLogger("attnboard.errors")


def brief(value: Any, depth: int = 0) -> Any:
    """``value`` made JSON-safe and short enough to echo back: long strings and collections are cut,
    deep structures end in "...". Bounded, so echoing hostile input stays cheap."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        return value if len(value) <= 200 else value[:200] + f"... ({len(value)} characters)"
    if depth >= 8:
        return "..."
    if isinstance(value, (list, tuple)):
        return [brief(v, depth + 1) for v in list(value)[:20]]
    if isinstance(value, dict):
        return {str(k)[:200]: brief(v, depth + 1) for k, v in list(value.items())[:20]}
    return repr(value)[:200]


def utf8_safe(value: Any) -> Any:
    """Lone surrogates (valid in JSON escapes, not in UTF-8) become visible ``\\udXXX`` text, so an
    error that echoes a bad string can always be sent."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {utf8_safe(k): utf8_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [utf8_safe(v) for v in value]
    return value


class AppError(Exception):
    """An error with an HTTP status, a stable machine code and a sentence for people."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        field: str | None = None,
        value: Any = None,
        valid: Any = None,
        issues: list[dict[str, Any]] | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        self.value = value
        self.valid = valid
        self.issues = issues or []
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return utf8_safe({
            "error": {
                "code": self.code,
                "message": self.message,
                "field": self.field,
                "value": brief(self.value),
                "valid": brief(self.valid),
                "issues": self.issues,
            }
        })

    @classmethod
    def from_spec_error(cls, exc: SpecError, *, prefix: str = "spec") -> AppError:
        """422 for a spec with problems: the first error is the headline, ``issues`` lists them all."""
        issues = [_prefixed(i, prefix) for i in exc.issues]
        first = next((i for i in issues if i["severity"] == "error"), issues[0])
        return cls(422, "invalid_spec", f"{first['field']}: {first['message']}", field=first["field"],
                   value=first["value"], valid=first.get("valid"), issues=issues)


def _prefixed(issue: Issue, prefix: str) -> dict[str, Any]:
    out = issue.as_dict()
    if prefix:
        out["field"] = f"{prefix}.{issue.field}"
    return out


# --------------------------------------------------------------------------------------------
# The error body in the OpenAPI schema


class ErrorDetail(BaseModel):
    code: str = Field(description="A stable machine code, e.g. invalid_request, not_found, invalid_transition.")
    message: str = Field(description="A sentence for people.")
    field: str | None = Field(None, description="The field at fault (dotted), '(body)', 'path' or 'method'.")
    value: Any = Field(None, description="The value found there (shortened), null when it was missing.")
    valid: Any = Field(None, description="What would have been accepted.")
    issues: list[dict[str, Any]] = Field(default_factory=list, description="Every problem found, errors first.")


class ErrorBody(BaseModel):
    """Every error the API answers (4xx and 5xx): 400, 409 and 422 name the field, the value and what is
    valid; 404 the id that does not exist."""

    error: ErrorDetail


def _documented(description: str) -> dict[str, Any]:
    return {"model": ErrorBody, "description": description}


# Answered by any operation (FastAPI(responses=...)): the body, the token and the ids are checked everywhere.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: _documented("The body could not be read (not UTF-8 JSON)."),
    401: _documented("No valid token: send 'Authorization: Bearer <token>'."),
    403: _documented("The token lacks the scope the operation needs."),
    404: _documented("An id (or a saved spec, run, entry or trial it names) does not exist."),
    409: _documented("The request conflicts with the resource's state (e.g. cancelling a finished run)."),
    413: _documented("The body is larger than ATTNBOARD_MAX_BODY_BYTES."),
    422: _documented("An invalid input: field, value and what is valid."),
}
# Answered by the operations that hand a run to compute (route-level ``responses=``).
LAUNCH_RESPONSES: dict[int | str, dict[str, Any]] = {
    503: _documented("The run is saved and queued, but the compute backend (Ray) could not be reached; "
                     "POST /api/runs/{run_id}/submit hands it over later."),
}


class BodyTooLarge(Exception):
    """Raised while a streamed body passes the size limit (see app.middleware.BodySizeLimit)."""

    def __init__(self, limit: int):
        super().__init__(limit)
        self.limit = limit


def too_large(size: Any, limit: int) -> AppError:
    return AppError(413, "payload_too_large", f"the request body ({size} bytes) is larger than the limit of "
                    f"{limit} bytes (ATTNBOARD_MAX_BODY_BYTES)", field="(body)", value=size, valid=f"<= {limit} bytes")


def not_found(what: str, ident: Any, field: str = "id") -> AppError:
    return AppError(404, "not_found", f"{what} {ident!r} does not exist", field=field, value=ident)


# --------------------------------------------------------------------------------------------
# Handlers


def _known_keys(route: Any, loc: list[str]) -> list[str] | None:
    """The keys the body model at ``loc`` (inside the request body) accepts, or None when the route's
    body is not a model there."""
    params = getattr(getattr(route, "dependant", None), "body_params", None) or []
    if not params:
        return None
    if len(params) > 1:  # several body parameters: each is a key of the body
        if not loc:
            return sorted(p.alias for p in params)
        found = next((p for p in params if p.alias == loc[0]), None)
        if found is None:
            return None
        annotation, loc = found.field_info.annotation, loc[1:]
    else:
        annotation = params[0].field_info.annotation
    for part in loc:
        model = _model_in(annotation)
        field = None if model is None else next((f for name, f in model.model_fields.items()
                                                  if (f.alias or name) == part), None)
        if field is None:
            return None
        annotation = field.annotation
    model = _model_in(annotation)
    return None if model is None else sorted(f.alias or name for name, f in model.model_fields.items())


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model in ``annotation`` (``Model``, ``Model | None``, ``Annotated[Model, ...]``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        model = _model_in(arg)
        if model is not None:
            return model
    return None


def _validation_issue(err: dict[str, Any], route: Any = None) -> dict[str, Any]:
    loc = [str(p) for p in err.get("loc", ())]
    in_body = bool(loc) and loc[0] == "body"
    if loc and loc[0] in ("body", "query", "path", "header", "cookie"):
        loc = loc[1:]
    field = ".".join(loc) or "(body)"
    ctx = err.get("ctx") or {}
    kind = err.get("type", "")
    message = str(err.get("msg", "invalid"))
    if message.startswith("Value error, "):
        message = message[len("Value error, "):]
    valid = valid_for(err)
    value = err.get("input")
    if kind == "unstorable":
        # A whole-body check (app.models._Request) found the field deep inside the body.
        field = ".".join([*loc, ctx["field"]]) if ctx.get("field") != "(body)" else field
        value = ctx.get("value")
        message = f"{value!r} cannot be stored: {ctx.get('why')}"
    if kind == "extra_forbidden":
        message = f"unknown key {loc[-1]!r}" if loc else "unknown key"
        known = _known_keys(route, loc[:-1]) if in_body else None
        valid = known if known is not None else "only the keys the API documents (see /docs)"
    elif kind == "missing":
        message = "this field is required"
        value = None
    elif kind == "json_invalid":
        field = "(body)"
        message = f"the body is not valid JSON: {ctx.get('error', message)}"
        value = None
    return {"field": field, "value": brief(value), "message": f"{field}: {message}",
            "valid": brief(valid), "severity": "error", "type": kind}


def validation_error(exc: RequestValidationError, request: Request | None = None) -> AppError:
    route = request.scope.get("route") if request is not None else None
    issues = [_validation_issue(e, route) for e in exc.errors()]
    if not issues:
        return AppError(422, "invalid_request", "the request is not valid")
    first = issues[0]
    return AppError(422, "invalid_request", first["message"], field=first["field"], value=first["value"],
                    valid=first["valid"], issues=issues)


_HTTP_CODES = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
               405: "method_not_allowed", 413: "payload_too_large", 415: "unsupported_media_type"}


def http_error(exc: StarletteHTTPException, request: Request) -> AppError:
    status = exc.status_code
    detail = exc.detail if isinstance(exc.detail, str) else "request failed"
    if status == 404 and detail == "Not Found":
        return AppError(404, "not_found", f"no route {request.method} {request.url.path}", field="path",
                        value=request.url.path, headers=exc.headers)
    if status == 405:
        allowed = allowed_methods(request) or [m.strip() for m in (exc.headers or {}).get("Allow", "").split(",")
                                               if m.strip()]
        return AppError(405, "method_not_allowed", f"{request.method} is not allowed on {request.url.path}; "
                        f"allowed: {', '.join(allowed)}", field="method", value=request.method, valid=allowed,
                        headers={**(exc.headers or {}), "Allow": ", ".join(allowed)})
    if isinstance(exc.__cause__, BodyTooLarge):
        return too_large(f"more than {exc.__cause__.limit}", exc.__cause__.limit)
    if status == 400 and "parsing the body" in detail:
        return AppError(400, "invalid_body", "the body could not be read: it must be UTF-8 JSON", field="(body)",
                        valid="a UTF-8 JSON document")
    return AppError(status, _HTTP_CODES.get(status, "http_error"), detail, headers=exc.headers)


def allowed_methods(request: Request) -> list[str]:
    """Every method some route of the app answers on the request's path, sorted. Starlette's ``Allow``
    names only the first route whose path matched, so ``OPTIONS /api/trials`` said POST though GET is
    routed too."""
    path = request.url.path
    found: set[str] = set()
    stack: list[tuple[str, list[Any]]] = [("", list(request.app.router.routes))]
    while stack:
        prefix, routes = stack.pop()
        for route in routes:
            included = getattr(route, "original_router", None)  # FastAPI's included routers
            if included is not None:
                stack.append((prefix + route.include_context.prefix, list(included.routes)))
                continue
            regex, methods = getattr(route, "path_regex", None), getattr(route, "methods", None)
            if regex is not None and methods and path.startswith(prefix) and regex.match(path[len(prefix):]):
                found.update(methods)
    return sorted(found)


class LoginRequired(Exception):
    """A page that needs a principal was asked for anonymously: the browser goes to /login."""


def wants_page(request: Request) -> bool:
    """A browser outside the API: it asks for HTML, or it is htmx."""
    if request.url.path == "/api" or request.url.path.startswith("/api/"):
        return False
    return "text/html" in request.headers.get("accept", "") or is_htmx(request)


def render_error(request: Request, error: AppError) -> Response:
    """The one place an error becomes a response: JSON for the API, a page or fragment for the browser."""
    if not wants_page(request):
        return JSONResponse(error.body(), status_code=error.status, headers=error.headers)
    return render(request, "error.html", {**page_context(request), "error": error}, block="error",
                  status_code=error.status, headers=error.headers)


def install_error_handlers(app: FastAPI) -> None:
    async def on_app_error(request: Request, exc: AppError) -> Response:
        return render_error(request, exc)

    async def on_validation(request: Request, exc: RequestValidationError) -> Response:
        return render_error(request, validation_error(exc, request))

    async def on_http(request: Request, exc: StarletteHTTPException) -> Response:
        return render_error(request, http_error(exc, request))

    async def on_spec_error(request: Request, exc: SpecError) -> Response:
        return render_error(request, AppError.from_spec_error(exc))

    async def on_bug(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return render_error(request, AppError(500, "internal_error",
                                              "attnboard hit a bug; the server log has the traceback"))

    async def on_login_required(request: Request, exc: LoginRequired) -> Response:
        return redirect(f"/login?next={request.url.path}")

    app.add_exception_handler(LoginRequired, on_login_required)  # type: ignore[arg-type]
    app.add_exception_handler(AppError, on_app_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, on_validation)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, on_http)  # type: ignore[arg-type]
    app.add_exception_handler(SpecError, on_spec_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, on_bug)
