"""A small synthetic workload for tests, smoke runs and demos of the search with the SIMULATED evaluator.

``write_synthetic_workload(folder)`` writes a workload directory whose baseline has a knob block with
structural placement and issuer knobs next to chunk and thread counts (96 combinations), a frozen region and
a second EVOLVE block (for LLM diffs). The kernels are plausible CUDA that the static check parses; they are
never built: only the simulated or replay evaluators make sense with it.
"""
from __future__ import annotations

from pathlib import Path

KNOB_SETS = {
    "kChunks": ("1", "2", "4", "8"),
    "kPlacement": ("Placement::kSequential", "Placement::kTwoStream", "Placement::kSplitPutWait",
                   "Placement::kFused"),
    "kThreads": ("128", "256", "512"),
    "kIssuer": ("Issuer::kAllThreads", "Issuer::kOneWarp"),
}

BASELINE = """\
// Synthetic GEMM + AllGather candidate for the search's tests (never built; evaluated by a simulator).
#include "cuco_abi.h"

enum class Placement { kSequential, kTwoStream, kSplitPutWait, kFused };
enum class Issuer { kAllThreads, kOneWarp };

// EVOLVE-BLOCK-START knobs
constexpr int kChunks = 2;                                 // knob: {1, 2, 4, 8}
constexpr Placement kPlacement = Placement::kSequential;   // knob: {Placement::kSequential, Placement::kTwoStream, \
Placement::kSplitPutWait, Placement::kFused}
constexpr int kThreads = 256;                              // knob: {128, 256, 512}
constexpr Issuer kIssuer = Issuer::kAllThreads;            // knob: {Issuer::kAllThreads, Issuer::kOneWarp}
// EVOLVE-BLOCK-END

struct State {
  int rank;
  int world;
};

// EVOLVE-BLOCK-START kernel
__global__ void gather_chunks(const float* __restrict__ x, float* __restrict__ y, long n, int chunk) {
  long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
  long begin = (long)chunk * n / kChunks;
  long end = (long)(chunk + 1) * n / kChunks;
  for (long j = begin + i; j < end; j += (long)gridDim.x * blockDim.x) {
    y[j] = x[j];
  }
}

static void launch_step(const float* x, float* y, long n, cudaStream_t stream) {
  for (int c = 0; c < kChunks; ++c) {
    gather_chunks<<<64, kThreads, 0, stream>>>(x, y, n, c);
  }
}
// EVOLVE-BLOCK-END

extern "C" int cuco_setup(cuco_ctx_t* ctx) {
  (void)ctx;
  return 0;
}

extern "C" int cuco_step(cuco_ctx_t* ctx) {
  const float* x = (const float*)ctx->tensors[0].local;
  float* y = (float*)ctx->tensors[1].local;
  launch_step(x, y, (long)ctx->params[0], ctx->stream);
  return 0;
}

extern "C" int cuco_teardown(cuco_ctx_t* ctx) {
  (void)ctx;
  return 0;
}
"""

SEED = """\
// Synthetic host-collective seed (reference program for speed-up ratios; never built).
#include "cuco_abi.h"

__global__ void copy_all(const float* __restrict__ x, float* __restrict__ y, long n) {
  long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i];
}

extern "C" int cuco_setup(cuco_ctx_t* ctx) {
  (void)ctx;
  return 0;
}

extern "C" int cuco_step(cuco_ctx_t* ctx) {
  const float* x = (const float*)ctx->tensors[0].local;
  float* y = (float*)ctx->tensors[1].local;
  copy_all<<<256, 256, 0, ctx->stream>>>(x, y, (long)ctx->params[0]);
  return 0;
}

extern "C" int cuco_teardown(cuco_ctx_t* ctx) {
  (void)ctx;
  return 0;
}
"""

WORKLOAD_PY = '''\
"""Synthetic workload for the search's tests (SIMULATED evaluation only)."""
from pathlib import Path

from cuco_kit.workload import TensorSpec, Workload


def _reference(inputs, params, world):
    return [{"y": inputs[r]["x"]} for r in range(world)]


WORKLOAD = Workload(
    name="synthetic_gemm_allgather",
    directory=Path(__file__).resolve().parent,
    description="synthetic workload for search tests",
    params={"N": 4096},
    tensors=[
        TensorSpec("x", "input", "f32", shape=lambda p, w: (p["N"],)),
        TensorSpec("y", "output", "f32", shape=lambda p, w: (p["N"],)),
    ],
    reference=_reference,
    seeds={"nccl": "seed_nccl.cu", "symm": "seed_nccl.cu"},
    baseline="baseline.cu",
)
'''


def write_synthetic_workload(folder: str | Path) -> Path:
    """Write the synthetic workload into ``folder`` (created) and return it."""
    d = Path(folder)
    d.mkdir(parents=True, exist_ok=True)
    (d / "baseline.cu").write_text(BASELINE, encoding="utf-8")
    (d / "seed_nccl.cu").write_text(SEED, encoding="utf-8")
    (d / "workload.py").write_text(WORKLOAD_PY, encoding="utf-8")
    return d
