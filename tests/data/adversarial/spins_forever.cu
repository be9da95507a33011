/*
 * ADVERSARIAL candidate for sample_kernels/allgather (test data: it must never be scored).
 *
 * spins_forever: a kernel that never ends, in a spin of its own.
 * Cheat (or bug): after the all-gather each CTA spins, in a loop it writes itself (not the runtime's cuco_wait),
 * for an acknowledgement flag that no rank ever sets. The step never completes; the harness must not wait for it.
 *
 * Expected: L2, the watchdog ends the step (timeout: max(2 s, 50x the seed's step)). The runtime's waits are told
 * to give up first, but this spin is not one of them: the rank processes' group is killed and the worker
 * recycled; the search goes on. (The same wait through cuco_wait ends without a restart: waits_on_unraised_flag.cu.)
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
  ncclDevComm devComm;
  size_t slice_bytes;  // this rank's x, and each slice of y
};

// EVOLVE-BLOCK-START kernel
__global__ void __launch_bounds__(kThreads)
allgather_push(ncclDevComm devComm, ncclWindow_t yWin, const Vec* __restrict__ x, size_t nVec,
               uint64_t* const* flags) {
  ncclLsaBarrierSession<ncclCoopCta> bar(ncclCoopCta(), devComm, ncclTeamTagLsa{}, blockIdx.x);
  bar.sync(ncclCoopCta(), cuda::memory_order_relaxed);

  const int me = devComm.lsaRank;
  const int world = devComm.lsaSize;
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
      Vec* dst = (Vec*)ncclGetLsaPointer(yWin, dst_offset, peer);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const size_t i = base + u * stride;
        if (i < nVec) dst[i] = v[u];
      }
    }
  }

  bar.sync(ncclCoopCta(), cuda::memory_order_acq_rel);

  // Wait for an acknowledgement nobody ever sends, in a spin of its own: the flag never reaches 1 << 62, the
  // kernel never ends.
  if (threadIdx.x == 0) {
    cuda::atomic_ref<const uint64_t, cuda::thread_scope_system> ack(*cuco_user_flag(flags, me, 0));
    while (ack.load(cuda::memory_order_acquire) < (1ull << 62)) {
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
  if (n <= 0 || x == NULL || y == NULL || cuco_window(y) == NULL) return CUCO_ERR_PARAM;
  const size_t slice_bytes = (size_t)n * kElemBytes;
  if (slice_bytes % kVecBytes != 0) return CUCO_ERR_PARAM;
  if (x->valid_bytes < slice_bytes || y->capacity_bytes < (size_t)ctx->world_size * slice_bytes)
    return CUCO_ERR_PARAM;

  AllGatherState* st = new AllGatherState();
  st->slice_bytes = slice_bytes;
  int rc = cuco_devcomm_create(ctx, kBlocks, &st->devComm);
  if (rc == CUCO_OK && ncclTeamLsa(st->devComm).nRanks != ctx->world_size) {
    cuco_devcomm_destroy(ctx, &st->devComm);
    rc = CUCO_ERR_BACKEND;
  }
  if (rc != CUCO_OK) {
    delete st;
    return rc;
  }
  ctx->user = st;
  return CUCO_OK;
}

CUCO_EXPORT int cuco_step(cuco_ctx_t* ctx) {
  AllGatherState* st = (AllGatherState*)ctx->user;
  const cuco_tensor_t* x = cuco_tensor(ctx, "x");
  const cuco_tensor_t* y = cuco_tensor(ctx, "y");
  // EVOLVE-BLOCK-START launch
  allgather_push<<<kBlocks, kThreads, 0, ctx->stream>>>(st->devComm, cuco_window(y), (const Vec*)x->local,
                                                          st->slice_bytes / sizeof(Vec), ctx->flags.peers);
  // EVOLVE-BLOCK-END
  CUCO_CUDA_TRY(cudaGetLastError());
  return CUCO_OK;
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) {
  AllGatherState* st = (AllGatherState*)ctx->user;
  if (st == NULL) return CUCO_OK;
  const int rc = cuco_devcomm_destroy(ctx, &st->devComm);
  delete st;
  ctx->user = NULL;
  return rc;
}
