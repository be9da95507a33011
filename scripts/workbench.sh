#!/usr/bin/env bash
# The workbench: installs everything into .venv, then opens JupyterLab on the quickstart notebook,
# bound to 127.0.0.1 only.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-env.sh dev
export PATH="$PWD/.venv/bin:$PATH"
exec jupyter lab --ip=127.0.0.1 --notebook-dir=notebooks "${@}" notebooks/00_quickstart.ipynb
