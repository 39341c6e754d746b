#!/usr/bin/env bash
# One command: sets up a fresh machine and serves attnboard on its embedded defaults
# (SQLite file in ./data, migrations applied at start-up, a local Ray on 127.0.0.1).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_USAGE_STATS_ENABLED=0
exec .venv/bin/attnboard serve "$@"
