// seed_copy.cu — KV-cache transfer prefill -> decode, host-driven through the copy engines (the seed where host
// NCCL cannot run, e.g. `symm`).
// cuco: backends=symm,nccl
//
// Same computation as seed_nccl.cu. Rank 0 is the prefill rank, ranks 1..W-1 decode ranks (each receives the
// whole KV); at world size 1 rank 0 plays both roles and the transfer is a local copy. Sizes are workload
// parameters:
//
//     h        [S, D]            prefill's hidden states              (input "h", rank 0)
//     wkv      [L, D, 2*KVD]     per-layer K/V projections            (input "wkv", rank 0)
//     kv_stage [L, S, 2*KVD]     KV_l = h @ wkv[l], bf16              (scratch window "kv_stage", declared below)
//     kv_cache [L, S, 2*KVD]     the decode cache, contiguous (PAGE = 0)              (output "kv_cache")
//              [L, S/PAGE, PAGE, 2*KVD]  or paged: logical page j -> physical page page_table[j]
//
// Data flow of one step (each rank on its ctx->stream):
//
//   prefill (rank 0):  for l: h, wkv[l] ──cublasGemmEx──▶ kv_stage[l]
//                      then  signal_ready: flag[0] of every decode rank = epoch       (release, system scope)
//   decode  (rank d):  wait_ready: spin until my flag[0] >= epoch                     (acquire, system scope)
//                      then  rank 0's kv_stage ──ONE cudaMemcpyAsync (pull)──▶ kv_cache         (contiguous)
//                                                                  or ──▶ my kv_stage ──scatter_pages──▶ kv_cache
//
// Ordering, which is the whole difficulty of a pull: the decode rank must not start copying before the prefill
// rank's last GEMM has finished writing kv_stage. The GEMMs and signal_ready are stream-ordered on rank 0, so the
// flag is raised only after every layer is in kv_stage; the copy is stream-ordered after wait_ready on the decode
// rank, so it starts only after the flag. Flags follow the ABI's epoch protocol (cuco_abi.h): ctx->epoch grows by
// one per step, the producer stores it and the consumer waits for >= epoch, so nothing is ever reset. Reuse of
// kv_stage across steps relies on the harness: every step ends with a synchronise and a host + device barrier,
// so rank 0 never overwrites kv_stage while a decode rank still reads the previous step's.
//
// All compute, then all transfer: this seed overlaps nothing, on purpose (the simple baseline). The copy is done
// by a DMA engine reading the peer's memory through the mapping the harness made (torch symmetric memory under
// `symm`, NVLink peer mappings under `nccl`). Under `symm` the ranks share one GPU and one L2, so timings say
// nothing about NVLink. The row-major GEMM through column-major cuBLAS is explained in seed_nccl.cu.
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include "cuco_lsa.h"  // cuco_signal / cuco_wait and the flag-region layout (CUCO_FLAGS_RESERVED)

namespace {

constexpr int kBf16Bytes = 2;
constexpr int kI32Bytes = 4;
constexpr int kVecBytes = 16;          // one uint4: 8 bf16
constexpr int kPrefillRank = 0;
constexpr int kContiguous = 0;         // PAGE value: no paging
constexpr size_t kReadyFlag = 0;       // candidate flag word (after the runtime's reserved words)
constexpr int kScatterThreads = 256;
constexpr int kScatterCtasPerSm = 4;
constexpr int kSignalThreads = 32;

struct State {
  int L, S, D, KVD, page;
  int rank, world;
  size_t row_vecs;                     // 16-byte vectors per token row (2*KVD bf16)
  size_t layer_elems;                  // S * 2*KVD
  const __nv_bfloat16* h;
  const __nv_bfloat16* wkv;
  const int* page_table;               // this rank's own table (decode side)
  __nv_bfloat16* stage;                // local kv_stage
  const void* prefill_stage;           // rank 0's kv_stage, mapped into this process
  __nv_bfloat16* cache;
  uint64_t* const* flag_peers;         // device table of every rank's flag words
  const uint64_t* my_flags;            // this rank's flag words
  int scatter_grid;
};

bool tensor_ok(const cuco_tensor_t* t, int dtype, size_t bytes) {
  return t != nullptr && t->dtype == dtype && t->local != nullptr && t->capacity_bytes >= bytes;
}

int cuda_ok(cudaError_t e) { return e == cudaSuccess ? CUCO_OK : CUCO_ERR_CUDA; }

#define KV_TRY(call)                      \
  do {                                    \
    const int kv_rc_ = (call);            \
    if (kv_rc_ != CUCO_OK) return kv_rc_; \
  } while (0)

int gemm_layer(cublasHandle_t handle, const State& s, int l) {
  const float one = 1.0f, zero = 0.0f;
  const int n2 = 2 * s.KVD;
  cublasStatus_t st = cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n2, s.S, s.D, &one,
                                   s.wkv + (size_t)l * s.D * n2, CUDA_R_16BF, n2, s.h, CUDA_R_16BF, s.D, &zero,
                                   s.stage + (size_t)l * s.layer_elems, CUDA_R_16BF, n2, CUBLAS_COMPUTE_32F,
                                   CUBLAS_GEMM_DEFAULT);
  return st == CUBLAS_STATUS_SUCCESS ? CUCO_OK : CUCO_ERR_CUBLAS;
}

