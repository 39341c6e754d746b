"""ASGI middleware: a request-size limit that answers 413, and the trusted-hosts check (with HSTS over https),
both in the API's error shape."""

from __future__ import annotations

import socket
import time
from collections import OrderedDict, deque
from typing import Any
from urllib.parse import parse_qsl

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.errors import AppError, BodyTooLarge, too_large


class BodySizeLimit:
    """Refuse bodies over ``max_bytes``: at once by Content-Length, or while streaming for chunked bodies."""

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    def _error(self, size: Any) -> JSONResponse:
        return JSONResponse(too_large(size, self.max_bytes).body(), status_code=413)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None:
            try:
                size = int(declared)
            except ValueError:
                size = -1
            if size > self.max_bytes:
                await self._error(size)(scope, receive, send)
                return
        received = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except BodyTooLarge:
            if not started:
                await self._error(f"more than {self.max_bytes}")(scope, receive, send)


LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
HSTS = "max-age=31536000"


def default_allowed_hosts() -> list[str]:
    """The loopback names and this machine's names; the address a connection reached is allowed beside them
    (``TrustedHosts``), which covers the host ``attnboard serve --host`` binds."""
    names = [*LOOPBACK_HOSTS, socket.gethostname(), socket.getfqdn()]
    return list(dict.fromkeys(n.lower() for n in names if n))


