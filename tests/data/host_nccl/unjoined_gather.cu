// unjoined_gather.cu — WRONG on purpose (gpu tier: tests/gpu/test_host_nccl_symm_gpu.py): gemm_allgather's host
// NCCL seed with the all-gather moved to a side stream, and the GEMM left on ctx->stream WITHOUT waiting for it.
// The side stream is joined back only after the GEMM, so the ABI's capture check passes, but the GEMM reads
// whatever xg held before the gather landed (zeros on the first trial, the previous trial's rows later): L2 must
// fail it on its outputs. The right version waits (cuco_side_stream_join) before the GEMM.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <nccl.h>

#include "cuco_abi.h"
#include "cuco_errors.h"
#include "cuco_side_stream.h"
#include "gemm_host.cuh"  // sample_kernels/gemm_allgather: build.for_workload puts it on the include path

namespace {

struct State : gemm_ag::Operands {
  cuco_side_stream_t side;
};

}  // namespace

CUCO_EXPORT int cuco_declare_scratch(const cuco_ctx_t* ctx, cuco_scratch_request_t* req, int max_req) {
  return gemm_ag::GatheredX{ctx}.declare(req, max_req);
}

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  CUCO_CHECK_ABI(ctx);
  if (ctx->nccl_comm == nullptr || ctx->cublas == nullptr) return CUCO_ERR_BACKEND;
  State* s = new State();
  ctx->user = s;
  CUCO_TRY(s->open(ctx, 1));
  return cuco_side_stream_create(&s->side);
}

CUCO_EXPORT int cuco_step(cuco_ctx_t* ctx) {
  State& s = *(State*)ctx->user;
  ncclComm_t comm = (ncclComm_t)ctx->nccl_comm;
  CUCO_TRY(cuco_side_stream_fork(&s.side, ctx->stream));
  CUCO_NCCL_TRY(comm, ncclAllGather(s.x, s.xg, (size_t)s.rows_per_rank * s.K, ncclBfloat16, comm, s.side.stream));
  cublasHandle_t h = (cublasHandle_t)ctx->cublas;
  CUCO_CUBLAS_TRY(cublasSetStream(h, ctx->stream));
  CUCO_TRY(s.gemm_rows(h, s.xg, 0, s.M));  // BUG: xg is still being gathered on the side stream
  return cuco_side_stream_join(&s.side, ctx->stream);
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) {
  State* s = (State*)ctx->user;
  if (s == nullptr) return CUCO_OK;
  cuco_side_stream_destroy(&s->side);
  delete s;
  ctx->user = nullptr;
  return CUCO_OK;
}
