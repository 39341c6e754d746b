"""Rendering for the browser: one Jinja environment, one template per page whose ``{% block %}``s are
also the htmx fragments, and the security headers every HTML answer carries.

``render(request, "run_new.html", ctx, block="preview")`` answers the whole page to a normal request
and only the ``preview`` block to an htmx request (``HX-Request: true``), so a fragment can never
drift from the page it belongs to.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.responses import RedirectResponse
from jinja2_fragments.fastapi import Jinja2Blocks
from markupsafe import Markup
from starlette.responses import Response

from worker.core.implementations import FALLBACK_CHAIN

TEMPLATES_DIR = Path(__file__).parent / "templates"
STATIC_DIR = Path(__file__).parent / "static"

CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
}

# What each badge says beside its colour, so status never depends on colour alone.
BADGE_TEXT = {
    "default": "default",
    "override": "override",
    "ok": "ok",
    "forced": "forced",
    "fallback": "fallback",
    "error": "error",
    "queued": "queued",
    "starting": "starting",
    "running": "running",
    "succeeded": "succeeded",
    "failed": "failed",
    "cancelled": "cancelled",
}
BADGE_ICON = {"forced": "!", "fallback": "↓", "error": "✕", "failed": "✕", "succeeded": "✓", "running": "●",
              "cancelled": "–", "queued": "…", "starting": "…"}


def badge(kind: str | None, text: str | None = None) -> Markup:
    """A status pill: colour by class, meaning by text (and an icon), always both."""
    kind = kind or "unknown"
    label = text if text is not None else BADGE_TEXT.get(kind, kind)
    icon = BADGE_ICON.get(kind, "")
    icon_html = Markup('<span aria-hidden="true">{}</span> ').format(icon) if icon else Markup("")
    return Markup('<span class="badge badge-{cls}">{icon}{label}</span>').format(
        cls="".join(c if c.isalnum() else "-" for c in kind), icon=icon_html, label=label
    )


def json_script(value: Any) -> Markup:
    """JSON safe to place inside ``<script type="application/json">`` (a data block CSP does not run)."""
    text = json.dumps(value, separators=(",", ":"), default=str)
    return Markup(text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026"))


templates = Jinja2Blocks(directory=str(TEMPLATES_DIR))
templates.env.filters["badge"] = badge
templates.env.filters["json_script"] = json_script
templates.env.globals["badge"] = badge
templates.env.globals["trial_implementations"] = FALLBACK_CHAIN  # the new-run form's trial choices


def is_htmx(request: Request) -> bool:
    return request.headers.get("HX-Request") == "true"


def add_security_headers(response: Response) -> Response:
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
    return response


def render(
    request: Request,
    template: str,
    context: dict[str, Any] | None = None,
    *,
    block: str | None = None,
    status_code: int = 200,
    headers: dict[str, str] | None = None,
) -> Response:
    """The page, or only ``block`` when htmx asked; with the security headers either way."""
    ctx = dict(context or {})
    kwargs: dict[str, Any] = {}
    if block is not None and is_htmx(request):
        kwargs["block_name"] = block
    response = templates.TemplateResponse(request, template, ctx, status_code=status_code, headers=headers, **kwargs)
    for name, value, options in getattr(request.state, "pending_cookies", ()):  # see app.auth_browser.csrf_token_for
        response.set_cookie(name, value, **options)
    return add_security_headers(response)


def page_context(request: Request) -> dict[str, Any]:
    """What every page's layout needs: the principal and the CSRF token (set by ``app.deps.page_user``)."""
    return {
        "principal": getattr(request.state, "principal", None),
        "csrf_token": getattr(request.state, "csrf_token", ""),
    }


def redirect(url: str) -> RedirectResponse:
    """After a browser POST: 303, so a reload does not post again."""
    return RedirectResponse(url, status_code=303)
