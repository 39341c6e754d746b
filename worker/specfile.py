"""Reading a spec from text: a verl command line, a verl/attnboard YAML, or JSON (YAML's subset).

Pure except ``load_spec_file``, which reads the file (size-limited) and hands the text on.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from worker.verl import ImportResult, VerlImportError, import_command, import_yaml

Format = Literal["cli", "yaml"]
MAX_SPEC_BYTES = 1_000_000

_COMMAND_START = re.compile(r"^\s*(?:[A-Za-z_][A-Za-z0-9_]*=\S*\s+)*(?:\S*python[0-9.]*|\S*\.py|torchrun)\b")
_OVERRIDE = re.compile(r"^\s*[+~]{0,2}[A-Za-z_][\w.]*=")


def detect_format(text: str) -> Format:
    """``cli`` when the text is a command line (``python3 -m verl...``, ``k=v`` overrides), else ``yaml``."""
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if not lines:
        return "yaml"
    first = lines[0]
    if _COMMAND_START.match(first) or _OVERRIDE.match(first):
        return "cli"
    return "yaml"


def load_spec_text(text: str, fmt: Literal["cli", "yaml", "auto"] = "auto") -> ImportResult:
    """Text -> ImportResult (spec, warnings, overrides); VerlImportError names the token and position."""
    if len(text.encode("utf-8", errors="surrogatepass")) > MAX_SPEC_BYTES:
        raise VerlImportError(f"spec text is larger than {MAX_SPEC_BYTES} bytes", text[:40], 0)
    chosen = detect_format(text) if fmt == "auto" else fmt
    return import_command(text) if chosen == "cli" else import_yaml(text)


def load_spec_file(path: str | Path, fmt: Literal["cli", "yaml", "auto"] = "auto") -> ImportResult:
    """Read a spec file (YAML, JSON or a verl command line); errors name the file."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"spec file {str(p)!r} does not exist or is not a file")
    if p.stat().st_size > MAX_SPEC_BYTES:
        raise VerlImportError(f"spec file {str(p)!r} is larger than {MAX_SPEC_BYTES} bytes", str(p), 0)
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise VerlImportError(f"spec file {str(p)!r} is not valid UTF-8", str(p), exc.start) from None
    return load_spec_text(text, fmt)
