/*
 * ADVERSARIAL candidate for sample_kernels/allgather (test data: it must never be scored).
 *
 * raw_flag_before_stores: flag_before_stores.cu written without the runtime's signalling primitives, as a
 * candidate that rolled its own flags might be: every CTA raises its arrival flag on every peer with a raw
 * `cuda::atomic_ref` release store BEFORE it stores the data the flag covers, and the consumer spins on raw
 * acquire loads until every (source, CTA) flag of this step has arrived. A release orders what came before it,
 * nothing after: the peer's stores into this rank's y can still be on the way when this rank's stream says
 * "done". No entry barrier either (the harness starts every step after every rank has finished the previous
 * one). Correct at world size 1 (a kernel's end covers its own stores), and whenever the peer's stores happen to
 * land before this rank's snapshot reads them.
 *
 * Why it is here: the stress build cannot pause inside atomics a candidate writes itself, so only the harness's
 * own perturbation can show it: the late rank's start delay makes the consumer wait for the flags and react the
 * moment they arrive, and at the small preset the window (one CTA's share, 64 KiB per peer) is too short, so
 * the race-check size (the workload's smallest preset moving at least 8 MiB per rank) widens it to 1 MiB.
 *
 * Expected: L2, verification fails at world size 2+ (small preset, with its race-check size).
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
using SysFlag = cuda::atomic_ref<uint64_t, cuda::thread_scope_system>;

__global__ void __launch_bounds__(kThreads)
allgather_push(void* const* y_peers, const Vec* __restrict__ x, size_t nVec, uint64_t* const* flags, int me,
               int world, uint64_t epoch) {
  const size_t dst_offset = (size_t)me * nVec * sizeof(Vec);
  const size_t stride = (size_t)gridDim.x * blockDim.x;

  // The bug: announce first, store after.
  for (int peer = threadIdx.x; peer < world; peer += blockDim.x)
    SysFlag(flags[peer][CUCO_FLAGS_RESERVED + (size_t)me * gridDim.x + blockIdx.x])
        .store(epoch, cuda::memory_order_release);

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

  // Consumer: every (source, CTA) flag of this step, raw acquire loads.
  const size_t n_flags = (size_t)world * gridDim.x;
  for (size_t i = threadIdx.x; i < n_flags; i += blockDim.x) {
    cuda::atomic_ref<const uint64_t, cuda::thread_scope_system> f(flags[me][CUCO_FLAGS_RESERVED + i]);
    while (f.load(cuda::memory_order_acquire) < epoch) {
    }
  }
  __syncthreads();
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
  if (ctx->flags.count < CUCO_FLAGS_RESERVED + (size_t)ctx->world_size * kBlocks) return CUCO_ERR_PARAM;
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
