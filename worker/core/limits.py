"""Size limits on what a user hands attnboard, in one place. Pure.

A spec, a verl command line or launch script, or a YAML document is at most ``MAX_INPUT_BYTES`` (the CLI's
spec files, ``POST /api/import``, the form's import box, the importer itself); a YAML document composes to
at most ``MAX_YAML_DEPTH`` levels and expands (aliases followed) to at most ``MAX_YAML_NODES`` values: verl's
whole generated config has about 700 (``worker.core.yaml_guard`` applies both).
"""

from __future__ import annotations

MAX_INPUT_BYTES = 1_000_000
"""Largest spec, command line, launch script or YAML document accepted, in UTF-8 bytes."""
MAX_YAML_NODES = 20_000
"""Largest YAML document, counted in values after aliases are expanded (the billion-laughs guard)."""
MAX_YAML_DEPTH = 64
"""Deepest nesting of a YAML document."""


def utf8_size(text: str) -> int:
    """The text's size in UTF-8 bytes (lone surrogates counted as one byte each)."""
    return len(text.encode("utf-8", errors="replace"))
