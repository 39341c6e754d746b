#!/usr/bin/env bash
# One command: sets up what the tests need, checks style and layers, then runs the whole suite (SQLite and PostgreSQL,
# local Ray on loopback, headless Chromium). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh --test
export RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1  # Ray on loopback: tests/conftest.py
# The style (ruff) and the layers of worker/ (import-linter, contracts in pyproject.toml) before the suite.
.venv/bin/ruff check .
.venv/bin/lint-imports --no-cache
set +e
.venv/bin/python -m pytest --durations=15 "$@"
rc=$?
set -e
if [ "$rc" = 5 ]; then
  echo "test.sh: pytest collected no tests; that is a failure" >&2
  exit 1
fi
exit "$rc"
