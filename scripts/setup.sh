#!/usr/bin/env bash
# Sets up a fresh machine for attnboard: a virtual environment in .venv with the package and,
# with --test, what the test suite needs (test extra, the verl 0.9.1 wheel without its
# dependencies, Debian's chromium). Safe to run again: it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

want_test=0
for arg in "$@"; do
  case "$arg" in
    --test) want_test=1 ;;
    *) echo "setup.sh: unknown option $arg (valid: --test)" >&2; exit 2 ;;
  esac
done

PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
fi

stamp=.venv/.attnboard-installed
extras="."
[ "$want_test" = 1 ] && extras=".[test]"
# Reinstall when pyproject.toml changed or the requested extras are new.
key="$(sha256sum pyproject.toml | cut -c1-16) $extras"
if [ ! -f "$stamp" ] || ! grep -qxF "$key" "$stamp"; then
  .venv/bin/python -m pip install -q -e "$extras"
  echo "$key" >> "$stamp"
fi

if [ "$want_test" = 1 ]; then
  # verl is only read (its generated default config), never imported: install it without deps.
  .venv/bin/python -c "import importlib.util,sys; sys.exit(0 if importlib.util.find_spec('verl') else 1)" 2>/dev/null \
    || .venv/bin/python -m pip install -q --no-deps "verl==0.9.1"
  # Debian packages: chromium for the browser tests, docker-compose to validate docker-compose.yml.
  missing=""
  command -v chromium >/dev/null 2>&1 || missing="$missing chromium"
  command -v docker-compose >/dev/null 2>&1 || missing="$missing docker-compose"
  if [ -n "$missing" ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq --no-install-recommends $missing >/dev/null
  fi
fi
