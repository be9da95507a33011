#!/usr/bin/env bash
# The sample benchmarks on a GPU machine, several steps in ONE run of CALL_S seconds (default 570), each step
# under what is left of it:
#   CALL_S=570 OUT=results/ scripts/remote_gpu/device_samples.sh STEP [STEP ...]
# STEP is one of
#   attention_tiles attention_tune attention_ncu attention_l2 attention_bench attention_fix
#   moe_l2 moe_l2_skew moe_l2_fp8 moe_bench moe_bench_skew5 moe_bench_fp8 kv gemm8192_w4 timeline samples_gpu gpu_tier
#   gpu_quick timing_races race_catch llm_search host_nccl import_shapes throughput launch_bias exercise gin
#   bounded_waits search_vs_random
# (attention_fix: the seeds and variants matching $ONLY (default: the Overlapped/ChunkFlags variants and the
#  copy seed) again at 4 ranks, L2 and benchmark;
#  attention_tiles: the attention kernel alone at every tile shape vs SDPA flash; attention_tune: the same, then
#  the fastest shape per head dim written into attn::TileShape for the steps after it (reproduce the edit here with
#  tile_shapes.py --apply-from tile_shapes.json); attention_ncu: Nsight Compute's
#  throughput, occupancy and warp-stall sections of every D 64 shape at the non-causal paper size;
#  moe_l2_skew: L2 at the 5:1 skew preset alone; moe_l2_fp8: L2 with block-scaled e4m3 dispatch alone;
#  moe_bench_skew5 / moe_bench_fp8: one benchmark preset of moe_bench each; $SKEW5_ARGS / $FP8_ARGS
#  are added to them; timing_races: the launch-bias table and the race-amplification record, each checked by its
#  gpu test, their JSON in the step's archive; race_catch: the race-amplification record alone within 420 s (every
#  race class with every perturbation on and each alone, honest samples at 1/2/4 ranks, each perturbation's L2 cost;
#  benchmarks/harness/race_amplification.py) checked by its gpu test, tables in the log, JSON in the archive;
#  gpu_tier: the whole gpu test tier in at most 540 s and gpu_quick its
#  quick form in at most 300 s, both by scripts/remote_gpu/gpu_tier.py (what runs side by side, what alone, and
#  why: its docstring), their junit files and logs in the step's archive, a per-file summary last; host_nccl: host
#  NCCL under symm, every sample's seed_nccl.cu at 2 and 4 ranks with its median, every served call against torch,
#  three wrong candidates; import_shapes: every test program shape imported by cuco init, its seed run as its own
#  oracle at 1 rank under nccl and 2 under symm; throughput: benchmarks/executors/gpu_slots.py, evaluations per
#  GPU-hour and the phase table, every part in one run ($GIT_REV names the revision in its tables); launch_bias:
#  the launch-bias table with its intervals, checked by its gpu test; exercise: the 05_teaching exercise's hidden
#  answers evaluated at 2 symm ranks, the pass mark set and exercise-recording.json + .md written (copy them to
#  recordings/ to commit), then its gpu test grading a right and two wrong answers; gin: the GIN variant at 2 and 4 symm ranks, its three
#  wrong twins and the fast path's GIN branch; bounded_waits: a flag nobody raises ends in a verdict naming it;
#  search_vs_random: benchmarks/search/search_vs_random.py on its default landscapes, no evaluation started in the
#  last 60 s of the step ($SVR_ARGS added, e.g. "--seeds 5 --budget 20"))
# Each step writes its JSON, table and log into one archive, $OUT/<step>.tgz (one file per step, so a remote
# runner that copies back only a few files gets everything), and prints its last lines. A step gets `--budget-s` =
# what is left minus a margin, so it stops starting evaluations in time to write its JSON; steps that no longer
# fit are reported as not started.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
set -a; . cuco_kit/evaluate/multicast_off.env; set +a  # multicast off (the kit's one list)
command -v nvcc >/dev/null || export PATH="/usr/local/cuda/bin:$PATH"
PY=${PYTHON:-python3}
OUT=${OUT:-benchmarks/out}
WORK=$(mktemp -d)
CALL_S=${CALL_S:-570}
MARGIN_S=45   # writing the JSON, the torch reference child and closing the workers after the last evaluation
ITERS=${ITERS:-10}
mkdir -p "$OUT"

