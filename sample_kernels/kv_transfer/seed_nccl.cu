// seed_nccl.cu — KV-cache transfer prefill -> decode, the host-driven baseline: per layer a GEMM, then
// ncclSend/ncclRecv of that layer's KV.
// cuco: backends=nccl
//
// Rank 0 is the prefill rank, ranks 1..W-1 decode ranks (each receives the whole KV); at world size 1 rank 0
// plays both roles and the transfer is a local copy. Per layer l of L (sizes are workload parameters):
//
//     h        [S, D]            prefill's hidden states              (input "h", rank 0)
//     wkv      [L, D, 2*KVD]     per-layer K/V projections            (input "wkv", rank 0)
//     kv_stage [L, S, 2*KVD]     KV_l = h @ wkv[l], bf16              (scratch window "kv_stage", declared below)
//     kv_cache [L, S, 2*KVD]     the decode cache, contiguous (PAGE = 0)              (output "kv_cache")
//              [L, S/PAGE, PAGE, 2*KVD]  or paged: logical page j -> physical page page_table[j]
//
// Data flow of one step, everything on the harness stream ctx->stream:
//
//   prefill (rank 0):  for l:  h, wkv[l] ──cublasGemmEx──▶ kv_stage[l] ──ncclSend (grouped, to every decode)──▶
//   decode  (rank d):  for l:  ncclRecv ──▶ kv_cache[l]                     (contiguous)
//                              ncclRecv ──▶ kv_stage[l] ──scatter_pages──▶ kv_cache[l]   (paged, own page table)
//
// On the prefill rank GEMM l+1 is stream-ordered after the send of layer l: compute and transfer never overlap.
// That serial chain is what device_lsa.cu and the search race against. The prefill rank's kv_cache output is not
// written (valid_bytes 0 there, see workload.py); its K/V lives in kv_stage.
//
// cuBLAS is column-major, our matrices row-major: KV_l = H @ Wkv_l is computed as KV_l^T = Wkv_l^T H^T,
// cublasGemmEx(N, N, m=2*KVD, n=S, k=D, A=wkv[l] (ld 2*KVD), B=h (ld D), C=kv_stage[l] (ld 2*KVD)).
// Host NCCL needs the `nccl` backend; under `symm` setup answers CUCO_ERR_BACKEND (seed_copy.cu is the seed there).
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <nccl.h>

#include "cuco_abi.h"

namespace {

constexpr int kBf16Bytes = 2;
constexpr int kI32Bytes = 4;
constexpr int kVecBytes = 16;          // one uint4: 8 bf16
constexpr int kPrefillRank = 0;
constexpr int kContiguous = 0;         // PAGE value: no paging
constexpr int kScatterThreads = 256;
constexpr int kScatterCtasPerSm = 4;

struct State {
  int L, S, D, KVD, page;
  int rank, world;
  size_t row_vecs;                     // 16-byte vectors per token row (2*KVD bf16)
  size_t layer_elems;                  // S * 2*KVD
  const __nv_bfloat16* h;
  const __nv_bfloat16* wkv;
  const int* page_table;               // this rank's own table (decode side)
  __nv_bfloat16* stage;
  __nv_bfloat16* cache;
  int scatter_grid;
};

bool tensor_ok(const cuco_tensor_t* t, int dtype, size_t bytes) {
  return t != nullptr && t->dtype == dtype && t->local != nullptr && t->capacity_bytes >= bytes;
}

// A non-blocking communicator (the harness makes them so a failing rank can abort the others) may answer
// ncclInProgress; poll until the call settles.
ncclResult_t settle(ncclComm_t comm, ncclResult_t r) {
  while (r == ncclInProgress) {
    if (ncclCommGetAsyncError(comm, &r) != ncclSuccess) return ncclSystemError;
  }
  return r;
}

int nccl_ok(ncclComm_t comm, ncclResult_t r) { return settle(comm, r) == ncclSuccess ? CUCO_OK : CUCO_ERR_NCCL; }
int cuda_ok(cudaError_t e) { return e == cudaSuccess ? CUCO_OK : CUCO_ERR_CUDA; }

#define KV_TRY(call)                      \
  do {                                    \
    const int kv_rc_ = (call);            \
    if (kv_rc_ != CUCO_OK) return kv_rc_; \
  } while (0)

// kv_stage[l] = h @ wkv[l] (see the header for the transposes).
int gemm_layer(cublasHandle_t handle, const State& s, int l) {
  const float one = 1.0f, zero = 0.0f;
  const int n2 = 2 * s.KVD;
  cublasStatus_t st = cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n2, s.S, s.D, &one,
                                   s.wkv + (size_t)l * s.D * n2, CUDA_R_16BF, n2, s.h, CUDA_R_16BF, s.D, &zero,
                                   s.stage + (size_t)l * s.layer_elems, CUDA_R_16BF, n2, CUBLAS_COMPUTE_32F,
                                   CUBLAS_GEMM_DEFAULT);
  return st == CUBLAS_STATUS_SUCCESS ? CUCO_OK : CUCO_ERR_CUBLAS;
}

