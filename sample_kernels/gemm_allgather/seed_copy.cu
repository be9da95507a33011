// seed_copy.cu — GEMM + AllGather, host-driven through the copy engines (the seed where host NCCL cannot run).
// cuco: backends=symm,nccl
//
// Same computation as seed_nccl.cu: tensor parallel Y_r = AllGather(X) @ W_r, bf16 operands, fp32 accumulation.
// With world size W and TOTAL sizes M, N, K:
//
//     x  [M/W, K]   this rank's rows of X           (input tensor "x"; peers' copies via x->peers_host)
//     w  [K, N/W]   this rank's columns of W        (input tensor "w")
//     xg [M, K]     every rank's x, in rank order   (scratch window "xg", gemm_host.cuh)
//     y  [M, N/W]   xg @ w                          (output tensor "y")
//
// Data flow of one step, everything on ctx->stream:
//
//     for q in r, r+1, ..., r-1 (mod W):   x of rank q ──cudaMemcpyAsync (pull)──▶ xg rows [q*M/W, (q+1)*M/W)
//     then                                 xg ──cublasGemmEx──▶ y
//
// Each copy READS a peer's x through the pointer the harness mapped into this process (torch symmetric memory
// under `symm`, NVLink peer mappings under `nccl`) and is done by a DMA copy engine, not by SMs. The copies and
// the GEMM are stream-ordered, so as in seed_nccl.cu nothing overlaps. The harness's pre-step device barrier
// guarantees every rank's x holds this step's inputs before any rank pulls it.
//
// Under `symm` the ranks share one GPU (and one L2): timings say nothing about NVLink. The GEMM is
// gemm_host.cuh's, shared with the other sources; its row-major trick (Y^T = W^T Xg^T in cuBLAS's column-major
// view) is explained in seed_nccl.cu.
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include "cuco_abi.h"
#include "cuco_errors.h"
#include "cuco_state.h"
#include "gemm_host.cuh"  // the workload's shared host code: frozen, on the include path (build.for_workload)

namespace {

struct State : gemm_ag::Operands {
  void* const* x_peers;  // host copy of every rank's x pointer (may be NULL at world size 1)
};

}  // namespace

CUCO_EXPORT int cuco_declare_scratch(const cuco_ctx_t* ctx, cuco_scratch_request_t* req, int max_req) {
  return gemm_ag::GatheredX{ctx}.declare(req, max_req);
}

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  CUCO_CHECK_ABI(ctx);
  if (ctx->cublas == nullptr) return CUCO_ERR_PARAM;
  State s;
  CUCO_TRY(s.open(ctx, 1));
  // Pulling from peers needs their x mapped into this process (not needed for our own shard).
  s.x_peers = cuco_tensor(ctx, "x")->peers_host;
  if (s.world > 1) {
    if (s.x_peers == nullptr) return CUCO_ERR_BACKEND;
    for (int q = 0; q < s.world; ++q)
      if (q != s.rank && s.x_peers[q] == nullptr) return CUCO_ERR_BACKEND;
  }
  cuco_state<State>::open(ctx, s);
  return CUCO_OK;
}

CUCO_EXPORT int cuco_step(cuco_ctx_t* ctx) {
  const State& s = *cuco_state<State>::get(ctx);
  const size_t shard_elems = (size_t)s.rows_per_rank * s.K;
  // 1. Gather by pulling: start with our own shard (a local copy), then the next ranks, so at any moment the
  //    ranks read from different peers instead of all hammering rank 0.
  for (int j = 0; j < s.world; ++j) {
    const int q = (s.rank + j) % s.world;
    const void* src = q == s.rank ? (const void*)s.x : s.x_peers[q];
    CUCO_CUDA_TRY(cudaMemcpyAsync(s.xg + (size_t)q * shard_elems, src, shard_elems * gemm_ag::kBf16Bytes,
                                  cudaMemcpyDefault, ctx->stream));
  }
  // 2. Compute: one GEMM over all M rows, after every copy (same stream).
  cublasHandle_t h = (cublasHandle_t)ctx->cublas;
  CUCO_CUBLAS_TRY(cublasSetStream(h, ctx->stream));
  return s.gemm_rows(h, s.xg, 0, s.M);
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) { return cuco_state<State>::close(ctx); }
