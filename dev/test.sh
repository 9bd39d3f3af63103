#!/usr/bin/env bash
# Runs the whole test suite (the README's test command). Sets up .venv first if needed.
set -euo pipefail
cd "$(dirname "$0")/.."
./dev/setup.sh
exec .venv/bin/python -m pytest -n 4 --dist loadfile --no-loadscope-reorder -q "$@"
