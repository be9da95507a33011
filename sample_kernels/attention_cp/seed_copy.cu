// seed_copy.cu — attention with context parallelism, host-driven through the copy engines (the seed where host
// NCCL cannot run).
// cuco: backends=symm,nccl
//
// Same computation as seed_nccl.cu: the sequence (SEQ tokens, H heads, head dim D) is split across W ranks,
// rank r holds tokens [r*Sr, (r+1)*Sr) (Sr = SEQ/W) and computes the attention output of its queries over the
// whole sequence (causal when CAUSAL=1, comparing global positions):
//
//     q, k, v  [Sr, H, D]   this rank's tokens               (inputs "q", "k", "v"; peers' k / v via peers_host)
//     kg, vg   [SEQ, H, D]  every rank's k / v, rank order   (scratch windows "kg", "vg", declared below)
//     o        [Sr, H, D]   softmax(q kg^T / sqrt(D)) vg     (output "o")
//
// Data flow of one step, everything on ctx->stream:
//
//     for p in r, r+1, ..., r-1 (mod W):  k, v of rank p ──cudaMemcpyAsync (pull)──▶ kg, vg tokens [p*Sr, ..)
//     then                                kg, vg ──flash attention (tensor cores)──▶ o
//
// Each copy READS a peer's k / v through the pointer the harness mapped into this process (torch symmetric
// memory under `symm`, NVLink peer mappings under `nccl`) and runs on a DMA copy engine, not on SMs. Copies
// and attention are stream-ordered, so as in seed_nccl.cu nothing overlaps. The harness's pre-step device
// barrier guarantees every rank's k / v hold this step's inputs before any rank pulls them.
//
// The attention kernel is the shared one of attention_kernel.cuh (included below, from the workload's folder),
// over one segment: the whole gathered sequence. Under `symm` the ranks share one GPU (and one L2):
// timings say nothing about NVLink.
#include <cuda_bf16.h>

#include "cuco_abi.h"

#include "attention_kernel.cuh"  // the workload's shared kernel: frozen, on the include path (build.for_workload)

namespace {

constexpr int kBf16Bytes = 2;

struct State {
  int heads, d, rows_per_rank, rank, world;
  const void* k_local;
  const void* v_local;
  void* const* k_peers;  // host copies of every rank's k / v pointers (may be NULL at world size 1)
  void* const* v_peers;
  __nv_bfloat16* kg;
  __nv_bfloat16* vg;
  attn::Params p;
};

bool tensor_ok(const cuco_tensor_t* t, int64_t rows, int64_t heads, int64_t d) {
  return t != nullptr && t->dtype == CUCO_DTYPE_BF16 && t->ndim == 3 && t->shape[0] == rows &&
         t->shape[1] == heads && t->shape[2] == d && t->local != nullptr &&
         t->capacity_bytes >= (size_t)rows * (size_t)heads * (size_t)d * kBf16Bytes;
}

bool scratch_ok(const cuco_tensor_t* t, size_t bytes) {
  return t != nullptr && t->local != nullptr && t->capacity_bytes >= bytes;
}

bool peers_ok(const cuco_tensor_t* t, int rank, int world) {
  if (world == 1) return true;
  if (t->peers_host == nullptr) return false;
  for (int q = 0; q < world; ++q)
    if (q != rank && t->peers_host[q] == nullptr) return false;
  return true;
}

size_t kv_bytes(const cuco_ctx_t* ctx) {
  const int64_t seq = cuco_param(ctx, "SEQ"), h = cuco_param(ctx, "H"), d = cuco_param(ctx, "D");
  if (seq <= 0 || h <= 0 || d <= 0) return 0;
  return (size_t)seq * (size_t)h * (size_t)d * kBf16Bytes;
}

}  // namespace

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
  // Pulling from peers needs their k / v mapped into this process (not needed for our own shard).
  if (!peers_ok(k, ctx->rank, W) || !peers_ok(v, ctx->rank, W)) return CUCO_ERR_BACKEND;

  State* s = new State();
  s->heads = (int)H;
  s->d = (int)D;
  s->rows_per_rank = (int)Sr;
  s->rank = ctx->rank;
  s->world = W;
  s->k_local = k->local;
  s->v_local = v->local;
  s->k_peers = k->peers_host;
  s->v_peers = v->peers_host;
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
  const size_t shard_elems = (size_t)s.rows_per_rank * s.heads * s.d;
  // 1. Gather by pulling: our own shard first (a local copy), then the next ranks, so at any moment the ranks
  //    read from different peers instead of all hammering rank 0.
  for (int j = 0; j < s.world; ++j) {
    const int q = (s.rank + j) % s.world;
    const void* ksrc = q == s.rank ? s.k_local : s.k_peers[q];
    const void* vsrc = q == s.rank ? s.v_local : s.v_peers[q];
    if (cudaMemcpyAsync(s.kg + (size_t)q * shard_elems, ksrc, shard_elems * kBf16Bytes, cudaMemcpyDefault,
                        ctx->stream) != cudaSuccess ||
        cudaMemcpyAsync(s.vg + (size_t)q * shard_elems, vsrc, shard_elems * kBf16Bytes, cudaMemcpyDefault,
                        ctx->stream) != cudaSuccess)
      return CUCO_ERR_CUDA;
  }
  // 2. Compute: attention over the whole gathered sequence, after every copy (same stream).
  return attn::launch(s.p, s.d, ctx->stream) == cudaSuccess ? CUCO_OK : CUCO_ERR_CUDA;
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) {
  delete (State*)ctx->user;
  ctx->user = nullptr;
  return CUCO_OK;
}
