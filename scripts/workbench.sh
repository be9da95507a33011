#!/usr/bin/env bash
# The workbench: installs everything into .venv, then opens JupyterLab on the quickstart notebook, bound to
# 127.0.0.1 only. Extra arguments go to JupyterLab (e.g. --no-browser --port 8890).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-env.sh dev
export PATH="$PWD/.venv/bin:$PATH"
root_flag=(); [ "$(id -u)" = 0 ] && root_flag=(--allow-root)  # containers often run as root
exec jupyter lab "${root_flag[@]}" --ip=127.0.0.1 --ServerApp.root_dir="$PWD/notebooks" \
  --LabApp.default_url=/lab/tree/00_quickstart.ipynb "$@"
