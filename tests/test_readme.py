"""Every path README.md names in backticks exists: a path with a folder (``worker/core/roles.py``,
``bench/results/*.md``: a pattern matches at least one file) from the repository's root, a bare file name
(``pump.py``) somewhere in the tree."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# a bare name with one of these endings is a source file of the repository (a ``config.json`` or a
# ``checkpoint.json`` the README names is a run's or a model's file, not the repository's)
FILE_ENDINGS = (".py", ".md", ".sh", ".html", ".toml", ".ini", ".css", ".js")
SKIPPED_FOLDERS = {".venv", ".git", "node_modules", "__pycache__"}


def named_paths(markdown: str, top: set[str]) -> tuple[list[str], list[str]]:
    """(paths from the root, bare file names) named in ``markdown``'s backticks; ``top`` is the root's entries,
    so a URL path (``/docs``), a dotted key or a command line is not taken for a path."""
    rooted: list[str] = []
    bare: list[str] = []
    for span in re.findall(r"`([^`\n]+)`", markdown):
        for word in span.replace(",", " ").split():
            word = word.rstrip(".:;)")
            if any(c in word for c in "<>{}=$|\"'") or word.startswith(("/", "-", "http")):
                continue
            if "/" in word and word.split("/")[0] in top:
                rooted.append(word.rstrip("/"))
            elif "/" not in word and word.endswith(FILE_ENDINGS) and word.count(".") == 1:
                bare.append(word)
    return rooted, bare


@pytest.mark.parametrize(
    "markdown,rooted,bare",
    [
        ("`worker/core/` and `worker/core/roles.py`", ["worker/core", "worker/core/roles.py"], []),
        ("(`pump.py`, `feeds.py`)", [], ["pump.py", "feeds.py"]),
        ("`bench/results/*.md`", ["bench/results/*.md"], []),
        ("`/docs`, `/proc/<pid>/maps`, `GET /api/runs/{id}`", [], []),
        ("`trainer.save_freq`, `attnboard run SPEC`, `app.core.config`", [], []),
        ("`python -m worker run SPEC`", [], []),
        ("`worker/interop/shell/ (words)`", ["worker/interop/shell"], []),
        ("`ATTNBOARD_DATA_DIR=/tmp/x`", [], []),
        ("a model's `config.json`, `latest_checkpointed_iteration.txt`", [], []),
    ],
)
def test_named_paths_table(markdown: str, rooted: list[str], bare: list[str]) -> None:
    assert named_paths(markdown, {"worker", "bench", "app"}) == (rooted, bare)


def _tree_names() -> set[str]:
    names: set[str] = set()
    for path in ROOT.rglob("*"):
        if not SKIPPED_FOLDERS.intersection(path.relative_to(ROOT).parts):
            names.add(path.name)
    return names


def test_every_path_the_readme_names_exists() -> None:
    top = {p.name for p in ROOT.iterdir()} - SKIPPED_FOLDERS  # .venv is made by setup, not a path of the repository
    rooted, bare = named_paths(README.read_text(encoding="utf-8"), top)
    assert len(rooted) >= 20, rooted  # the map of the house is there
    missing = [p for p in rooted if not (any(ROOT.glob(p)) if "*" in p else (ROOT / p).exists())]
    names = _tree_names()
    missing += [name for name in bare if name not in names]
    assert missing == [], f"README.md names paths that do not exist: {missing}"
