/*
 * ADVERSARIAL candidate for sample_kernels/allgather (test data: it must never be scored).
 *
 * raw_omits_wait: omits_wait.cu written without the runtime's signalling primitives. Every CTA pushes its
 * share of x into every rank's y, orders its stores (__syncthreads, __threadfence_system) and announces them
 * with a volatile store into each peer's per-(source, CTA) flag; the consumer side is missing: nothing waits
 * for the peers' flags, and there is no entry barrier either. So this rank's kernel ends as soon as its OWN
 * stores are done, whether or not the peers' slices have arrived in its y. Correct at world size 1, and
 * whenever every peer happens to finish its stores before this rank's stream reports the step done.
 *
 * Why it is here: no runtime primitive to pause, so only the harness's own perturbation shows it: a late rank
 * whose stream starts after everyone else's (the start delay of the L2 trials) has not stored anything yet
 * when the others finish.
 *
 * Expected: L2, verification fails at world size 2+ (small preset).
 */
#include "cuco_lsa.h"

// EVOLVE-BLOCK-START knobs
constexpr int kBlocks = 32;    // knob: {8, 16, 32, 64}
constexpr int kThreads = 512;  // knob: {128, 256, 512, 1024}
constexpr int kVecBytes = 16;  // knob: {4, 8, 16}
constexpr int kUnroll = 2;     // knob: {1, 2, 4}
// EVOLVE-BLOCK-END

static constexpr size_t kElemBytes = 2;  // bf16

// The widest plain type per store width: 16 bytes is one st.global.v4.u32.
template <int Bytes> struct VecOf;
template <> struct VecOf<4> { using type = uint32_t; };
template <> struct VecOf<8> { using type = uint2; };
template <> struct VecOf<16> { using type = uint4; };
using Vec = VecOf<kVecBytes>::type;

struct AllGatherState {
  size_t slice_bytes;  // this rank's x, and each slice of y
};

// EVOLVE-BLOCK-START kernel
__global__ void __launch_bounds__(kThreads)
allgather_push(void* const* y_peers, const Vec* __restrict__ x, size_t nVec, uint64_t* const* flags, int me,
               int world, uint64_t epoch) {
  const size_t dst_offset = (size_t)me * nVec * sizeof(Vec);
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t base = (size_t)blockIdx.x * blockDim.x + threadIdx.x; base < nVec; base += stride * kUnroll) {
    Vec v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const size_t i = base + u * stride;
      if (i < nVec) v[u] = x[i];
    }
#pragma unroll 1
    for (int k = 0; k < world; ++k) {
      int peer = me + k;
      if (peer >= world) peer -= world;
      Vec* dst = (Vec*)((char*)y_peers[peer] + dst_offset);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const size_t i = base + u * stride;
        if (i < nVec) dst[i] = v[u];
      }
    }
  }

  // Per-source flags instead of an exit barrier: CTA b tells every peer "my slice, part b, has landed".
  __syncthreads();
  if (threadIdx.x < world) {
    __threadfence_system();
    volatile uint64_t* flag = flags[threadIdx.x] + CUCO_FLAGS_RESERVED + (size_t)me * gridDim.x + blockIdx.x;
    *flag = epoch;
  }
  // The consumer side is missing: nothing waits for flag (src * gridDim.x + b) to reach `epoch` for every
  // source rank src, so this rank's step can end before the peers' slices have arrived in its y.
}
// EVOLVE-BLOCK-END

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  CUCO_CHECK_ABI(ctx);
  const int64_t n = cuco_param(ctx, "N_PER_RANK");
  const cuco_tensor_t* x = cuco_tensor(ctx, "x");
  const cuco_tensor_t* y = cuco_tensor(ctx, "y");
  if (n <= 0 || x == NULL || y == NULL || y->peers == NULL || ctx->flags.peers == NULL) return CUCO_ERR_PARAM;
  const size_t slice_bytes = (size_t)n * kElemBytes;
  if (slice_bytes % kVecBytes != 0) return CUCO_ERR_PARAM;
  if (x->valid_bytes < slice_bytes || y->capacity_bytes < (size_t)ctx->world_size * slice_bytes)
    return CUCO_ERR_PARAM;
  if (ctx->world_size > kThreads || ctx->flags.count < CUCO_FLAGS_RESERVED + (size_t)ctx->world_size * kBlocks)
    return CUCO_ERR_PARAM;
  AllGatherState* st = new AllGatherState();
  st->slice_bytes = slice_bytes;
  ctx->user = st;
  return CUCO_OK;
}

CUCO_EXPORT int cuco_step(cuco_ctx_t* ctx) {
  AllGatherState* st = (AllGatherState*)ctx->user;
  const cuco_tensor_t* x = cuco_tensor(ctx, "x");
  const cuco_tensor_t* y = cuco_tensor(ctx, "y");
  // EVOLVE-BLOCK-START launch
  allgather_push<<<kBlocks, kThreads, 0, ctx->stream>>>(y->peers, (const Vec*)x->local, st->slice_bytes / sizeof(Vec),
                                                          ctx->flags.peers, ctx->rank, ctx->world_size, ctx->epoch);
  // EVOLVE-BLOCK-END
  CUCO_CUDA_TRY(cudaGetLastError());
  return CUCO_OK;
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) {
  delete (AllGatherState*)ctx->user;
  ctx->user = NULL;
  return CUCO_OK;
}
