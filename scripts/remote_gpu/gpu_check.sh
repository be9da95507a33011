#!/usr/bin/env bash
# The harness's GPU check in ONE command, on a GPU machine whose system python3 has torch and the NCCL wheel:
#   OUT=results/ scripts/remote_gpu/gpu_check.sh [--n N_PER_RANK] [--iters N] [--skip-adversarial]
# Builds the all-gather samples and the adversarial set, evaluates them (nccl world 1, symm 2 and 4 ranks),
# measures warm vs cold evaluation time, checks for leaks, writes JSON to $OUT (default benchmarks/harness/out) and
# benchmarks/harness/, and prints a table last. L0 needs tree-sitter; where it is missing L0 is skipped with a
# note (the evaluation path imports the L0 check lazily) and writes_file.cu is rejected at run time instead.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
set -a; . cuco_kit/evaluate/multicast_off.env; set +a  # multicast off (the kit's one list)
PY=${PYTHON:-python3}
OUT=${OUT:-benchmarks/harness/out}
{ command -v nvidia-smi >/dev/null && nvidia-smi -L; } || { echo "gpu_check: no GPU (nvidia-smi -L failed)"; exit 2; }
mkdir -p "$OUT"
command -v nvcc >/dev/null || export PATH="/usr/local/cuda/bin:$PATH"
$PY -c "import tree_sitter, tree_sitter_cuda" 2>/dev/null \
  || echo "gpu_check: note: tree-sitter not installed here: L0 is skipped, the whitelist is not checked"
$PY -c "import torch, nvidia.nccl; print('torch', torch.__version__, 'cuda', torch.version.cuda)" \
  || { echo "gpu_check: torch or the nvidia-nccl wheel is missing"; exit 2; }
timeout --kill-after=20 560 $PY benchmarks/harness/run.py --out "$OUT" "$@"
rc=$?
[ $rc = 124 ] && echo "gpu_check: TIMED OUT after 560 s (partial JSON may be missing)"
# anything we started must be gone even if run.py died
left=$(pgrep -f "cuco_kit.evaluate.rank.worker" || true)
[ -n "$left" ] && { echo "gpu_check: LEAK: rank workers still running: $left"; rc=1; }
exit $rc
