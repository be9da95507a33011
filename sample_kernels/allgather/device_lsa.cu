/*
 * All-gather, device-initiated baseline in NCCL-LSA form (the search's starting point; same source under the
 * `nccl` backend over NVLink and under `symm` through lsa_compat.h).
 *
 * Data flow: PUSH. Each CTA takes a grid-stride share of this rank's x, loads it once into registers (kUnroll
 * vectors of kVecBytes in flight per thread) and stores it into EVERY rank's y window at element offset
 * rank * N_PER_RANK, its own included, through ncclGetLsaPointer. Peers are visited starting from this rank
 * and rotating, so ranks do not all hammer rank 0 at once.
 *
 * Synchronisation: one LSA barrier per CTA index (lsaBarrierCount = kBlocks); CTA b of every rank pairs with
 * CTA b of every peer.
 *   entry  sync(relaxed):  every peer has left its previous step, so its y may be overwritten.
 *   exit   sync(acq_rel):  release publishes this CTA's stores to the peers; acquire makes the peers' CTA-b
 *                          stores into our y visible. Once every CTA of the grid is past it, every peer's
 *                          slice has landed in our y, so the kernel's end on ctx->stream means y is complete.
 *
 * Requires N_PER_RANK * 2 bytes to be a multiple of kVecBytes (vector stores need aligned slice offsets) and
 * every rank to be load/store reachable (LSA team == world).
 */
#include "cuco_lsa.h"

// EVOLVE-BLOCK-START knobs
// CTAs of the push kernel (also the number of LSA barriers: CTA b pairs with CTA b of every peer).
constexpr int kBlocks = 32;  // knob: range 4..64 step 4
// Threads per CTA (whole warps).
constexpr int kThreads = 512;  // knob: range 128..1024 step 128
// Bytes per vector load / store.
constexpr int kVecBytes = 16;  // knob: {4, 8, 16}
// Vectors each thread keeps in flight before storing them to every peer.
constexpr int kUnroll = 2;  // knob: pow2 1..4
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
  bool dc_made;

  // Free what setup made (also after a failed setup); cuco_state<AllGatherState>::close calls it.
  int release(cuco_ctx_t* ctx) { return dc_made ? cuco_devcomm_destroy(ctx, &devComm) : CUCO_OK; }
};

// EVOLVE-BLOCK-START kernel
__global__ void __launch_bounds__(kThreads)
allgather_push(ncclDevComm devComm, ncclWindow_t yWin, const Vec* __restrict__ x, size_t nVec) {
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

  AllGatherState* st = cuco_state<AllGatherState>::open(ctx);
  st->slice_bytes = slice_bytes;
  const int rc = cuco_devcomm_create_lsa_world(ctx, kBlocks, &st->devComm);  // every peer's y reachable
  st->dc_made = rc == CUCO_OK;
  return cuco_state<AllGatherState>::settle(ctx, rc);
}

CUCO_EXPORT int cuco_step(cuco_ctx_t* ctx) {
  AllGatherState* st = cuco_state<AllGatherState>::get(ctx);
  const cuco_tensor_t* x = cuco_tensor(ctx, "x");
  const cuco_tensor_t* y = cuco_tensor(ctx, "y");
  // EVOLVE-BLOCK-START launch
  allgather_push<<<kBlocks, kThreads, 0, ctx->stream>>>(st->devComm, cuco_window(y), (const Vec*)x->local,
                                                          st->slice_bytes / sizeof(Vec));
  // EVOLVE-BLOCK-END
  CUCO_CUDA_TRY(cudaGetLastError());
  return CUCO_OK;
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) { return cuco_state<AllGatherState>::close(ctx); }