// Rank 0, after the last GEMM on the same stream: tell every decode rank that kv_stage is complete. The fence
// makes the GEMMs' writes (finished before this kernel started) visible system-wide before the flag is.
__global__ void signal_ready(uint64_t* const* flag_peers, int world, uint64_t epoch) {
  __threadfence_system();
  for (int d = threadIdx.x; d < world; d += blockDim.x)
    if (d != kPrefillRank) cuco_signal(flag_peers[d] + CUCO_FLAGS_RESERVED + kReadyFlag, epoch);
}

// Decode rank: block ctx->stream (and with it the copy queued behind) until rank 0 has signalled this step.
__global__ void wait_ready(const uint64_t* my_flags, uint64_t epoch) {
  cuco_wait(my_flags + CUCO_FLAGS_RESERVED + kReadyFlag, epoch);
}

// All layers' token rows from the staging order (logical) into the paged cache: row t of layer l goes to
// physical row page_table[t / page] * page + t % page of layer l. Grid-stride over 16-byte vectors.
__global__ void scatter_pages(uint4* cache, const uint4* stage, const int* page_table, int layers, int S,
                              int page, size_t row_vecs) {
  const size_t n = (size_t)layers * S * row_vecs;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const size_t row = i / row_vecs;
    const size_t v = i - row * row_vecs;
    const size_t l = row / S;
    const size_t t = row - l * S;
    const size_t phys = (size_t)page_table[t / page] * page + t % page;
    cache[(l * S + phys) * row_vecs + v] = stage[i];
  }
}

// Copy every layer from `src` (rank 0's kv_stage, or our own at world size 1) into the cache.
int transfer_all(const State& s, const void* src, cudaStream_t stream) {
  const size_t bytes = (size_t)s.L * s.layer_elems * kBf16Bytes;
  if (s.page == kContiguous) return cuda_ok(cudaMemcpyAsync(s.cache, src, bytes, cudaMemcpyDefault, stream));
  if (src != s.stage) KV_TRY(cuda_ok(cudaMemcpyAsync(s.stage, src, bytes, cudaMemcpyDefault, stream)));
  scatter_pages<<<s.scatter_grid, kScatterThreads, 0, stream>>>((uint4*)s.cache, (const uint4*)s.stage,
                                                                s.page_table, s.L, s.S, s.page, s.row_vecs);
  return cuda_ok(cudaGetLastError());
}

}  // namespace

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
  if (ctx->cublas == nullptr) return CUCO_ERR_PARAM;
  const int64_t L = cuco_param(ctx, "L"), S = cuco_param(ctx, "S"), D = cuco_param(ctx, "D"),
                KVD = cuco_param(ctx, "KVD"), page = cuco_param(ctx, "PAGE");
  const int W = ctx->world_size;
  if (L <= 0 || S <= 0 || D <= 0 || KVD <= 0 || page < 0 || W < 1) return CUCO_ERR_PARAM;
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
  // Pulling needs rank 0's kv_stage mapped here, and flags to order the pull after rank 0's GEMMs.
  if (W > 1) {
    if (stage->peers_host == nullptr || stage->peers_host[kPrefillRank] == nullptr) return CUCO_ERR_BACKEND;
    if (ctx->flags.peers == nullptr || ctx->flags.local == nullptr ||
        ctx->flags.count < CUCO_FLAGS_RESERVED + kReadyFlag + 1)
      return CUCO_ERR_BACKEND;
  }
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
  s->world = W;
  s->row_vecs = (size_t)2 * KVD * kBf16Bytes / kVecBytes;
  s->layer_elems = layer_elems;
  s->h = (const __nv_bfloat16*)h->local;
  s->wkv = (const __nv_bfloat16*)wkv->local;
  s->page_table = (const int*)pt->local;
  s->stage = (__nv_bfloat16*)stage->local;
  s->prefill_stage = W > 1 ? stage->peers_host[kPrefillRank] : stage->local;
  s->cache = (__nv_bfloat16*)cache->local;
  s->flag_peers = ctx->flags.peers;
  s->my_flags = ctx->flags.local;
  s->scatter_grid = sms * kScatterCtasPerSm;
  ctx->user = s;
  return CUCO_OK;
}

CUCO_EXPORT int cuco_step(cuco_ctx_t* ctx) {
  if (ctx->user == nullptr) return CUCO_ERR_PARAM;
  const State& s = *(const State*)ctx->user;
  const bool prefill = s.rank == kPrefillRank;
  const bool decode = s.world == 1 || !prefill;

  if (prefill) {
    cublasHandle_t handle = (cublasHandle_t)ctx->cublas;
    if (cublasSetStream(handle, ctx->stream) != CUBLAS_STATUS_SUCCESS) return CUCO_ERR_CUBLAS;
    for (int l = 0; l < s.L; ++l) KV_TRY(gemm_layer(handle, s, l));
    if (s.world > 1) {
      signal_ready<<<1, kSignalThreads, 0, ctx->stream>>>(s.flag_peers, s.world, ctx->epoch);
      KV_TRY(cuda_ok(cudaGetLastError()));
    }
  }
  if (decode) {
    // At world size 1 the GEMMs above are on this very stream: no flag needed, and none raised.
    if (s.world > 1) {
      wait_ready<<<1, 1, 0, ctx->stream>>>(s.my_flags, ctx->epoch);
      KV_TRY(cuda_ok(cudaGetLastError()));
    }
    KV_TRY(transfer_all(s, s.prefill_stage, ctx->stream));
  }
  return CUCO_OK;
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) {
  delete (State*)ctx->user;
  ctx->user = nullptr;
  return CUCO_OK;
}
