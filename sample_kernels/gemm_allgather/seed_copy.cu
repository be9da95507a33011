// seed_copy.cu — GEMM + AllGather, host-driven through the copy engines (the seed where host NCCL cannot run).
// cuco: backends=symm,nccl
//
// Same computation as seed_nccl.cu: tensor parallel Y_r = AllGather(X) @ W_r, bf16 operands, fp32 accumulation.
// With world size W and TOTAL sizes M, N, K:
//
//     x  [M/W, K]   this rank's rows of X           (input tensor "x"; peers' copies via x->peers_host)
//     w  [K, N/W]   this rank's columns of W        (input tensor "w")
//     xg [M, K]     every rank's x, in rank order   (scratch window "xg", declared below)
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
// Under `symm` the ranks share one GPU (and one L2): timings say nothing about NVLink. The row-major GEMM
// trick (Y^T = W^T Xg^T in cuBLAS's column-major view) is explained in seed_nccl.cu.
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include "cuco_abi.h"

namespace {

constexpr int kBf16Bytes = 2;

struct State {
  int M, Nr, K, rows_per_rank, rank, world;
  const void* x_local;
  void* const* x_peers;  // host copy of every rank's x pointer (may be NULL at world size 1)
  const __nv_bfloat16* w;
  __nv_bfloat16* y;
  __nv_bfloat16* xg;
};

bool tensor_ok(const cuco_tensor_t* t, int64_t rows, int64_t cols) {
  return t != nullptr && t->dtype == CUCO_DTYPE_BF16 && t->ndim == 2 && t->shape[0] == rows &&
         t->shape[1] == cols && t->local != nullptr &&
         t->capacity_bytes >= (size_t)rows * (size_t)cols * kBf16Bytes;
}

int gemm_rows(cublasHandle_t h, const State& s, const __nv_bfloat16* a, int row0, int rows) {
  const float one = 1.0f, zero = 0.0f;
  cublasStatus_t st = cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, s.Nr, rows, s.K, &one, s.w, CUDA_R_16BF, s.Nr,
                                   a, CUDA_R_16BF, s.K, &zero, s.y + (size_t)row0 * s.Nr, CUDA_R_16BF, s.Nr,
                                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  return st == CUBLAS_STATUS_SUCCESS ? CUCO_OK : CUCO_ERR_CUBLAS;
}

}  // namespace

CUCO_EXPORT int cuco_declare_scratch(const cuco_ctx_t* ctx, cuco_scratch_request_t* req, int max_req) {
  const int64_t M = cuco_param(ctx, "M"), K = cuco_param(ctx, "K");
  if (max_req < 1 || M <= 0 || K <= 0) return 0;  // setup then reports CUCO_ERR_PARAM
  memset(&req[0], 0, sizeof(req[0]));
  strncpy(req[0].name, "xg", CUCO_NAME_LEN - 1);
  req[0].bytes = (size_t)M * (size_t)K * kBf16Bytes;
  return 1;
}

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  CUCO_CHECK_ABI(ctx);
  if (ctx->cublas == nullptr) return CUCO_ERR_PARAM;
  const int64_t M = cuco_param(ctx, "M"), N = cuco_param(ctx, "N"), K = cuco_param(ctx, "K");
  const int W = ctx->world_size;
  if (M <= 0 || N <= 0 || K <= 0 || W < 1 || M % W != 0 || N % W != 0) return CUCO_ERR_PARAM;
  cuco_tensor_t* x = cuco_tensor(ctx, "x");
  cuco_tensor_t* w = cuco_tensor(ctx, "w");
  cuco_tensor_t* y = cuco_tensor(ctx, "y");
  cuco_tensor_t* xg = cuco_scratch(ctx, "xg");
  if (!tensor_ok(x, M / W, K) || !tensor_ok(w, K, N / W) || !tensor_ok(y, M, N / W)) return CUCO_ERR_PARAM;
  if (xg == nullptr || xg->local == nullptr || xg->capacity_bytes < (size_t)M * (size_t)K * kBf16Bytes)
    return CUCO_ERR_PARAM;
  // Pulling from peers needs their x mapped into this process (not needed for our own shard).
  if (W > 1) {
    if (x->peers_host == nullptr) return CUCO_ERR_BACKEND;
    for (int q = 0; q < W; ++q)
      if (q != ctx->rank && x->peers_host[q] == nullptr) return CUCO_ERR_BACKEND;
  }

  State* s = new State;
  s->M = (int)M;
  s->Nr = (int)(N / W);
  s->K = (int)K;
  s->rows_per_rank = (int)(M / W);
  s->rank = ctx->rank;
  s->world = W;
  s->x_local = x->local;
  s->x_peers = x->peers_host;
  s->w = (const __nv_bfloat16*)w->local;
  s->y = (__nv_bfloat16*)y->local;
  s->xg = (__nv_bfloat16*)xg->local;
  ctx->user = s;
  return CUCO_OK;
}

CUCO_EXPORT int cuco_step(cuco_ctx_t* ctx) {
  const State& s = *(const State*)ctx->user;
  const size_t shard_elems = (size_t)s.rows_per_rank * s.K;
  // 1. Gather by pulling: start with our own shard (a local copy), then the next ranks, so at any moment the
  //    ranks read from different peers instead of all hammering rank 0.
  for (int j = 0; j < s.world; ++j) {
    const int q = (s.rank + j) % s.world;
    const void* src = q == s.rank ? s.x_local : s.x_peers[q];
    if (cudaMemcpyAsync(s.xg + (size_t)q * shard_elems, src, shard_elems * kBf16Bytes,
                        cudaMemcpyDefault, ctx->stream) != cudaSuccess)
      return CUCO_ERR_CUDA;
  }
  // 2. Compute: one GEMM over all M rows, after every copy (same stream).
  cublasHandle_t h = (cublasHandle_t)ctx->cublas;
  if (cublasSetStream(h, ctx->stream) != CUBLAS_STATUS_SUCCESS) return CUCO_ERR_CUBLAS;
  return gemm_rows(h, s, s.xg, 0, s.M);
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) {
  delete (State*)ctx->user;
  ctx->user = nullptr;
  return CUCO_OK;
}
