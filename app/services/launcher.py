"""How runs reach compute. The app holds at most one ``Launcher`` (``app.state.launcher``); the Ray
implementation comes with the service issue. With none attached, runs stay ``queued`` and a cancel of
a starting/running run is final at once (nothing else could confirm it)."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from app.models import Run


class LauncherUnavailable(Exception):
    """The compute backend cannot be reached (e.g. Ray down); the run stays queued and can be submitted later."""


@runtime_checkable
class Launcher(Protocol):
    def submit(self, run: Run) -> str | None:
        """Start ``run`` (its id and immutable ``spec``); return a handle kept in ``run.ray_job``.
        Raises LauncherUnavailable when the backend cannot be reached."""

    def cancel(self, run: Run) -> None:
        """Ask the backend to stop ``run``; the worker confirms with a ``status: cancelled`` event."""
