// seed_copy.cu — attention with context parallelism, host-driven through the copy engines (the seed where host
// NCCL cannot run).
// cuco: backends=symm,nccl
//
// Same computation as seed_nccl.cu: the sequence (SEQ tokens, H heads, head dim D) is split across W ranks,
// rank r holds tokens [r*Sr, (r+1)*Sr) (Sr = SEQ/W) and computes the attention output of its queries over the
// whole sequence (causal when CAUSAL=1, comparing global positions):
//
//     q, k, v  [Sr, H, D]   this rank's tokens               (inputs "q", "k", "v"; peers' k / v via peers_host)
//     kg, vg   [SEQ, H, D]  every rank's k / v, rank order   (scratch windows "kg", "vg", attention_host.cuh)
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
// over one segment: the whole gathered sequence; attention_host.cuh checks parameters and tensors. Under `symm`
// the ranks share one GPU (and one L2): timings say nothing about NVLink.
#include <cuda_bf16.h>

#include "cuco_abi.h"
#include "cuco_errors.h"
#include "cuco_state.h"

#include "attention_host.cuh"    // the workload's shared host code: frozen, on the include path (build.for_workload)
#include "attention_kernel.cuh"  // the workload's shared kernel: frozen, on the include path (build.for_workload)

namespace {

struct State {
  attn::Problem pb;
  const void* k_local;
  const void* v_local;
  void* const* k_peers;  // host copies of every rank's k / v pointers (may be NULL at world size 1)
  void* const* v_peers;
  __nv_bfloat16* kg;
  __nv_bfloat16* vg;
  attn::Params p;
};

bool peers_ok(const cuco_tensor_t* t, int rank, int world) {
  if (world == 1) return true;
  if (t->peers_host == nullptr) return false;
  for (int q = 0; q < world; ++q)
    if (q != rank && t->peers_host[q] == nullptr) return false;
  return true;
}

}  // namespace

CUCO_EXPORT int cuco_declare_scratch(const cuco_ctx_t* ctx, cuco_scratch_request_t* req, int max_req) {
  return attn::declare_kv_scratch(ctx, req, max_req);
}

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  CUCO_CHECK_ABI(ctx);
  attn::Problem pb;
  attn::Tensors t;
  CUCO_TRY(attn::read_problem(ctx, 1, &pb));
  CUCO_TRY(attn::find_tensors(ctx, pb, &t));
  cuco_tensor_t* kg = cuco_scratch(ctx, "kg");
  cuco_tensor_t* vg = cuco_scratch(ctx, "vg");
  if (!attn::scratch_ok(kg, attn::kv_bytes(ctx)) || !attn::scratch_ok(vg, attn::kv_bytes(ctx))) return CUCO_ERR_PARAM;
  // Pulling from peers needs their k / v mapped into this process (not needed for our own shard).
  if (!peers_ok(t.k, pb.rank, pb.world) || !peers_ok(t.v, pb.rank, pb.world)) return CUCO_ERR_BACKEND;

  State* s = cuco_state<State>::open(ctx);
  s->pb = pb;
  s->k_local = t.k->local;
  s->v_local = t.v->local;
  s->k_peers = t.k->peers_host;
  s->v_peers = t.v->peers_host;
  s->kg = (__nv_bfloat16*)kg->local;
  s->vg = (__nv_bfloat16*)vg->local;
  s->p = attn::gathered_params(pb, t, s->kg, s->vg);
  return CUCO_OK;
}

CUCO_EXPORT int cuco_step(cuco_ctx_t* ctx) {
  const State& s = *cuco_state<State>::get(ctx);
  const attn::Problem& pb = s.pb;
  const size_t shard_elems = (size_t)pb.rows_per_rank * pb.heads * pb.d;
  // 1. Gather by pulling: our own shard first (a local copy), then the next ranks, so at any moment the ranks
  //    read from different peers instead of all hammering rank 0.
  for (int j = 0; j < pb.world; ++j) {
    const int q = (pb.rank + j) % pb.world;
    const void* ksrc = q == pb.rank ? s.k_local : s.k_peers[q];
    const void* vsrc = q == pb.rank ? s.v_local : s.v_peers[q];
    CUCO_CUDA_TRY(cudaMemcpyAsync(s.kg + (size_t)q * shard_elems, ksrc, shard_elems * attn::kBf16Bytes,
                                  cudaMemcpyDefault, ctx->stream));
    CUCO_CUDA_TRY(cudaMemcpyAsync(s.vg + (size_t)q * shard_elems, vsrc, shard_elems * attn::kBf16Bytes,
                                  cudaMemcpyDefault, ctx->stream));
  }
  // 2. Compute: attention over the whole gathered sequence, after every copy (same stream).
  return cuco_cuda_status(attn::launch(s.p, pb.d, ctx->stream));
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) { return cuco_state<State>::close(ctx); }
