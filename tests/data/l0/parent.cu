// A small candidate in the ABI v1 form, annotated with EVOLVE blocks (test data for the L0 check).
#include <algorithm>
#include <cstdio>
#include <cuda_runtime.h>
#include "cuco_abi.h"

#define CUDA_OK(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) return 1; } while (0)

enum class Placement { kSequential, kTwoStream, kFused };

// EVOLVE-BLOCK-START knobs
// Design-space knobs: the offline search sets these.
constexpr int kChunks = 4;                                  // knob: {1, 2, 4, 8}
constexpr int kThreads = 256;                               // knob: {128, 256, 512}
constexpr Placement kPlacement = Placement::kTwoStream;     // knob: {Placement::kSequential, Placement::kTwoStream, Placement::kFused}
// EVOLVE-BLOCK-END

struct State {
  cudaStream_t side;
  cudaEvent_t ev[8];
};

static int ceil_div(int a, int b) { return (a + b - 1) / b; }

// EVOLVE-BLOCK-START kernels
__device__ __forceinline__ void release_flag(unsigned* flag) {
  asm volatile("fence.acq_rel.sys;" ::: "memory");
  atomicExch(flag, 1u);
}

__global__ void __launch_bounds__(256) copy_chunk(float* const* peers, const float* src, size_t n, int rank,
                                                  int world) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= n) return;
  for (int r = 0; r < world; ++r) {
    peers[r][rank * n + i] = src[i];
  }
  __threadfence_system();
}
// EVOLVE-BLOCK-END

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  State* s = new State();
  CUDA_OK(cudaStreamCreateWithFlags(&s->side, cudaStreamNonBlocking));
  for (int c = 0; c < 8; ++c) CUDA_OK(cudaEventCreateWithFlags(&s->ev[c], cudaEventDisableTiming));
  ctx->user = s;
  return 0;
}

CUCO_EXPORT int cuco_step(cuco_ctx_t* ctx) {
  State* s = static_cast<State*>(ctx->user);
  const cuco_tensor_t& in = ctx->tensors[0];
  const cuco_tensor_t& out = ctx->tensors[1];
  // EVOLVE-BLOCK-START step
  size_t n = in.valid_bytes / sizeof(float);
  size_t per = ceil_div((int)n, kChunks);
  for (int c = 0; c < kChunks; ++c) {
    size_t len = std::min(per, n - c * per);
    cudaStream_t st = (kPlacement == Placement::kTwoStream && (c & 1)) ? s->side : ctx->stream;
    copy_chunk<<<ceil_div((int)len, kThreads), kThreads, 0, st>>>(
        (float* const*)out.peers, (const float*)in.local + c * per, len, ctx->rank, ctx->world_size);
    CUDA_OK(cudaEventRecord(s->ev[c], st));
    CUDA_OK(cudaStreamWaitEvent(ctx->stream, s->ev[c], 0));
  }
  // EVOLVE-BLOCK-END
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) {
  State* s = static_cast<State*>(ctx->user);
  for (int c = 0; c < 8; ++c) cudaEventDestroy(s->ev[c]);
  cudaStreamDestroy(s->side);
  delete s;
  return 0;
}
