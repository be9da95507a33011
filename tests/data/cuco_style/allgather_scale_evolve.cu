// cuco: backends=nccl
// A seed in the candidate ABI marked the way CUCo's and ShinkaEvolve's files are: EVOLVE blocks without names
// (written for cuco-kit's tests). One step all-gathers every rank's x and scales the gathered rows.
#include <cuda_runtime.h>
#include <nccl.h>
#include "cuco_abi.h"

// EVOLVE-BLOCK-START
__global__ void scale_rows(float* y, size_t n, float alpha) {
  const size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n) y[i] *= alpha;
}
// EVOLVE-BLOCK-END

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  CUCO_CHECK_ABI(ctx);
  return ctx->nccl_comm == NULL ? CUCO_ERR_BACKEND : CUCO_OK;
}

CUCO_EXPORT int cuco_step(cuco_ctx_t* ctx) {
  const cuco_tensor_t* x = cuco_tensor(ctx, "x");
  const cuco_tensor_t* y = cuco_tensor(ctx, "y");
  const size_t n = x->capacity_bytes / sizeof(float);
// EVOLVE-BLOCK-START
  if (ncclAllGather(x->local, y->local, n, ncclFloat, (ncclComm_t)ctx->nccl_comm, ctx->stream) != ncclSuccess)
    return CUCO_ERR_NCCL;
  const size_t total = n * ctx->world_size;
  scale_rows<<<(unsigned)((total + 255) / 256), 256, 0, ctx->stream>>>((float*)y->local, total, 0.5f);
// EVOLVE-BLOCK-END
  return CUCO_OK;
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) { return CUCO_OK; }