// One layer of token rows from the staging order (logical) into the paged cache: row t goes to physical row
// page_table[t / page] * page + t % page. Grid-stride over 16-byte vectors.
__global__ void scatter_pages(uint4* cache, const uint4* stage, const int* page_table, int S, int page,
                              size_t row_vecs) {
  const size_t n = (size_t)S * row_vecs;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const size_t t = i / row_vecs;
    const size_t v = i - t * row_vecs;
    const size_t phys = (size_t)page_table[t / page] * page + t % page;
    cache[phys * row_vecs + v] = stage[i];
  }
}

// Move layer l from a local staging copy into the cache (a plain copy when contiguous).
int place_layer(const State& s, int l, cudaStream_t stream) {
  const size_t off = (size_t)l * s.layer_elems;
  if (s.page == kContiguous)
    return cuda_ok(cudaMemcpyAsync(s.cache + off, s.stage + off, s.layer_elems * kBf16Bytes,
                                   cudaMemcpyDeviceToDevice, stream));
  scatter_pages<<<s.scatter_grid, kScatterThreads, 0, stream>>>((uint4*)(s.cache + off),
                                                                (const uint4*)(s.stage + off), s.page_table, s.S,
                                                                s.page, s.row_vecs);
  return cuda_ok(cudaGetLastError());
}

}  // namespace

