// cublas_alone.cu — the compute bound of GEMM + AllGather at world size 1, measured by the same harness.
// cuco: backends=nccl,symm
//
// At world size 1 there is nothing to gather: x is the whole X [M, K], so y = x @ w is the entire step. This is
// the same cublasGemmEx call the samples make (bf16 in/out, fp32 compute, row-major via the transpose trick),
// with no window, flag, stream or devComm machinery, so "device variant / cublas_alone" measures what the
// co-design machinery costs. Valid at world size 1 only (setup refuses more ranks).
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include "cuco_abi.h"

namespace {
struct State {
  int M, N, K;
  const __nv_bfloat16 *x, *w;
  __nv_bfloat16* y;
};
}  // namespace

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  CUCO_CHECK_ABI(ctx);
  if (ctx->world_size != 1 || ctx->cublas == nullptr) return CUCO_ERR_PARAM;
  cuco_tensor_t* x = cuco_tensor(ctx, "x");
  cuco_tensor_t* w = cuco_tensor(ctx, "w");
  cuco_tensor_t* y = cuco_tensor(ctx, "y");
  if (x == nullptr || w == nullptr || y == nullptr) return CUCO_ERR_PARAM;
  State* s = new State{(int)cuco_param(ctx, "M"), (int)cuco_param(ctx, "N"), (int)cuco_param(ctx, "K"),
                       (const __nv_bfloat16*)x->local, (const __nv_bfloat16*)w->local, (__nv_bfloat16*)y->local};
  ctx->user = s;
  return CUCO_OK;
}

CUCO_EXPORT int cuco_step(cuco_ctx_t* ctx) {
  const State& s = *(const State*)ctx->user;
  cublasHandle_t h = (cublasHandle_t)ctx->cublas;
  if (cublasSetStream(h, ctx->stream) != CUBLAS_STATUS_SUCCESS) return CUCO_ERR_CUBLAS;
  const float one = 1.0f, zero = 0.0f;
  cublasStatus_t st = cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, s.N, s.M, s.K, &one, s.w, CUDA_R_16BF, s.N, s.x,
                                   CUDA_R_16BF, s.K, &zero, s.y, CUDA_R_16BF, s.N, CUBLAS_COMPUTE_32F,
                                   CUBLAS_GEMM_DEFAULT);
  return st == CUBLAS_STATUS_SUCCESS ? CUCO_OK : CUCO_ERR_CUBLAS;
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) {
  delete (State*)ctx->user;
  ctx->user = nullptr;
  return CUCO_OK;
}
