// kv_host.cuh — host code the three kv_transfer sources share: the workload's parameters, tensors and staging
// window as the candidate ABI hands them over, and the prefill rank's per-layer K/V projection (cuBLAS).
//
// The sources #include it: build.for_workload puts a workload's folder on the include path when it ships *.cuh
// headers and hashes them into the build cache key. For the search it is frozen library code (outside every
// candidate's EVOLVE blocks); how the K/V travels and who waits for what stays in each source.
#ifndef KV_HOST_CUH_
#define KV_HOST_CUH_

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <string.h>

#include "cuco_abi.h"
#include "cuco_errors.h"

namespace kv_transfer {

constexpr int kBf16Bytes = 2;
constexpr int kI32Bytes = 4;
constexpr int kVecBytes = 16;   // one uint4: 8 bf16
constexpr int kPrefillRank = 0;
constexpr int kContiguous = 0;  // PAGE value: no paging

// The workload's sizes (workload.py): L layers, a sequence of S tokens with hidden size D, K/V width KVD (a token
// row is 2*KVD bf16 = [K | V]), PAGE tokens per page of the decode cache or kContiguous.
struct Problem {
  int L, S, D, KVD, page;
  int rank, world;
  size_t row_vecs;     // 16-byte vectors per token row
  size_t layer_elems;  // S * 2*KVD: the distance between layers in kv_stage and kv_cache
};

// This rank's tensors and the staging window:
//   h [S, D], wkv [L, D, 2*KVD] (bf16, read on the prefill rank), page_table [S/PAGE] (i32, each decode rank's own),
//   kv_cache [L, S, 2*KVD] (bf16, the output), kv_stage [L, S, 2*KVD] (bf16 scratch window).
struct Tensors {
  cuco_tensor_t *h, *wkv, *page_table, *cache, *stage;
};

// Bytes of kv_stage (0 when a parameter is missing): what every source declares as scratch, before setup.
inline size_t stage_bytes(const cuco_ctx_t* ctx) {
  const int64_t L = cuco_param(ctx, "L"), S = cuco_param(ctx, "S"), KVD = cuco_param(ctx, "KVD");
  if (L <= 0 || S <= 0 || KVD <= 0) return 0;
  return (size_t)L * (size_t)S * 2 * (size_t)KVD * kBf16Bytes;
}

// cuco_declare_scratch's body: the staging window "kv_stage" (0 requests when a parameter is missing: setup then
// refuses it).
inline int declare_stage(const cuco_ctx_t* ctx, cuco_scratch_request_t* req, int max_req) {
  const size_t bytes = stage_bytes(ctx);
  if (max_req < 1 || bytes == 0) return 0;
  memset(&req[0], 0, sizeof(req[0]));
  strncpy(req[0].name, "kv_stage", CUCO_NAME_LEN - 1);
  req[0].bytes = bytes;
  return 1;
}

inline bool tensor_ok(const cuco_tensor_t* t, int dtype, size_t bytes) {
  return t != nullptr && t->dtype == dtype && t->local != nullptr && t->capacity_bytes >= bytes;
}

// Reads and checks the parameters (rows of whole 16-byte vectors, S a multiple of PAGE), the cuBLAS handle and
// the tensors above; CUCO_ERR_PARAM when one is missing or too small.
inline int open_problem(cuco_ctx_t* ctx, Problem* pb, Tensors* t) {
  if (ctx->cublas == nullptr) return CUCO_ERR_PARAM;
  const int64_t L = cuco_param(ctx, "L"), S = cuco_param(ctx, "S"), D = cuco_param(ctx, "D"),
                KVD = cuco_param(ctx, "KVD"), page = cuco_param(ctx, "PAGE");
  if (L <= 0 || S <= 0 || D <= 0 || KVD <= 0 || page < 0 || ctx->world_size < 1) return CUCO_ERR_PARAM;
  if ((2 * KVD * kBf16Bytes) % kVecBytes != 0 || (page > 0 && S % page != 0)) return CUCO_ERR_PARAM;
  const size_t layer_elems = (size_t)S * 2 * (size_t)KVD;
  const size_t all_bytes = (size_t)L * layer_elems * kBf16Bytes;
  const size_t n_pages = page > 0 ? (size_t)(S / page) : 1;
  *t = Tensors{cuco_tensor(ctx, "h"), cuco_tensor(ctx, "wkv"), cuco_tensor(ctx, "page_table"),
               cuco_tensor(ctx, "kv_cache"), cuco_scratch(ctx, "kv_stage")};
  if (!tensor_ok(t->h, CUCO_DTYPE_BF16, (size_t)S * D * kBf16Bytes) ||
      !tensor_ok(t->wkv, CUCO_DTYPE_BF16, (size_t)L * D * 2 * KVD * kBf16Bytes) ||
      !tensor_ok(t->page_table, CUCO_DTYPE_I32, n_pages * kI32Bytes) ||
      !tensor_ok(t->cache, CUCO_DTYPE_BF16, all_bytes) || t->stage == nullptr || t->stage->local == nullptr ||
      t->stage->capacity_bytes < all_bytes)
    return CUCO_ERR_PARAM;
  *pb = Problem{(int)L, (int)S, (int)D, (int)KVD, (int)page, ctx->rank, ctx->world_size,
                (size_t)2 * KVD * kBf16Bytes / kVecBytes, layer_elems};
  return CUCO_OK;
}

// The prefill rank's projection: KV_l = h @ wkv[l] into stage[l], one layer per gemm_layer call, on the handle's
// stream. cuBLAS is column-major and our matrices row-major, so it computes KV_l^T = Wkv_l^T H^T:
// cublasGemmEx(N, N, m = 2*KVD, n = S, k = D, A = wkv[l] (ld 2*KVD), B = h (ld D), C = stage[l] (ld 2*KVD)).
// (A member function: L0 accepts host calls from EVOLVE blocks to member functions and to functions defined in
// the candidate file, and this one lives in a header.)
struct Projection {
  const __nv_bfloat16* h;
  const __nv_bfloat16* wkv;
  __nv_bfloat16* stage;
  int S, D, KVD;

  int gemm_layer(cublasHandle_t handle, int l) const {
    const float one = 1.0f, zero = 0.0f;
    const int n2 = 2 * KVD;
    const size_t layer_elems = (size_t)S * n2;
    CUCO_CUBLAS_TRY(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n2, S, D, &one, wkv + (size_t)l * D * n2,
                                 CUDA_R_16BF, n2, h, CUDA_R_16BF, D, &zero, stage + (size_t)l * layer_elems,
                                 CUDA_R_16BF, n2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return CUCO_OK;
  }
};

inline Projection projection(const Problem& pb, const Tensors& t) {
  return Projection{(const __nv_bfloat16*)t.h->local, (const __nv_bfloat16*)t.wkv->local,
                    (__nv_bfloat16*)t.stage->local, pb.S, pb.D, pb.KVD};
}

}  // namespace kv_transfer

#endif  // KV_HOST_CUH_
