#!/usr/bin/env bash
# Regenerates docs/screenshots/ (every page at 1400 and 390 px wide) with Debian's chromium; see
# scripts/screenshots.py for what is shown.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh --test
exec .venv/bin/python scripts/screenshots.py "$@"
