"""``/docs`` (Swagger UI) and ``/redoc`` (ReDoc) from the vendored assets under ``app/static/vendor`` (npm's
swagger-ui-dist and redoc, versions in ``VERSIONS``): no CDN, so both work offline. No inline script: the
Swagger UI is started by ``/static/api-docs.js``; ReDoc reads its ``spec-url`` attribute."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

router = APIRouter(include_in_schema=False)

DOCS_CSP = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
            "font-src 'self' data:; worker-src 'self' blob:; connect-src 'self'; frame-ancestors 'none'")
"""Both UIs set inline styles (ReDoc injects its stylesheet, Swagger UI styles its elements) and ReDoc
searches in a blob: worker; scripts still come only from this server."""

_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>attnboard API · {title}</title>
<link rel="icon" href="/static/favicon.svg" type="image/svg+xml">
{head}
</head>
<body>
{body}
</body>
</html>
"""


def _page(title: str, head: str, body: str) -> HTMLResponse:
    return HTMLResponse(_PAGE.format(title=title, head=head, body=body),
                        headers={"Content-Security-Policy": DOCS_CSP, "X-Content-Type-Options": "nosniff"})


@router.get("/docs")
def swagger_ui() -> HTMLResponse:
    return _page("Swagger UI", '<link rel="stylesheet" href="/static/vendor/swagger-ui/swagger-ui.css">',
                 '<div id="swagger-ui" data-openapi-url="/openapi.json"></div>\n'
                 '<script src="/static/vendor/swagger-ui/swagger-ui-bundle.js"></script>\n'
                 '<script src="/static/api-docs.js"></script>')


@router.get("/redoc")
def redoc() -> HTMLResponse:
    return _page("ReDoc", "", '<redoc spec-url="/openapi.json"></redoc>\n'
                              '<script src="/static/vendor/redoc/redoc.standalone.js"></script>')
