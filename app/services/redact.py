"""What anonymous readers see of errors and folders: the error a user saw (the traceback's last line) with every
absolute path shortened to its last part, and checkpoint folders relative to the service's checkpoint root.
Tracebacks and absolute paths go to signed-in users only (a token or a browser session). Pure."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from app.models import CheckpointsPublic
from app.models_troubleshooting import EntryPublic
from app.services.auth import Principal

_ABSOLUTE = re.compile(r"(?<![\w.~/])/(?:[\w.@+\-]+/)+(?=[\w.@+\-]*)")
"""An absolute path's folders (``/home/me/app/x.py`` -> ``/home/me/app/``); segments cannot hold ``/``, so a match
costs one pass."""


def redact_paths(text: str) -> str:
    """``text`` with each absolute path's folders replaced by ``.../``.

    >>> redact_paths('File "/srv/attnboard/worker/engine/models.py", line 3')
    'File ".../models.py", line 3'
    """
    return _ABSOLUTE.sub(".../", text)


def public_error(text: str) -> str:
    """The error a user saw (a traceback's last non-empty line), paths shortened."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return redact_paths(lines[-1].strip()) if lines else ""


def _redacted(value: Any) -> Any:
    if isinstance(value, str):
        return redact_paths(value)
    if isinstance(value, dict):
        return {k: _redacted(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_redacted(v) for v in value]
    return value


def signed_in(principal: Principal) -> bool:
    return principal.kind != "anonymous"


def entry_for(principal: Principal, entry: EntryPublic) -> EntryPublic:
    """The entry as ``principal`` may read it: whole when signed in, else without traceback or absolute paths."""
    if signed_in(principal):
        return entry
    return entry.model_copy(update={"error": public_error(entry.error), "diagnosis": _redacted(entry.diagnosis)})


def checkpoints_for(principal: Principal, listing: CheckpointsPublic, root: Path) -> CheckpointsPublic:
    """A run's checkpoints as ``principal`` may read them: anonymous readers get paths relative to ``root``."""
    if signed_in(principal):
        return listing

    def relative(path: str) -> str:
        try:
            return str(Path(path).relative_to(root))
        except ValueError:
            return redact_paths(path)

    return listing.model_copy(update={
        "folder": relative(listing.folder),
        "data": [c.model_copy(update={"path": relative(c.path)}) for c in listing.data],
        "skipped": [{**s, **({"path": relative(s["path"])} if "path" in s else {}),
                     **({"why": redact_paths(s["why"])} if "why" in s else {})} for s in listing.skipped],
    })


def events_without_tracebacks(body: bytes) -> bytes:
    """A page of events (``EventsPublic`` as JSON) with each payload's ``traceback`` cut to its last line, paths
    shortened: what an anonymous reader gets."""
    page = json.loads(body)
    for event in page.get("data", []):
        payload = event.get("payload")
        if isinstance(payload, dict) and isinstance(payload.get("traceback"), str):
            payload["traceback"] = public_error(payload["traceback"])
    return json.dumps(page, separators=(",", ":")).encode()
