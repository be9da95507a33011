// seed_nccl.cu — attention with context parallelism, the host-driven baseline (the CUCo paper's starting point).
// cuco: backends=nccl
//
// The sequence (SEQ tokens, H heads, head dim D) is split across W ranks: rank r holds the Sr = SEQ/W tokens
// at global positions [r*Sr, (r+1)*Sr) and computes the attention output of ITS queries over the WHOLE sequence
// (causal when CAUSAL=1: a query attends to keys at global positions <= its own):
//
//     q, k, v  [Sr, H, D]   this rank's tokens               (input tensors "q", "k", "v", bf16)
//     kg, vg   [SEQ, H, D]  every rank's k / v, rank order   (scratch windows "kg", "vg", declared below)
//     o        [Sr, H, D]   softmax(q kg^T / sqrt(D)) vg     (output tensor "o", bf16)
//
// Data flow of one step, everything on the harness stream ctx->stream:
//
//     rank r:  k, v ──ncclAllGather x2 (one group)──▶ kg, vg ──flash attention (tensor cores)──▶ o
//
// Communication and compute are strictly serial: no query tile starts before the last K/V byte has arrived,
// although the local block (and, causally, everything before it) could have been processed meanwhile. That gap
// is what device_lsa.cu and the search try to close.
//
// The attention kernel (attn::flash_fwd_kernel, mma.sync m16n8k16 bf16, online softmax) is the shared one of
// attention_kernel.cuh (included below, from the workload's folder). Here it runs over ONE segment: the
// whole gathered sequence, keys at global positions [0, SEQ).
//
// Host NCCL needs the `nccl` backend (ctx->nccl_comm); under `symm` seed_copy.cu is the seed.
#include <cuda_bf16.h>
#include <nccl.h>

#include "cuco_abi.h"

#include "attention_kernel.cuh"  // the workload's shared kernel: frozen, on the include path (build.for_workload)

namespace {

constexpr int kBf16Bytes = 2;

struct State {
  int seq, heads, d, rows_per_rank, rank, causal;
  const __nv_bfloat16* k;
  const __nv_bfloat16* v;
  __nv_bfloat16* kg;
  __nv_bfloat16* vg;
  attn::Params p;
};

// Check a tensor the workload promises: bf16, [rows, heads, d].
bool tensor_ok(const cuco_tensor_t* t, int64_t rows, int64_t heads, int64_t d) {
  return t != nullptr && t->dtype == CUCO_DTYPE_BF16 && t->ndim == 3 && t->shape[0] == rows &&
         t->shape[1] == heads && t->shape[2] == d && t->local != nullptr &&
         t->capacity_bytes >= (size_t)rows * (size_t)heads * (size_t)d * kBf16Bytes;
}

bool scratch_ok(const cuco_tensor_t* t, size_t bytes) {
  return t != nullptr && t->local != nullptr && t->capacity_bytes >= bytes;
}

// A non-blocking communicator may answer ncclInProgress for an enqueued collective; poll until it settles.
ncclResult_t settle(ncclComm_t comm, ncclResult_t r) {
  while (r == ncclInProgress) {
    if (ncclCommGetAsyncError(comm, &r) != ncclSuccess) return ncclSystemError;
  }
  return r;
}

size_t kv_bytes(const cuco_ctx_t* ctx) {
  const int64_t seq = cuco_param(ctx, "SEQ"), h = cuco_param(ctx, "H"), d = cuco_param(ctx, "D");
  if (seq <= 0 || h <= 0 || d <= 0) return 0;
  return (size_t)seq * (size_t)h * (size_t)d * kBf16Bytes;
}

}  // namespace

