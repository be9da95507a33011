/*
 * All-gather seed, copy-engine form: the reference point for `symm` (where host NCCL cannot run) and a
 * second seed under `nccl`.
 *
 * Data flow: PULL. For every rank r, one peer cudaMemcpyAsync on the harness stream copies rank r's x (through
 * the host-side peer table, x->peers_host[r]) into this rank's y at element offset r * N_PER_RANK. The copy
 * engines move the data; no kernel, no flags.
 *
 * Ordering, and why no barrier is needed here: the harness fills every rank's x, then runs a host barrier and
 * a device barrier before cuco_step, so all peers' x are complete before any copy starts. Each rank writes
 * only its OWN y, so no peer can observe a half-written buffer. After the step the harness synchronises every
 * rank's stream and host-barriers again before it refills any x, so no rank overwrites an x a peer is still
 * reading. (Used outside this harness, a step would need a barrier at both ends.)
 */
#include "cuco_abi.h"

static constexpr size_t kElemBytes = 2;  // bf16

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  CUCO_CHECK_ABI(ctx);
  const int64_t n = cuco_param(ctx, "N_PER_RANK");
  const cuco_tensor_t* x = cuco_tensor(ctx, "x");
  const cuco_tensor_t* y = cuco_tensor(ctx, "y");
  if (n <= 0 || x == NULL || y == NULL || x->peers_host == NULL) return CUCO_ERR_PARAM;
  if (x->valid_bytes < (size_t)n * kElemBytes || y->capacity_bytes < (size_t)ctx->world_size * n * kElemBytes)
    return CUCO_ERR_PARAM;
  return CUCO_OK;
}

CUCO_EXPORT int cuco_step(cuco_ctx_t* ctx) {
  const size_t slice_bytes = (size_t)cuco_param(ctx, "N_PER_RANK") * kElemBytes;
  const cuco_tensor_t* x = cuco_tensor(ctx, "x");
  cuco_tensor_t* y = cuco_tensor(ctx, "y");
  for (int k = 0; k < ctx->world_size; ++k) {
    // Start with the local slice and rotate, so ranks do not all pull from rank 0 first.
    const int src = (ctx->rank + k) % ctx->world_size;
    char* dst = (char*)y->local + (size_t)src * slice_bytes;
    CUCO_CUDA_TRY(cudaMemcpyAsync(dst, x->peers_host[src], slice_bytes, cudaMemcpyDeviceToDevice, ctx->stream));
  }
  return CUCO_OK;
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) {
  (void)ctx;
  return CUCO_OK;
}