def _host_of(header: str) -> str:
    """``example.com:8000`` -> ``example.com``; ``[::1]:8000`` -> ``::1``."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].split("]", 1)[0]
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def host_allowed(host: str, allowed: list[str], server: str | None) -> bool:
    """Whether a request's Host may be served: in ``allowed`` (``*`` any, ``*.example.com`` its subdomains), or
    the very address the connection reached (an IP literal cannot be rebound to another site). Pure."""
    name = _host_of(host)
    if not name:
        return False
    if server is not None and name == server.lower():
        return True
    for pattern in allowed:
        if pattern == "*" or name == pattern or (pattern.startswith("*.") and name.endswith(pattern[1:])):
            return True
    return False


class TrustedHosts:
    """Starlette's TrustedHostMiddleware in the API's error shape: a Host outside ``ATTNBOARD_ALLOWED_HOSTS``
    (a DNS-rebinding page pointing its own domain at 127.0.0.1) gets 400 naming the Host and what is valid.
    Also adds HSTS to every answer that went over https (behind a proxy with ``--proxy-headers``)."""

    def __init__(self, app: ASGIApp, allowed: list[str]):
        self.app = app
        self.allowed = [a.lower() for a in allowed]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        host = headers.get(b"host", b"").decode("latin-1")
        server = scope.get("server")
        if not host_allowed(host, self.allowed, server[0] if server else None):
            error = AppError(400, "invalid_host", f"Host {host[:100]!r} is not served here; set ATTNBOARD_ALLOWED_HOSTS "
                             "to the names this server is reached by", field="Host", value=host[:100],
                             valid=self.allowed)
            await JSONResponse(error.body(), status_code=400)(scope, receive, send)
            return
        if scope.get("scheme") != "https":
            await self.app(scope, receive, send)
            return

        async def with_hsts(message: Message) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"], (b"strict-transport-security", HSTS.encode())]
            await send(message)

        await self.app(scope, receive, with_hsts)


def nul_parameter(query_string: bytes) -> str | None:
    """The first query parameter whose name or value holds a NUL character (``%00``), or None. Pure."""
    if b"%00" not in query_string.lower() and b"\x00" not in query_string:
        return None
    for name, value in parse_qsl(query_string.decode("latin-1"), keep_blank_values=True):
        if "\x00" in name or "\x00" in value:
            return name.replace("\x00", "\\0")
    return None


class NoNulInQuery:
    """A NUL in any query parameter (a page's filter, an API filter) answers 422 naming the parameter: no
    database stores it (PostgreSQL refuses it in text, which answered 500)."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            name = nul_parameter(scope.get("query_string") or b"")
            if name is not None:
                error = AppError(422, "invalid_request", f"{name}: a NUL character (%00) is not valid in a query "
                                 "parameter", field=name, value="\\0", valid="text without NUL characters")
                await JSONResponse(error.body(), status_code=422)(scope, receive, send)
                return
        await self.app(scope, receive, send)


class FailureWindow:
    """Failed attempts per key (a client address) in a sliding window of ``window_s`` seconds: past ``limit`` the
    key waits until its oldest failure leaves the window. Pure over the times it is given; at most ``max_keys``
    keys are kept (the least recently failing go first), so a flood of addresses costs bounded memory."""

    def __init__(self, *, limit: int, window_s: float, max_keys: int = 10_000):
        self.limit, self.window_s, self.max_keys = limit, window_s, max_keys
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def _recent(self, key: str, now: float) -> deque[float] | None:
        times = self._failures.get(key)
        if times is None:
            return None
        while times and times[0] <= now - self.window_s:
            times.popleft()
        if not times:
            del self._failures[key]
            return None
        return times

    def retry_after(self, key: str, now: float) -> float | None:
        """Seconds ``key`` must wait before its next attempt, or None when it may try now."""
        times = self._recent(key, now)
        if times is None or len(times) < self.limit:
            return None
        return times[0] + self.window_s - now

    def fail(self, key: str, now: float) -> None:
        times = self._recent(key, now)
        if times is None:
            times = self._failures[key] = deque()
        times.append(now)
        self._failures.move_to_end(key)
        while len(self._failures) > self.max_keys:
            self._failures.popitem(last=False)


LOGIN_PATH = "/login"
LOGIN_FAILURES = 10
LOGIN_WINDOW_S = 300.0


class LoginThrottle:
    """Failed sign-ins (``POST /login`` answered 401) are counted per client address: past ``LOGIN_FAILURES``
    in ``LOGIN_WINDOW_S`` seconds, further attempts answer 429 with Retry-After until the oldest leaves the
    window (behind a proxy with ``--proxy-headers`` the address is the forwarded one)."""

    def __init__(self, app: ASGIApp, *, limit: int = LOGIN_FAILURES, window_s: float = LOGIN_WINDOW_S):
        self.app = app
        self.window = FailureWindow(limit=limit, window_s=window_s)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST" or scope.get("path") != LOGIN_PATH:
            await self.app(scope, receive, send)
            return
        client = scope.get("client")
        key = client[0] if client else "?"
        wait = self.window.retry_after(key, time.monotonic())
        if wait is not None:
            seconds = max(1, int(wait + 0.999))
            error = AppError(429, "too_many_sign_ins", f"{self.window.limit} failed sign-ins from {key} in "
                             f"{self.window.window_s:g} s; try again in {seconds} s", field="token",
                             valid=f"at most {self.window.limit} failed sign-ins per {self.window.window_s:g} s",
                             headers={"Retry-After": str(seconds)})
            await JSONResponse(error.body(), status_code=429, headers=error.headers)(scope, receive, send)
            return

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] == 401:
                self.window.fail(key, time.monotonic())
            await send(message)

        await self.app(scope, receive, counting_send)


DOC_PATHS = frozenset({"/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"})


class DocsReadRule:
    """The API's documentation (``/docs``, ``/redoc``, ``/openapi.json``) follows the read rule: with
    ``ATTNBOARD_REQUIRE_TOKEN_FOR_READS`` it needs a read token or a signed-in browser, like every GET."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("path") in DOC_PATHS:
            from starlette.requests import Request

            from app.deps import require_read

            try:
                await require_read(Request(scope, receive))
            except AppError as error:
                await JSONResponse(error.body(), status_code=error.status, headers=error.headers)(scope, receive, send)
                return
        await self.app(scope, receive, send)