// The gathered K and V need a symmetric window each on every rank (registered windows also let NCCL pick its
// symmetric all-gather kernels).
CUCO_EXPORT int cuco_declare_scratch(const cuco_ctx_t* ctx, cuco_scratch_request_t* req, int max_req) {
  const size_t bytes = kv_bytes(ctx);
  if (max_req < 2 || bytes == 0) return 0;  // setup then reports CUCO_ERR_PARAM
  memset(req, 0, 2 * sizeof(req[0]));
  strncpy(req[0].name, "kg", CUCO_NAME_LEN - 1);
  strncpy(req[1].name, "vg", CUCO_NAME_LEN - 1);
  req[0].bytes = req[1].bytes = bytes;
  return 2;
}

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  CUCO_CHECK_ABI(ctx);
  if (ctx->backend != CUCO_BACKEND_NCCL || ctx->nccl_comm == nullptr) return CUCO_ERR_BACKEND;
  const int64_t SEQ = cuco_param(ctx, "SEQ"), H = cuco_param(ctx, "H"), D = cuco_param(ctx, "D");
  const int64_t CAUSAL = cuco_param(ctx, "CAUSAL");
  const int W = ctx->world_size;
  if (SEQ <= 0 || H <= 0 || W < 1 || SEQ % W != 0 || (D != 32 && D != 64 && D != 128) ||
      (CAUSAL != 0 && CAUSAL != 1))
    return CUCO_ERR_PARAM;
  const int64_t Sr = SEQ / W;
  cuco_tensor_t* q = cuco_tensor(ctx, "q");
  cuco_tensor_t* k = cuco_tensor(ctx, "k");
  cuco_tensor_t* v = cuco_tensor(ctx, "v");
  cuco_tensor_t* o = cuco_tensor(ctx, "o");
  if (!tensor_ok(q, Sr, H, D) || !tensor_ok(k, Sr, H, D) || !tensor_ok(v, Sr, H, D) || !tensor_ok(o, Sr, H, D))
    return CUCO_ERR_PARAM;
  cuco_tensor_t* kg = cuco_scratch(ctx, "kg");
  cuco_tensor_t* vg = cuco_scratch(ctx, "vg");
  if (!scratch_ok(kg, kv_bytes(ctx)) || !scratch_ok(vg, kv_bytes(ctx))) return CUCO_ERR_PARAM;

  State* s = new State();
  s->seq = (int)SEQ;
  s->heads = (int)H;
  s->d = (int)D;
  s->rows_per_rank = (int)Sr;
  s->rank = ctx->rank;
  s->causal = (int)CAUSAL;
  s->k = (const __nv_bfloat16*)k->local;
  s->v = (const __nv_bfloat16*)v->local;
  s->kg = (__nv_bfloat16*)kg->local;
  s->vg = (__nv_bfloat16*)vg->local;
  attn::Params& p = s->p;
  p.q = (const __nv_bfloat16*)q->local;
  p.o = (__nv_bfloat16*)o->local;
  p.sq = (int)Sr;
  p.heads = (int)H;
  p.q0 = ctx->rank * (int)Sr;
  p.causal = (int)CAUSAL;
  p.scale_log2 = attn::scale_log2((int)D);
  p.n_seg = 1;
  p.write_out = 1;
  p.seg[0] = attn::Segment{s->kg, s->vg, nullptr, 0, (int)SEQ};
  ctx->user = s;
  return CUCO_OK;
}

CUCO_EXPORT int cuco_step(cuco_ctx_t* ctx) {
  const State& s = *(const State*)ctx->user;
  // 1. Gather: rank q's k / v land at tokens [q*Sr, (q+1)*Sr) of every rank's kg / vg.
  const size_t shard_elems = (size_t)s.rows_per_rank * s.heads * s.d;
  ncclComm_t comm = (ncclComm_t)ctx->nccl_comm;
  if (ncclGroupStart() != ncclSuccess) return CUCO_ERR_NCCL;
  ncclResult_t r1 = ncclAllGather(s.k, s.kg, shard_elems, ncclBfloat16, comm, ctx->stream);
  ncclResult_t r2 = ncclAllGather(s.v, s.vg, shard_elems, ncclBfloat16, comm, ctx->stream);
  ncclResult_t r3 = settle(comm, ncclGroupEnd());
  if ((r1 != ncclSuccess && r1 != ncclInProgress) || (r2 != ncclSuccess && r2 != ncclInProgress) ||
      r3 != ncclSuccess)
    return CUCO_ERR_NCCL;
  // 2. Compute: attention of this rank's queries over the whole gathered sequence, stream-ordered after it.
  return attn::launch(s.p, s.d, ctx->stream) == cudaSuccess ? CUCO_OK : CUCO_ERR_CUDA;
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) {
  delete (State*)ctx->user;
  ctx->user = nullptr;
  return CUCO_OK;
}
