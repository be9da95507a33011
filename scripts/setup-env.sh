#!/usr/bin/env bash
# Creates .venv (if absent) and installs the project with the extras named in $1 (default: dev).
# Used by both README commands, so a fresh machine needs nothing else.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-dev}"
py="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$py" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[${extras}]"
touch .venv/.cuco-installed  # scripts/workbench.sh reinstalls only when pyproject.toml is newer than this