// Staging for every layer's KV: written by the prefill GEMMs, and the landing zone of paged receives.
CUCO_EXPORT int cuco_declare_scratch(const cuco_ctx_t* ctx, cuco_scratch_request_t* req, int max_req) {
  const int64_t L = cuco_param(ctx, "L"), S = cuco_param(ctx, "S"), KVD = cuco_param(ctx, "KVD");
  if (max_req < 1 || L <= 0 || S <= 0 || KVD <= 0) return 0;  // setup then reports CUCO_ERR_PARAM
  memset(&req[0], 0, sizeof(req[0]));
  strncpy(req[0].name, "kv_stage", CUCO_NAME_LEN - 1);
  req[0].bytes = (size_t)L * (size_t)S * 2 * (size_t)KVD * kBf16Bytes;
  return 1;
}

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  CUCO_CHECK_ABI(ctx);
  if (ctx->backend != CUCO_BACKEND_NCCL || ctx->nccl_comm == nullptr) return CUCO_ERR_BACKEND;
  if (ctx->cublas == nullptr) return CUCO_ERR_PARAM;
  const int64_t L = cuco_param(ctx, "L"), S = cuco_param(ctx, "S"), D = cuco_param(ctx, "D"),
                KVD = cuco_param(ctx, "KVD"), page = cuco_param(ctx, "PAGE");
  if (L <= 0 || S <= 0 || D <= 0 || KVD <= 0 || page < 0 || ctx->world_size < 1) return CUCO_ERR_PARAM;
  if ((2 * KVD * kBf16Bytes) % kVecBytes != 0 || (page > 0 && S % page != 0)) return CUCO_ERR_PARAM;
  const size_t layer_elems = (size_t)S * 2 * (size_t)KVD;
  const size_t n_pages = page > 0 ? (size_t)(S / page) : 1;
  cuco_tensor_t* h = cuco_tensor(ctx, "h");
  cuco_tensor_t* wkv = cuco_tensor(ctx, "wkv");
  cuco_tensor_t* pt = cuco_tensor(ctx, "page_table");
  cuco_tensor_t* cache = cuco_tensor(ctx, "kv_cache");
  cuco_tensor_t* stage = cuco_scratch(ctx, "kv_stage");
  if (!tensor_ok(h, CUCO_DTYPE_BF16, (size_t)S * D * kBf16Bytes) ||
      !tensor_ok(wkv, CUCO_DTYPE_BF16, (size_t)L * D * 2 * KVD * kBf16Bytes) ||
      !tensor_ok(pt, CUCO_DTYPE_I32, n_pages * kI32Bytes) ||
      !tensor_ok(cache, CUCO_DTYPE_BF16, (size_t)L * layer_elems * kBf16Bytes) || stage == nullptr ||
      stage->local == nullptr || stage->capacity_bytes < (size_t)L * layer_elems * kBf16Bytes)
    return CUCO_ERR_PARAM;
  int sms = ctx->sm_count;
  if (sms <= 0 && cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx->device) != cudaSuccess)
    return CUCO_ERR_CUDA;

  State* s = new State();
  s->L = (int)L;
  s->S = (int)S;
  s->D = (int)D;
  s->KVD = (int)KVD;
  s->page = (int)page;
  s->rank = ctx->rank;
  s->world = ctx->world_size;
  s->row_vecs = (size_t)2 * KVD * kBf16Bytes / kVecBytes;
  s->layer_elems = layer_elems;
  s->h = (const __nv_bfloat16*)h->local;
  s->wkv = (const __nv_bfloat16*)wkv->local;
  s->page_table = (const int*)pt->local;
  s->stage = (__nv_bfloat16*)stage->local;
  s->cache = (__nv_bfloat16*)cache->local;
  s->scatter_grid = sms * kScatterCtasPerSm;
  ctx->user = s;
  return CUCO_OK;
}

CUCO_EXPORT int cuco_step(cuco_ctx_t* ctx) {
  if (ctx->user == nullptr) return CUCO_ERR_PARAM;
  const State& s = *(const State*)ctx->user;
  ncclComm_t comm = (ncclComm_t)ctx->nccl_comm;
  cublasHandle_t handle = (cublasHandle_t)ctx->cublas;
  if (cublasSetStream(handle, ctx->stream) != CUBLAS_STATUS_SUCCESS) return CUCO_ERR_CUBLAS;
  const bool prefill = s.rank == kPrefillRank;
  const bool decode = s.world == 1 || !prefill;

  for (int l = 0; l < s.L; ++l) {
    const size_t off = (size_t)l * s.layer_elems;
    if (prefill) KV_TRY(gemm_layer(handle, s, l));
    if (s.world == 1) {  // both roles on one rank: the transfer is a local copy
      KV_TRY(place_layer(s, l, ctx->stream));
      continue;
    }
    // One group per layer: the prefill rank's sends to every decode rank go out together.
    KV_TRY(nccl_ok(comm, ncclGroupStart()));
    if (prefill) {
      for (int d = 0; d < s.world; ++d)
        if (d != kPrefillRank)
          KV_TRY(nccl_ok(comm, ncclSend(s.stage + off, s.layer_elems, ncclBfloat16, d, comm, ctx->stream)));
    } else {
      __nv_bfloat16* dst = s.page == kContiguous ? s.cache + off : s.stage + off;
      KV_TRY(nccl_ok(comm, ncclRecv(dst, s.layer_elems, ncclBfloat16, kPrefillRank, comm, ctx->stream)));
    }
    KV_TRY(nccl_ok(comm, ncclGroupEnd()));
    if (decode && s.page != kContiguous) KV_TRY(place_layer(s, l, ctx->stream));
  }
  return CUCO_OK;
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) {
  delete (State*)ctx->user;
  ctx->user = nullptr;
  return CUCO_OK;
}
