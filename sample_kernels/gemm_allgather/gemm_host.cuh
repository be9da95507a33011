// gemm_host.cuh — host code the three gemm_allgather sources share: the gathered-X scratch window "xg", this
// rank's operands as the candidate ABI hands them over, and the cuBLAS GEMM of gathered rows into y.
//
//   GatheredX{ctx}.declare(req, max_req)   cuco_declare_scratch's body: the window "xg", M x K bf16, every rank
//   Operands::open(ctx, chunks)            check the parameters, tensors and "xg"; a source's State derives from
//                                          Operands (or is one)
//   Operands::gemm_rows(handle, a, r0, n)  y rows [r0, r0 + n) = a @ w on the handle's stream
//
// The sources #include it: build.for_workload puts a workload's folder on the include path when it ships *.cuh
// headers and hashes them into the build cache key. For the search it is frozen library code (outside every
// candidate's EVOLVE blocks); how X is gathered and when each GEMM may start stay in each source. What the sources
// call here are member functions: L0 accepts those from EVOLVE blocks, and the fast path's L0 (which checks every
// line of a rewritten seed) anywhere.
#ifndef GEMM_HOST_CUH_
#define GEMM_HOST_CUH_

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <string.h>

#include "cuco_abi.h"
#include "cuco_errors.h"

namespace gemm_ag {

constexpr int kBf16Bytes = 2;

// The gathered X: every rank's x in rank order, M x K bf16, one symmetric window "xg" on every rank.
struct GatheredX {
  const cuco_ctx_t* ctx;

  // Its bytes for ctx's parameters; 0 when M or K is missing.
  size_t bytes() const {
    const int64_t M = cuco_param(ctx, "M"), K = cuco_param(ctx, "K");
    if (M <= 0 || K <= 0) return 0;
    return (size_t)M * (size_t)K * kBf16Bytes;
  }

  // cuco_declare_scratch's body: one request (none when M or K is missing: setup then reports CUCO_ERR_PARAM).
  int declare(cuco_scratch_request_t* req, int max_req) const {
    const size_t n = bytes();
    if (max_req < 1 || n == 0) return 0;
    memset(&req[0], 0, sizeof(req[0]));
    strncpy(req[0].name, "xg", CUCO_NAME_LEN - 1);
    req[0].bytes = n;
    return 1;
  }
};

// A tensor the workload promises: bf16, 2-D, [rows, cols].
inline bool tensor_ok(const cuco_tensor_t* t, int64_t rows, int64_t cols) {
  return t != nullptr && t->dtype == CUCO_DTYPE_BF16 && t->ndim == 2 && t->shape[0] == rows &&
         t->shape[1] == cols && t->local != nullptr &&
         t->capacity_bytes >= (size_t)rows * (size_t)cols * kBf16Bytes;
}

// This rank's share of Y = AllGather(X) @ W (workload.py). World size W, TOTAL sizes M, N, K, Nr = N/W columns
// and rows_per_rank = M/W rows per rank:
//   x [M/W, K], w [K, Nr], y [M, Nr] (tensors), xg [M, K] (the window; rank q's x at rows q*M/W), all row-major.
struct Operands {
  int M, Nr, K, rank, world, rows_per_rank;
  const __nv_bfloat16* x;
  const __nv_bfloat16* w;
  __nv_bfloat16* y;
  __nv_bfloat16* xg;

  // Reads the sizes, every shard split into `chunks` whole chunks, and the tensors and "xg" window above.
  // CUCO_ERR_PARAM when one is missing or too small, or the split is uneven. (The cuBLAS handle is the caller's
  // check.)
  int open(cuco_ctx_t* ctx, int chunks) {
    const int64_t m = cuco_param(ctx, "M"), n = cuco_param(ctx, "N"), k = cuco_param(ctx, "K");
    const int64_t ranks = ctx->world_size;
    if (m <= 0 || n <= 0 || k <= 0 || ranks < 1 || chunks < 1 || n % ranks != 0 || m % (ranks * chunks) != 0)
      return CUCO_ERR_PARAM;
    const cuco_tensor_t* tx = cuco_tensor(ctx, "x");
    const cuco_tensor_t* tw = cuco_tensor(ctx, "w");
    const cuco_tensor_t* ty = cuco_tensor(ctx, "y");
    const cuco_tensor_t* txg = cuco_scratch(ctx, "xg");
    if (!tensor_ok(tx, m / ranks, k) || !tensor_ok(tw, k, n / ranks) || !tensor_ok(ty, m, n / ranks))
      return CUCO_ERR_PARAM;
    if (txg == nullptr || txg->local == nullptr || txg->capacity_bytes < GatheredX{ctx}.bytes())
      return CUCO_ERR_PARAM;
    M = (int)m;
    Nr = (int)(n / ranks);
    K = (int)k;
    rank = ctx->rank;
    world = (int)ranks;
    rows_per_rank = (int)(m / ranks);
    x = (const __nv_bfloat16*)tx->local;
    w = (const __nv_bfloat16*)tw->local;
    y = (__nv_bfloat16*)ty->local;
    xg = (__nv_bfloat16*)txg->local;
    return CUCO_OK;
  }

  // Y rows [row0, row0 + rows) = A (rows x K, row-major, ld K) @ w, on the handle's stream, as the column-major
  // Y^T = W^T A^T (seed_nccl.cu's header explains the transposes):
  // cublasGemmEx(N, N, m = Nr, n = rows, k = K, A = w (ld Nr), B = a (ld K), C = y + row0 * Nr (ld Nr)).
  int gemm_rows(cublasHandle_t handle, const __nv_bfloat16* a, int row0, int rows) const {
    const float one = 1.0f, zero = 0.0f;
    CUCO_CUBLAS_TRY(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, Nr, rows, K, &one, w, CUDA_R_16BF, Nr, a,
                                 CUDA_R_16BF, K, &zero, y + (size_t)row0 * Nr, CUDA_R_16BF, Nr, CUBLAS_COMPUTE_32F,
                                 CUBLAS_GEMM_DEFAULT));
    return CUCO_OK;
  }
};

}  // namespace gemm_ag

#endif  // GEMM_HOST_CUH_