command_for() {  # $1 step, $2 budget seconds, $3 step folder
  case "$1" in
    attention_tiles) echo "$PY benchmarks/attention_cp/tile_shapes.py --iters $ITERS --out $3" ;;
    attention_tune)  echo "$PY benchmarks/attention_cp/tile_shapes.py --iters $ITERS --apply --out $3" ;;
    attention_ncu)   echo "ncu --kernel-name regex:flash_fwd_kernel --section SpeedOfLight --section Occupancy --section WarpStateStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis $PY benchmarks/attention_cp/tile_shapes.py --once --presets paper_noncausal" ;;
    attention_l2)    echo "$PY benchmarks/attention_cp/run.py --skip-bench --budget-s $2 --out $3" ;;
    attention_bench) echo "$PY benchmarks/attention_cp/run.py --skip-l2 --iters $ITERS --budget-s $2 --out $3" ;;
    attention_fix)   echo "$PY benchmarks/attention_cp/run.py --worlds 4 --only ${ONLY:-Overlapped/ChunkFlags|seed_copy} --iters $ITERS --budget-s $2 --out $3" ;;
    moe_l2_skew)     echo "$PY benchmarks/moe_dispatch_combine/run.py --skip-bench --l2-presets small_skew5 --budget-s $2 --out $3" ;;
    moe_l2_fp8)      echo "$PY benchmarks/moe_dispatch_combine/run.py --skip-bench --l2-presets small_fp8,small_skew5_fp8 --budget-s $2 --out $3" ;;
    moe_l2)          echo "$PY benchmarks/moe_dispatch_combine/run.py --skip-bench --budget-s $2 --out $3" ;;
    moe_bench)       echo "$PY benchmarks/moe_dispatch_combine/run.py --skip-l2 --iters $ITERS --budget-s $2 --out $3" ;;
    moe_bench_skew5) echo "$PY benchmarks/moe_dispatch_combine/run.py --skip-l2 --bench-presets dsv3_e32_skew5 ${SKEW5_ARGS:-} --iters $ITERS --budget-s $2 --out $3" ;;
    moe_bench_fp8)   echo "$PY benchmarks/moe_dispatch_combine/run.py --skip-l2 --bench-presets dsv3_e32_fp8 ${FP8_ARGS:-} --iters $ITERS --budget-s $2 --out $3" ;;
    kv)              echo "$PY benchmarks/kv_transfer/run.py --iters $ITERS --budget-s $2 --out $3" ;;
    gemm8192_w4)     echo "$PY benchmarks/gemm_allgather/run.py --worlds 4 --bench-presets 8192 --skip-l2 --iters $ITERS --budget-s $2 --out $3" ;;
    timeline)        echo "env CUCO_GPU_QUICK=1 $PY -m pytest -q -p no:cacheprovider tests/gpu/test_harness_gpu.py -k timeline" ;;
    samples_gpu)     echo "$PY -m pytest -q -p no:cacheprovider tests/gpu/test_samples_gpu.py" ;;
    timing_races)    echo "env CUCO_RECORD_DIR=$3 $PY -m pytest -q -p no:cacheprovider tests/gpu/test_launch_bias_gpu.py tests/gpu/test_race_amplification_gpu.py" ;;
    race_catch)      echo "env CUCO_RECORD_DIR=$3 CUCO_RACE_BUDGET_S=$(( $2 < 420 ? $2 : 420 )) $PY -m pytest -q -s -p no:cacheprovider tests/gpu/test_race_amplification_gpu.py" ;;
    search_vs_random) echo "$PY benchmarks/search/search_vs_random.py --evaluator gpu --budget-s $(( $2 > 60 ? $2 - 60 : $2 )) --dest $3 ${SVR_ARGS:-}" ;;
    gpu_tier)        echo "$PY scripts/remote_gpu/gpu_tier.py --out $3 --budget-s $(( $2 < 540 ? $2 : 540 ))" ;;
    gpu_quick)       echo "$PY scripts/remote_gpu/gpu_tier.py --quick --out $3 --budget-s $(( $2 < 300 ? $2 : 300 ))" ;;
    llm_search)      echo "OUT=$3 $PY -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_llm_search_gpu.py" ;;
    host_nccl)       echo "$PY -m pytest -q -p no:cacheprovider tests/gpu/test_host_nccl_symm_gpu.py" ;;
    import_shapes)   echo "$PY -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_import_shapes_gpu.py" ;;
    throughput)      echo "$PY benchmarks/executors/gpu_slots.py --out $3 --budget-s $2 ${GIT_REV:+--git $GIT_REV}" ;;
    exercise)        echo "env CUCO_RECORD_DIR=$3 $PY -m pytest -q -s -p no:cacheprovider tests/gpu/test_exercise_gpu.py" ;;
    gin)             echo "$PY -m pytest -q -p no:cacheprovider tests/gpu/test_gin_gpu.py" ;;
    bounded_waits)   echo "$PY -m pytest -q -p no:cacheprovider tests/gpu/test_bounded_waits_gpu.py" ;;
    launch_bias)     echo "env CUCO_RECORD_DIR=$3 $PY -m pytest -q -p no:cacheprovider tests/gpu/test_launch_bias_gpu.py" ;;
    *)               return 1 ;;
  esac
}

rc=0
for step in "$@"; do
  left=$((CALL_S - SECONDS))
  if [ "$left" -lt $((MARGIN_S + 30)) ]; then
    echo "== $step: NOT STARTED ($left s left of the call)"; rc=1; continue
  fi
  dir="$WORK/$step"; mkdir -p "$dir"
  cmd=$(command_for "$step" $((left - MARGIN_S)) "$dir") || { echo "== $step: unknown step"; rc=2; continue; }
  echo "== $step ($left s left): $cmd"
  t0=$SECONDS
  timeout --kill-after=10 $((left - 10)) $cmd >"$dir/$step.log" 2>&1
  src=$?
  lines=25; case "$step" in gpu_tier|gpu_quick) lines=45 ;; esac  # their per-file summary is last
  echo "== $step: rc=$src in $((SECONDS - t0)) s"; tail -n "$lines" "$dir/$step.log"
  [ "$src" = 0 ] || rc=1
  tar czf "$OUT/$step.tgz" -C "$WORK" "$step"
  # anything a killed step started must not outlive it (the bracket keeps the pattern off pkill's own command line)
  pkill -9 -f "[c]uco_kit.evaluate.rank.worker" && echo "== $step: killed leftover rank workers"
  if [ "$src" = 124 ] || [ "$src" = 137 ]; then pkill -f "[n]vidia-cuda-mps" && echo "== $step: stopped its MPS daemon"; fi
done
exit $rc
