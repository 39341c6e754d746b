"""Reading a spec from text: a verl command line, a verl/attnboard YAML, or JSON (YAML's subset).

Pure except ``load_spec_file``, which reads the file (size-limited) and hands the text on.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

import yaml

from worker.interop.verl import MAX_INPUT_BYTES, ImportResult, VerlImportError, import_command, import_yaml

Format = Literal["cli", "yaml"]

_CONFIG_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")


def detect_format(text: str) -> Format:
    """``yaml`` when the whole text is a YAML mapping of config keys (``trainer:``, ``data.train_files:``,
    JSON too), else ``cli``: a launch script (``#!/bin/bash``, ``set -x``, ``export X=1`` ... then the verl
    command), a command line or a list of ``key=value`` overrides, which YAML reads as one string. An
    empty text (or only comments) is ``yaml``: an empty config."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)  # composed only: aliases are not expanded here
    except (yaml.YAMLError, RecursionError, ValueError):
        return "cli"
    if root is None:
        return "yaml"
    if isinstance(root, yaml.MappingNode) and all(
            isinstance(key, yaml.ScalarNode) and _CONFIG_KEY.match(str(key.value)) for key, _ in root.value):
        return "yaml"
    return "cli"


def load_spec_text(text: str, fmt: Literal["cli", "yaml", "auto"] = "auto") -> ImportResult:
    """Text -> ImportResult (spec, warnings, overrides); VerlImportError names the token and position."""
    if len(text.encode("utf-8", errors="surrogatepass")) > MAX_INPUT_BYTES:
        raise VerlImportError(f"spec text is larger than {MAX_INPUT_BYTES} bytes", text[:40], 0)
    chosen = detect_format(text) if fmt == "auto" else fmt
    return import_command(text) if chosen == "cli" else import_yaml(text)


def load_spec_file(path: str | Path, fmt: Literal["cli", "yaml", "auto"] = "auto") -> ImportResult:
    """Read a spec file (YAML, JSON or a verl command line); errors name the file."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"spec file {str(p)!r} does not exist or is not a file")
    if p.stat().st_size > MAX_INPUT_BYTES:
        raise VerlImportError(f"spec file {str(p)!r} is larger than {MAX_INPUT_BYTES} bytes", str(p), 0)
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise VerlImportError(f"spec file {str(p)!r} is not valid UTF-8", str(p), exc.start) from None
    return load_spec_text(text, fmt)
