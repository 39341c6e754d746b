"""Untrusted text parsed off the event loop and off the app's GIL: a call runs in a warm child process with a
wall clock, and a call that overruns it is killed with its child (``IsolatedCalls``).

A verl launch script is walked as bash would run it (``worker.interop.shell``): however bounded the walk, a
script is attacker-sized input, and Python's ``re`` holds the GIL while it matches. In a child process a slow
or hostile import costs that child only: health, SSE and the API go on answering, and the import answers
``422 import_timeout`` at the wall clock.

Children are started with ``spawn`` (the app holds threads and a Ray driver, which ``fork`` would copy
half-way), import the modules they serve before they say they are ready, and are reused across calls; the
wall clock counts the call only, not a child's start-up. An ``AppError`` raised in the child comes back as
the same ``AppError``; any other exception as a 500-style ``RuntimeError`` naming its type.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from app.errors import AppError

log = logging.getLogger("attnboard.isolation")

START_TIMEOUT_S = 120.0
"""How long a child may take to import what it serves (a loaded 2-core machine takes a few seconds)."""


def _serve(conn: Connection, preload: tuple[str, ...]) -> None:
    """The child's loop: import ``preload``, say ready, then answer ``(module, function, kwargs)`` calls. It runs
    at a lower priority (nice 10), so a slow parse yields the CPU to the server's own work on a busy machine."""
    with contextlib.suppress(OSError):  # not permitted here: the child still runs apart from the app's GIL
        os.nice(10)
    for name in preload:
        importlib.import_module(name)
    conn.send(("ready",))
    while True:
        try:
            request = conn.recv()
        except EOFError:
            return
        module, function, kwargs = request
        try:
            result = getattr(importlib.import_module(module), function)(**kwargs)
            conn.send(("ok", result))
        except AppError as exc:
            conn.send(("app_error", exc.status, exc.code, exc.message,
                       {"field": exc.field, "value": exc.value, "valid": exc.valid, "issues": exc.issues}))
        except Exception as exc:  # the parent turns it into an error of its own; the child lives on
            conn.send(("error", type(exc).__name__, str(exc)[:500]))


class _Child:
    def __init__(self, context: Any, preload: tuple[str, ...]):
        self.conn, child_end = context.Pipe()
        self.process = context.Process(target=_serve, args=(child_end, preload), daemon=True,
                                       name="attnboard-isolated")
        self.process.start()
        child_end.close()
        self.ready = False

    def wait_ready(self) -> None:
        if self.ready:
            return
        if not self.conn.poll(START_TIMEOUT_S):
            self.kill()
            raise RuntimeError(f"an isolated worker did not start within {START_TIMEOUT_S:.0f} s")
        message = self.conn.recv()
        if message != ("ready",):
            self.kill()
            raise RuntimeError(f"an isolated worker started badly: {message!r}")
        self.ready = True

    def kill(self) -> None:
        try:
            self.process.kill()
            self.process.join(5)
        except Exception:  # already gone
            pass
        self.conn.close()


class IsolatedCalls:
    """Module-level functions run in warm child processes, at most ``max_children`` at once, each call within
    ``timeout_s`` of wall clock; ``on_timeout(elapsed)`` builds the error a call that overran raises."""

    def __init__(self, *, timeout_s: float, preload: tuple[str, ...], max_children: int = 2,
                 on_timeout: Callable[[float], AppError] | None = None):
        self.timeout_s = timeout_s
        self.preload = preload
        self.on_timeout = on_timeout or (lambda elapsed: AppError(
            422, "timeout", f"the call took more than {timeout_s:g} s", valid=f"<= {timeout_s:g} s"))
        self._context = multiprocessing.get_context("spawn")
        self._idle: list[_Child] = []
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(max_children)
        self._max_idle = self.max_children = max_children
        self._closed = False

    def warm(self, children: int = 1) -> None:
        """Start ``children`` children in the background, so the next calls find them ready."""
        for _ in range(children):
            threading.Thread(target=self._add_idle, daemon=True, name="attnboard-isolated-warm").start()

    def _add_idle(self) -> None:
        try:
            child = _Child(self._context, self.preload)
            child.wait_ready()
        except Exception:
            log.exception("could not start an isolated worker")
            return
        with self._lock:
            if self._closed or len(self._idle) >= self._max_idle:
                child.kill()
            else:
                self._idle.append(child)

    def _take(self) -> _Child:
        with self._lock:
            if self._closed:
                raise AppError(503, "shutting_down", "the server is shutting down", valid="retry after it restarts")
            child = self._idle.pop() if self._idle else None
        if child is None or not child.process.is_alive():
            child = _Child(self._context, self.preload)
        child.wait_ready()
        return child

    def call(self, module: str, function: str, **kwargs: Any) -> Any:
        """``module.function(**kwargs)`` in a child; its result, its AppError, or ``on_timeout``'s error."""
        if not self._slots.acquire(timeout=self.timeout_s):
            raise AppError(503, "busy", f"{self._max_idle} imports are running; try again in a moment",
                           valid="fewer concurrent imports", headers={"Retry-After": "1"})
        try:
            child = self._take()
            started = time.monotonic()
            child.conn.send((module, function, kwargs))
            if not child.conn.poll(self.timeout_s):
                child.kill()
                self.warm()  # the next call finds a child ready
                raise self.on_timeout(time.monotonic() - started)
            try:
                message = child.conn.recv()
            except EOFError:
                child.kill()
                raise RuntimeError("an isolated worker died during the call") from None
            with self._lock:
                if len(self._idle) < self._max_idle and not self._closed:
                    self._idle.append(child)
                else:
                    child.kill()
        finally:
            self._slots.release()
        if message[0] == "ok":
            return message[1]
        if message[0] == "app_error":
            _, status, code, text, extra = message
            raise AppError(status, code, text, **extra)
        raise RuntimeError(f"{message[1]} in an isolated call to {module}.{function}: {message[2]}")

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for child in idle:
            child.kill()
