/*
 * host_nccl_ops.cu — every host NCCL call the symm backend serves (runtime/symm_nccl/nccl.h), in one step, for the
 * gpu tier (tests/gpu/test_host_nccl_symm_gpu.py). workload.py says what each output must hold.
 *
 * Every collective and every send runs in several chunks: the define below caps a chunk at 16 KiB (the gpu test
 * drops it for the `large` preset, whose messages outgrow the real staging window). Two calls work in place
 * (the bf16 sum all-reduce and the all-gather). The ring group's receives are on a side stream, forked from
 * ctx->stream before the group and joined back after it: the group joins its streams as NCCL does.
 */
#define CUCO_SYMM_NCCL_CHUNK_BYTES (16 << 10)
#include <nccl.h>

#include "cuco_abi.h"
#include "cuco_errors.h"
#include "cuco_side_stream.h"

namespace {

struct Ops {
  int64_t N, M, S, D, T, U;
  cuco_side_stream_t side;
};

float* f32(cuco_ctx_t* ctx, const char* name) { return (float*)cuco_tensor(ctx, name)->local; }

}  // namespace

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  CUCO_CHECK_ABI(ctx);
  if (ctx->nccl_comm == NULL) return CUCO_ERR_BACKEND;
  const char* names[] = {"x", "xb", "xw", "sum_f32", "max_f32", "sum_bf16", "max_bf16", "ag", "rs", "a2a", "bc",
                         "red", "gat", "sct", "ring"};
  for (const char* n : names)
    if (cuco_tensor(ctx, n) == NULL) return CUCO_ERR_PARAM;
  Ops* s = new Ops();
  s->N = cuco_param(ctx, "N");
  s->M = cuco_param(ctx, "M");
  s->S = cuco_param(ctx, "S");
  s->D = cuco_param(ctx, "D");
  s->T = cuco_param(ctx, "T");
  s->U = cuco_param(ctx, "U");
  ctx->user = s;
  if (s->N <= 0 || s->M <= 0 || s->S <= 0 || s->D < 0 || s->T <= 0 || s->U <= 0) return CUCO_ERR_PARAM;
  return cuco_side_stream_create(&s->side);
}

CUCO_EXPORT int cuco_step(cuco_ctx_t* ctx) {
  Ops& s = *(Ops*)ctx->user;
  ncclComm_t comm = (ncclComm_t)ctx->nccl_comm;
  cudaStream_t st = ctx->stream;
  int me = 0, W = 0;
  CUCO_NCCL_TRY(comm, ncclCommUserRank(comm, &me));
  CUCO_NCCL_TRY(comm, ncclCommCount(comm, &W));
  if (me != ctx->rank || W != ctx->world_size) return CUCO_ERR_NCCL;
  const size_t N = (size_t)s.N, M = (size_t)s.M;
  const float* x = f32(ctx, "x");
  const float* xw = f32(ctx, "xw");
  const __nv_bfloat16* xb = (const __nv_bfloat16*)cuco_tensor(ctx, "xb")->local;
  __nv_bfloat16* sum_bf16 = (__nv_bfloat16*)cuco_tensor(ctx, "sum_bf16")->local;
  float* ag = f32(ctx, "ag");
  float* ring = f32(ctx, "ring");

  // what a rank's receive leaves alone must still be defined: non-roots' reduce and gather outputs, ring padding
  CUCO_CUDA_TRY(cudaMemsetAsync(f32(ctx, "red"), 0, N * sizeof(float), st));
  CUCO_CUDA_TRY(cudaMemsetAsync(f32(ctx, "gat"), 0, W * N * sizeof(float), st));
  CUCO_CUDA_TRY(cudaMemsetAsync(ring, 0, cuco_tensor(ctx, "ring")->capacity_bytes, st));

  CUCO_NCCL_TRY(comm, ncclAllReduce(x, f32(ctx, "sum_f32"), N, ncclFloat32, ncclSum, comm, st));
  CUCO_NCCL_TRY(comm, ncclAllReduce(x, f32(ctx, "max_f32"), N, ncclFloat, ncclMax, comm, st));
  CUCO_CUDA_TRY(cudaMemcpyAsync(sum_bf16, xb, N * sizeof(__nv_bfloat16), cudaMemcpyDeviceToDevice, st));
  CUCO_NCCL_TRY(comm, ncclAllReduce(sum_bf16, sum_bf16, N, ncclBfloat16, ncclSum, comm, st));  // in place
  CUCO_NCCL_TRY(comm, ncclAllReduce(xb, cuco_tensor(ctx, "max_bf16")->local, N, ncclBfloat16, ncclMax, comm, st));
  CUCO_CUDA_TRY(cudaMemcpyAsync(ag + me * N, x, N * sizeof(float), cudaMemcpyDeviceToDevice, st));
  CUCO_NCCL_TRY(comm, ncclAllGather(ag + me * N, ag, N, ncclFloat, comm, st));  // in place
  CUCO_NCCL_TRY(comm, ncclReduceScatter(xw, f32(ctx, "rs"), M, ncclFloat, ncclSum, comm, st));
  CUCO_NCCL_TRY(comm, ncclAlltoAll(xw, f32(ctx, "a2a"), M, ncclFloat, comm, st));
  CUCO_NCCL_TRY(comm, ncclBroadcast(x, f32(ctx, "bc"), N, ncclFloat, W - 1, comm, st));
  CUCO_NCCL_TRY(comm, ncclReduce(x, f32(ctx, "red"), N, ncclFloat, ncclSum, 0, comm, st));
  CUCO_NCCL_TRY(comm, ncclGather(x, f32(ctx, "gat"), N, ncclFloat, 0, comm, st));
  CUCO_NCCL_TRY(comm, ncclScatter(xw, f32(ctx, "sct"), M, ncclFloat, W - 1, comm, st));

  // the ring: two sends to the next rank (one byte stream), two receives from the previous, one to itself
  const int next = (me + 1) % W, prev = (me + W - 1) % W;
  const size_t s_me = (size_t)(s.S + s.D * me), s_prev = (size_t)(s.S + s.D * prev);
  const size_t s_max = (size_t)(s.S + s.D * (W - 1)), T = (size_t)s.T, U = (size_t)s.U;
  cudaStream_t side = s.side.stream;
  CUCO_TRY(cuco_side_stream_fork(&s.side, st));
  CUCO_NCCL_TRY(comm, ncclGroupStart());
  CUCO_NCCL_TRY(comm, ncclSend(x, s_me, ncclFloat, next, comm, st));
  CUCO_NCCL_TRY(comm, ncclRecv(ring, s_prev, ncclFloat, prev, comm, side));
  CUCO_NCCL_TRY(comm, ncclSend(x + s_me, T, ncclFloat, next, comm, st));
  CUCO_NCCL_TRY(comm, ncclRecv(ring + s_max, T, ncclFloat, prev, comm, side));
  CUCO_NCCL_TRY(comm, ncclSend(x, U, ncclFloat, me, comm, st));
  CUCO_NCCL_TRY(comm, ncclRecv(ring + s_max + T, U, ncclFloat, me, comm, side));
  CUCO_NCCL_TRY(comm, ncclGroupEnd());
  return cuco_side_stream_join(&s.side, st);
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) {
  Ops* s = (Ops*)ctx->user;
  if (s == NULL) return CUCO_OK;
  cuco_side_stream_destroy(&s->side);
  delete s;
  ctx->user = NULL;
  return CUCO_OK;
}
