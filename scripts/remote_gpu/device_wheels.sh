#!/usr/bin/env bash
# The Python packages the gpu tier needs that the device image lacks, as wheels in .whl/ (ignored by git; carry it):
#   bash scripts/remote_gpu/device_wheels.sh
# then, first in the device command:
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
#     && export PYTHONPATH=/tmp/site
# tree-sitter: L0 and cuco init; optuna (+ alembic, sqlalchemy, colorlog, mako, greenlet): the design-space source;
# openai below 2 (3.x needs httpx2, which the image lacks) and its own needs: the fast path's fake-server tests.
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx "/.whl/" .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo "/.whl/" >> .git/info/exclude; }
for pkg in tree-sitter tree-sitter-cuda "openai<2" pydantic pydantic-core distro jiter sniffio annotated-types \
           typing-inspection optuna alembic sqlalchemy colorlog mako greenlet; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "$pkg"
done
du -sh .whl
