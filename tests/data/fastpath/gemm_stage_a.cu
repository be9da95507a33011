// seed_nccl.cu — GEMM + AllGather, the host-driven baseline (the CUCo paper's starting point).
// cuco: backends=nccl
//
// Tensor parallel Y_r = AllGather(X) @ W_r, bf16 operands, fp32 accumulation. With world size W and TOTAL sizes
// M, N, K (workload parameters):
//
//     x  [M/W, K]   this rank's rows of X           (input tensor "x")
//     w  [K, N/W]   this rank's columns of W        (input tensor "w")
//     xg [M, K]     every rank's x, in rank order   (scratch window "xg", declared below)
//     y  [M, N/W]   xg @ w                          (output tensor "y")
//
// Data flow of one step, everything on the harness stream ctx->stream:
//
//     rank r:  x ──ncclAllGather──▶ xg ──cublasGemmEx──▶ y
//                  (all ranks' x land      (one GEMM over all
//                   in xg, rank order)      M rows, tensor cores)
//
// Communication and compute are strictly serial: the GEMM cannot start before the last byte of the all-gather
// has arrived, and the GPU's copy/NVLink bandwidth sits idle while the GEMM runs. That gap is what the
// device-initiated baseline (device_lsa.cu) and the search try to close.
//
// cuBLAS is column-major; our matrices are row-major. A row-major [R, C] matrix is the column-major [C, R]
// matrix (its transpose), so Y = Xg @ W (row-major) is computed as the column-major product Y^T = W^T Xg^T:
// cublasGemmEx(N, N, m=N/W, n=rows, k=K, A=w (ld N/W), B=xg (ld K), C=y (ld N/W)).
//
// Host NCCL needs the `nccl` backend (ctx->nccl_comm); under `symm` there is no communicator and setup answers
// CUCO_ERR_BACKEND — seed_copy.cu is the seed there.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <nccl.h>

#include "cuco_lsa.h"

namespace {

constexpr int kBf16Bytes = 2;
constexpr int kPushBlocks = 32;  // LSA barriers the device-initiated gather will need

struct State {
  int M, Nr, K, rows_per_rank;
  const __nv_bfloat16* x;
  const __nv_bfloat16* w;
  __nv_bfloat16* y;
  __nv_bfloat16* xg;
  ncclDevComm devComm;  // created in setup; the gather still runs on the host in Stage A
};

// Check a tensor the workload promises: bf16, 2-D, the expected shape.
bool tensor_ok(const cuco_tensor_t* t, int64_t rows, int64_t cols) {
  return t != nullptr && t->dtype == CUCO_DTYPE_BF16 && t->ndim == 2 && t->shape[0] == rows &&
         t->shape[1] == cols && t->local != nullptr &&
         t->capacity_bytes >= (size_t)rows * (size_t)cols * kBf16Bytes;
}

// A non-blocking communicator (the harness makes them so a failing rank can abort the others) may answer
// ncclInProgress for an enqueued collective; poll until it settles.
ncclResult_t settle(ncclComm_t comm, ncclResult_t r) {
  while (r == ncclInProgress) {
    if (ncclCommGetAsyncError(comm, &r) != ncclSuccess) return ncclSystemError;
  }
  return r;
}

// Y rows [row0, row0 + rows) = A (rows x K, row-major, ld K) @ W (K x Nr); see the header for the transposes.
int gemm_rows(cublasHandle_t h, const State& s, const __nv_bfloat16* a, int row0, int rows) {
  const float one = 1.0f, zero = 0.0f;
  cublasStatus_t st = cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, s.Nr, rows, s.K, &one, s.w, CUDA_R_16BF, s.Nr,
                                   a, CUDA_R_16BF, s.K, &zero, s.y + (size_t)row0 * s.Nr, CUDA_R_16BF, s.Nr,
                                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  return st == CUBLAS_STATUS_SUCCESS ? CUCO_OK : CUCO_ERR_CUBLAS;
}

}  // namespace

// The gathered X needs a symmetric window on every rank (registered windows also let NCCL pick its symmetric
// all-gather kernels).
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
  if (ctx->backend != CUCO_BACKEND_NCCL || ctx->nccl_comm == nullptr) return CUCO_ERR_BACKEND;
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

  State* s = new State;
  s->M = (int)M;
  s->Nr = (int)(N / W);
  s->K = (int)K;
  s->rows_per_rank = (int)(M / W);
  s->x = (const __nv_bfloat16*)x->local;
  s->w = (const __nv_bfloat16*)w->local;
  s->y = (__nv_bfloat16*)y->local;
  s->xg = (__nv_bfloat16*)xg->local;
  const int rc = cuco_devcomm_create(ctx, kPushBlocks, &s->devComm);
  if (rc != CUCO_OK) {
    delete s;
    return rc;
  }
  ctx->user = s;
  return CUCO_OK;
}

CUCO_EXPORT int cuco_step(cuco_ctx_t* ctx) {
  const State& s = *(const State*)ctx->user;
  // 1. Gather: rank q's x lands at rows [q*M/W, (q+1)*M/W) of every rank's xg.
  const size_t shard_elems = (size_t)s.rows_per_rank * s.K;
  ncclComm_t comm = (ncclComm_t)ctx->nccl_comm;
  if (settle(comm, ncclAllGather(s.x, s.xg, shard_elems, ncclBfloat16, comm, ctx->stream)) != ncclSuccess)
    return CUCO_ERR_NCCL;
  // 2. Compute: one GEMM over all M rows, stream-ordered after the gather.
  cublasHandle_t h = (cublasHandle_t)ctx->cublas;
  if (cublasSetStream(h, ctx->stream) != CUBLAS_STATUS_SUCCESS) return CUCO_ERR_CUBLAS;
  return gemm_rows(h, s, s.xg, 0, s.M);
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) {
  State* s = (State*)ctx->user;
  if (s == nullptr) return CUCO_OK;
  const int rc = cuco_devcomm_destroy(ctx, &s->devComm);
  delete s;
  ctx->user = nullptr;
  return rc;
}
