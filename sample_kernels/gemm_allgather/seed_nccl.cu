// seed_nccl.cu — GEMM + AllGather, the host-driven baseline (the CUCo paper's starting point).
//
// Tensor parallel Y_r = AllGather(X) @ W_r, bf16 operands, fp32 accumulation. With world size W and TOTAL sizes
// M, N, K (workload parameters):
//
//     x  [M/W, K]   this rank's rows of X           (input tensor "x")
//     w  [K, N/W]   this rank's columns of W        (input tensor "w")
//     xg [M, K]     every rank's x, in rank order   (scratch window "xg", gemm_host.cuh)
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
// cublasGemmEx(N, N, m=N/W, n=rows, k=K, A=w (ld N/W), B=xg (ld K), C=y (ld N/W)). That GEMM, the operands'
// checks and the "xg" request are gemm_host.cuh's, shared with the other sources.
//
// Host NCCL needs a communicator (ctx->nccl_comm): NCCL's under `nccl`; under `symm` the harness binds the host API
// of runtime/symm_nccl/nccl.h, over the ranks' shared memory (seed_copy.cu remains the `symm` seed candidates are
// measured against).
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <nccl.h>

#include "cuco_abi.h"
#include "cuco_errors.h"
#include "cuco_state.h"
#include "gemm_host.cuh"  // the workload's shared host code: frozen, on the include path (build.for_workload)

// The gathered X needs a symmetric window on every rank (registered windows also let NCCL pick its symmetric
// all-gather kernels).
CUCO_EXPORT int cuco_declare_scratch(const cuco_ctx_t* ctx, cuco_scratch_request_t* req, int max_req) {
  return gemm_ag::GatheredX{ctx}.declare(req, max_req);
}

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  CUCO_CHECK_ABI(ctx);
  if (ctx->nccl_comm == nullptr) return CUCO_ERR_BACKEND;
  if (ctx->cublas == nullptr) return CUCO_ERR_PARAM;
  gemm_ag::Operands op;
  CUCO_TRY(op.open(ctx, 1));
  cuco_state<gemm_ag::Operands>::open(ctx, op);
  return CUCO_OK;
}

CUCO_EXPORT int cuco_step(cuco_ctx_t* ctx) {
  const gemm_ag::Operands& s = *cuco_state<gemm_ag::Operands>::get(ctx);
  // 1. Gather: rank q's x lands at rows [q*M/W, (q+1)*M/W) of every rank's xg.
  const size_t shard_elems = (size_t)s.rows_per_rank * s.K;
  ncclComm_t comm = (ncclComm_t)ctx->nccl_comm;
  CUCO_NCCL_TRY(comm, ncclAllGather(s.x, s.xg, shard_elems, ncclBfloat16, comm, ctx->stream));
  // 2. Compute: one GEMM over all M rows, stream-ordered after the gather.
  cublasHandle_t h = (cublasHandle_t)ctx->cublas;
  CUCO_CUBLAS_TRY(cublasSetStream(h, ctx->stream));
  return s.gemm_rows(h, s.xg, 0, s.M);
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) { return cuco_state<gemm_ag::Operands>::close(ctx); }
