/*
 * ADVERSARIAL candidate for sample_kernels/allgather (test data: it must never be scored).
 *
 * raw_wrong_unit_flag: one arrival flag per source rank, raised with a raw atomicExch_system by the wrong unit:
 * warp 0 of CTA 0, once ITS OWN stores are done (__syncwarp, __threadfence_system), as if it spoke for the
 * whole grid. The consumer spins on volatile loads of every source's flag (then a fence), so it learns that
 * one warp of each peer has finished, nothing about the peer's other warps and CTAs, whose stores into this
 * rank's y may still be in flight when this rank's stream says "done". No runtime primitive and no entry
 * barrier. Correct at world size 1 (the kernel's end covers all of its own stores), and whenever the peer's
 * other CTAs finish no later than its first warp.
 *
 * Why it is here: when every CTA of the peer runs at once they finish together, so the flag is right by luck;
 * it shows when the peer's CTAs start at different times. The stress build cannot arrange that for raw code;
 * the harness's interference kernel does: on the late rank it holds the SMs for a random time, so CTA 0 gets
 * an SM (and raises the flag) while the later CTAs are still waiting for one.
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

  // Warp 0 of CTA 0 speaks for every warp of every CTA of this rank: the flag covers its own stores only.
  if (blockIdx.x == 0 && threadIdx.x < 32) {
    __syncwarp();
    __threadfence_system();
    for (int peer = threadIdx.x; peer < world; peer += 32)
      atomicExch_system((unsigned long long*)(flags[peer] + CUCO_FLAGS_RESERVED + me), (unsigned long long)epoch);
  }
  // Consumer: one flag per source rank.
  for (int src = threadIdx.x; src < world; src += blockDim.x) {
    volatile const uint64_t* flag = flags[me] + CUCO_FLAGS_RESERVED + src;
    while (*flag < epoch) {
    }
  }
  __threadfence();
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
  if (ctx->flags.count < CUCO_FLAGS_RESERVED + (size_t)ctx->world_size) return CUCO_ERR_PARAM;
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
