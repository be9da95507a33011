// seed_nccl.cu — attention with context parallelism, the host-driven baseline (the CUCo paper's starting point).
//
// The sequence (SEQ tokens, H heads, head dim D) is split across W ranks: rank r holds the Sr = SEQ/W tokens
// at global positions [r*Sr, (r+1)*Sr) and computes the attention output of ITS queries over the WHOLE sequence
// (causal when CAUSAL=1: a query attends to keys at global positions <= its own):
//
//     q, k, v  [Sr, H, D]   this rank's tokens               (input tensors "q", "k", "v", bf16)
//     kg, vg   [SEQ, H, D]  every rank's k / v, rank order   (scratch windows "kg", "vg", attention_host.cuh)
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
// Host NCCL needs a communicator (ctx->nccl_comm): NCCL's under `nccl`; under `symm` the harness binds the host API
// of runtime/symm_nccl/nccl.h, over the ranks' shared memory (seed_copy.cu remains the `symm` seed candidates are
// measured against).
#include <cuda_bf16.h>
#include <nccl.h>

#include "cuco_abi.h"
#include "cuco_errors.h"
#include "cuco_state.h"

#include "attention_host.cuh"    // the workload's shared host code: frozen, on the include path (build.for_workload)
#include "attention_kernel.cuh"  // the workload's shared kernel: frozen, on the include path (build.for_workload)

namespace {

struct State {
  attn::Problem pb;
  const __nv_bfloat16* k;
  const __nv_bfloat16* v;
  __nv_bfloat16* kg;
  __nv_bfloat16* vg;
  attn::Params p;
};

}  // namespace

// The gathered K and V need a symmetric window each on every rank (registered windows also let NCCL pick its
// symmetric all-gather kernels).
CUCO_EXPORT int cuco_declare_scratch(const cuco_ctx_t* ctx, cuco_scratch_request_t* req, int max_req) {
  return attn::declare_kv_scratch(ctx, req, max_req);
}

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  CUCO_CHECK_ABI(ctx);
  if (ctx->nccl_comm == nullptr) return CUCO_ERR_BACKEND;
  attn::Problem pb;
  attn::Tensors t;
  CUCO_TRY(attn::read_problem(ctx, 1, &pb));
  CUCO_TRY(attn::find_tensors(ctx, pb, &t));
  cuco_tensor_t* kg = cuco_scratch(ctx, "kg");
  cuco_tensor_t* vg = cuco_scratch(ctx, "vg");
  if (!attn::scratch_ok(kg, attn::kv_bytes(ctx)) || !attn::scratch_ok(vg, attn::kv_bytes(ctx))) return CUCO_ERR_PARAM;

  State* s = cuco_state<State>::open(ctx);
  s->pb = pb;
  s->k = (const __nv_bfloat16*)t.k->local;
  s->v = (const __nv_bfloat16*)t.v->local;
  s->kg = (__nv_bfloat16*)kg->local;
  s->vg = (__nv_bfloat16*)vg->local;
  s->p = attn::gathered_params(pb, t, s->kg, s->vg);
  return CUCO_OK;
}

CUCO_EXPORT int cuco_step(cuco_ctx_t* ctx) {
  const State& s = *cuco_state<State>::get(ctx);
  // 1. Gather: rank q's k / v land at tokens [q*Sr, (q+1)*Sr) of every rank's kg / vg.
  const size_t shard_elems = (size_t)s.pb.rows_per_rank * s.pb.heads * s.pb.d;
  ncclComm_t comm = (ncclComm_t)ctx->nccl_comm;
  CUCO_NCCL_TRY(comm, ncclGroupStart());
  const ncclResult_t rk = ncclAllGather(s.k, s.kg, shard_elems, ncclBfloat16, comm, ctx->stream);
  const ncclResult_t rv = ncclAllGather(s.v, s.vg, shard_elems, ncclBfloat16, comm, ctx->stream);
  // A call inside a group only enqueues: its own in-progress answer is settled by the group's end.
  CUCO_NCCL_TRY(comm, ncclGroupEnd());
  if ((rk != ncclSuccess && rk != ncclInProgress) || (rv != ncclSuccess && rv != ncclInProgress))
    return CUCO_ERR_NCCL;
  // 2. Compute: attention of this rank's queries over the whole gathered sequence, stream-ordered after it.
  return cuco_cuda_status(attn::launch(s.p, s.pb.d, ctx->stream));
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) { return cuco_state<State>::close(ctx); }
