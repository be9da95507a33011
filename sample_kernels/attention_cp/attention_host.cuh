// attention_host.cuh — host code the three attention_cp sources share: the workload's parameters, tensors and
// gathered-K/V windows as the candidate ABI hands them over, and the attention parameters of this rank's queries.
//
// Beside attention_kernel.cuh (the kernel itself, which benchmarks/attention_cp also builds on its own, without
// the runtime headers this one needs). Like it, frozen library code for the search: on the include path and in
// the build cache key (build.for_workload), outside every candidate's EVOLVE blocks.
#ifndef ATTENTION_HOST_CUH_
#define ATTENTION_HOST_CUH_

#include <cuda_bf16.h>
#include <stdint.h>
#include <string.h>

#include "attention_kernel.cuh"
#include "cuco_abi.h"

namespace attn {

constexpr int kBf16Bytes = 2;

// The workload's sizes (workload.py): SEQ tokens of H heads and head dim D, causal or not; rank r holds the
// rows_per_rank = SEQ / W tokens at global positions [r * rows_per_rank, (r + 1) * rows_per_rank).
struct Problem {
  int seq, heads, d, causal;
  int rank, world, rows_per_rank;
};

// The parameters of `ctx`, every shard split into `chunks` whole chunks; CUCO_ERR_PARAM when one is missing, the
// split is uneven or the kernel has no such head dim.
inline int read_problem(const cuco_ctx_t* ctx, int chunks, Problem* pb) {
  const int64_t seq = cuco_param(ctx, "SEQ"), heads = cuco_param(ctx, "H"), d = cuco_param(ctx, "D");
  const int64_t causal = cuco_param(ctx, "CAUSAL");
  const int world = ctx->world_size;
  if (seq <= 0 || heads <= 0 || world < 1 || chunks < 1 || seq % ((int64_t)world * chunks) != 0 ||
      (d != 32 && d != 64 && d != 128) || (causal != 0 && causal != 1))
    return CUCO_ERR_PARAM;
  *pb = Problem{(int)seq, (int)heads, (int)d, (int)causal, ctx->rank, world, (int)(seq / world)};
  return CUCO_OK;
}

// Bytes of one gathered tensor, kg or vg: SEQ x H x D bf16 (0 when the parameters are missing). What every source
// declares as scratch, before setup has checked anything else.
inline size_t kv_bytes(const cuco_ctx_t* ctx) {
  const int64_t seq = cuco_param(ctx, "SEQ"), h = cuco_param(ctx, "H"), d = cuco_param(ctx, "D");
  if (seq <= 0 || h <= 0 || d <= 0) return 0;
  return (size_t)seq * (size_t)h * (size_t)d * kBf16Bytes;
}

// cuco_declare_scratch's body: the gathered K and V, windows "kg" and "vg" of kv_bytes each on every rank (0
// requests when the parameters are missing: setup then refuses them).
inline int declare_kv_scratch(const cuco_ctx_t* ctx, cuco_scratch_request_t* req, int max_req) {
  const size_t bytes = kv_bytes(ctx);
  if (max_req < 2 || bytes == 0) return 0;
  memset(req, 0, 2 * sizeof(req[0]));
  strncpy(req[0].name, "kg", CUCO_NAME_LEN - 1);
  strncpy(req[1].name, "vg", CUCO_NAME_LEN - 1);
  req[0].bytes = req[1].bytes = bytes;
  return 2;
}

inline bool scratch_ok(const cuco_tensor_t* t, size_t bytes) {
  return t != nullptr && t->local != nullptr && t->capacity_bytes >= bytes;
}

// This rank's tensors, in workload.py's order: q, k, v, o, each [rows_per_rank, H, D] bf16.
struct Tensors {
  cuco_tensor_t *q, *k, *v, *o;
};

inline bool tensor_ok(const cuco_tensor_t* t, const Problem& pb) {
  return t != nullptr && t->dtype == CUCO_DTYPE_BF16 && t->ndim == 3 && t->shape[0] == pb.rows_per_rank &&
         t->shape[1] == pb.heads && t->shape[2] == pb.d && t->local != nullptr &&
         t->capacity_bytes >= (size_t)pb.rows_per_rank * (size_t)pb.heads * (size_t)pb.d * kBf16Bytes;
}

// Looks the tensors up; CUCO_ERR_PARAM when one is missing or not the shape above.
inline int find_tensors(cuco_ctx_t* ctx, const Problem& pb, Tensors* t) {
  *t = Tensors{cuco_tensor(ctx, "q"), cuco_tensor(ctx, "k"), cuco_tensor(ctx, "v"), cuco_tensor(ctx, "o")};
  const bool ok = tensor_ok(t->q, pb) && tensor_ok(t->k, pb) && tensor_ok(t->v, pb) && tensor_ok(t->o, pb);
  return ok ? CUCO_OK : CUCO_ERR_PARAM;
}

// The attention of this rank's queries, segments not yet given: q, o, sizes, the global position of its first
// query, causality and the softmax scale. Segments, state modes and the epoch are the caller's.
inline Params query_params(const Problem& pb, const Tensors& t) {
  Params p = {};
  p.q = (const __nv_bfloat16*)t.q->local;
  p.o = (__nv_bfloat16*)t.o->local;
  p.sq = pb.rows_per_rank;
  p.heads = pb.heads;
  p.q0 = pb.rank * pb.rows_per_rank;
  p.causal = pb.causal;
  p.scale_log2 = scale_log2(pb.d);
  return p;
}

// The seeds' attention: this rank's queries over the whole gathered sequence, one segment of SEQ keys from kg / vg
// (keys at global positions [0, SEQ)), written to o.
inline Params gathered_params(const Problem& pb, const Tensors& t, const __nv_bfloat16* kg, const __nv_bfloat16* vg) {
  Params p = query_params(pb, t);
  p.n_seg = 1;
  p.write_out = 1;
  p.seg[0] = Segment{kg, vg, nullptr, 0, pb.seq};
  return p;
}

}  // namespace attn

#endif  // ATTENTION_HOST_CUH_
