"""Regenerate the generated blocks of README.md (the settings table) from the code.

    .venv/bin/python scripts/update_readme.py          # rewrite README.md
    .venv/bin/python scripts/update_readme.py --check  # exit 1 if README.md is out of date
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from app.core.config import settings_table_markdown

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCK = re.compile(r"(<!-- settings:start -->\n).*?(<!-- settings:end -->)", re.S)


def render(text: str) -> str:
    return BLOCK.sub(lambda m: m.group(1) + settings_table_markdown() + m.group(2), text)


def main() -> int:
    text = README.read_text(encoding="utf-8")
    new = render(text)
    if "--check" in sys.argv:
        return 0 if new == text else 1
    README.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
