#!/usr/bin/env bash
# The workbench: JupyterLab bound to 127.0.0.1, serving a folder (default notebooks/, opening the quickstart).
#   scripts/workbench.sh [FOLDER] [JupyterLab arguments, e.g. --no-browser --port 8890]
# Installs into .venv only when .venv is missing or older than pyproject.toml (scripts/setup-env.sh leaves a
# stamp after each install), so once set up the workbench starts offline, with no package index in reach.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
folder="$repo/notebooks"
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then
  [ -d "$1" ] || { echo "workbench.sh: $1 is not a folder; pass the folder to serve (default notebooks/)" >&2; exit 2; }
  folder="$(cd "$1" && pwd)"
  shift
fi
stamp="$repo/.venv/.cuco-installed"
# Reinstall unless the stamp is strictly newer than pyproject.toml: "pyproject -nt stamp" would call an edit made
# within the file system's timestamp granule up to date.
if [ ! -x "$repo/.venv/bin/jupyter" ] || [ ! -f "$stamp" ] || ! [ "$stamp" -nt "$repo/pyproject.toml" ]; then
  bash "$repo/scripts/setup-env.sh" dev
fi
export PATH="$repo/.venv/bin:$PATH"
extra=()
[ "$(id -u)" = 0 ] && extra+=(--allow-root)  # containers often run as root
[ -f "$folder/00_quickstart.ipynb" ] && extra+=(--LabApp.default_url=/lab/tree/00_quickstart.ipynb)
exec jupyter lab "${extra[@]}" --ip=127.0.0.1 --ServerApp.root_dir="$folder" "$@"
