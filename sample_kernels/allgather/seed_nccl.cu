/*
 * All-gather seed, host NCCL form (the fast path's starting point).
 *
 * Data flow: each rank's x (N_PER_RANK bf16) -> ncclAllGather on the harness stream -> y on every rank, rank r's
 * slice at element offset r * N_PER_RANK. NCCL picks the algorithm and the kernel; nothing here is device code.
 * Needs a communicator: NCCL's under the `nccl` backend; under `symm` the harness binds the host API of
 * runtime/symm_nccl/nccl.h, which moves the data through the ranks' shared memory (seed_copy.cu remains the seed
 * `symm` candidates are measured against).
 */
#include <nccl.h>
#include "cuco_abi.h"

static constexpr size_t kElemBytes = 2;  // bf16

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  CUCO_CHECK_ABI(ctx);
  if (ctx->nccl_comm == NULL) return CUCO_ERR_BACKEND;
  const int64_t n = cuco_param(ctx, "N_PER_RANK");
  const cuco_tensor_t* x = cuco_tensor(ctx, "x");
  const cuco_tensor_t* y = cuco_tensor(ctx, "y");
  if (n <= 0 || x == NULL || y == NULL) return CUCO_ERR_PARAM;
  if (x->valid_bytes < (size_t)n * kElemBytes || y->capacity_bytes < (size_t)ctx->world_size * n * kElemBytes)
    return CUCO_ERR_PARAM;
  return CUCO_OK;
}

CUCO_EXPORT int cuco_step(cuco_ctx_t* ctx) {
  const size_t n = (size_t)cuco_param(ctx, "N_PER_RANK");
  const cuco_tensor_t* x = cuco_tensor(ctx, "x");
  cuco_tensor_t* y = cuco_tensor(ctx, "y");
  ncclResult_t r = ncclAllGather(x->local, y->local, n, ncclBfloat16, (ncclComm_t)ctx->nccl_comm, ctx->stream);
  return r == ncclSuccess ? CUCO_OK : CUCO_ERR_NCCL;
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) {
  (void)ctx;
  return CUCO_OK;
}
