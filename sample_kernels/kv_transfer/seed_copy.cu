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
//     kv_stage [L, S, 2*KVD]     KV_l = h @ wkv[l], bf16              (scratch window "kv_stage", kv_host.cuh)
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
// nothing about NVLink. The GEMM is kv_host.cuh's gemm_layer, shared with the other sources.
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include "cuco_lsa.h"  // cuco_signal / cuco_wait and the flag-region layout (CUCO_FLAGS_RESERVED)
#include "kv_host.cuh"  // the workload's shared host code: frozen, on the include path (build.for_workload)

namespace {

using namespace kv_transfer;  // parameters, tensors, the prefill GEMM: shared by all three sources

constexpr size_t kReadyFlag = 0;       // candidate flag word (after the runtime's reserved words)
constexpr int kScatterThreads = 256;
constexpr int kScatterCtasPerSm = 4;
constexpr int kSignalThreads = 32;

struct State {
  Problem pb;
  Projection proj;                     // the prefill GEMMs (h, wkv -> local kv_stage)
  const int* page_table;               // this rank's own table (decode side)
  const void* prefill_stage;           // rank 0's kv_stage, mapped into this process
  __nv_bfloat16* cache;
  uint64_t* const* flag_peers;         // device table of every rank's flag words
  const uint64_t* my_flags;            // this rank's flag words
  int scatter_grid;
};

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
  const Problem& pb = s.pb;
  const size_t bytes = (size_t)pb.L * pb.layer_elems * kBf16Bytes;
  if (pb.page == kContiguous) return cuco_cuda_status(cudaMemcpyAsync(s.cache, src, bytes, cudaMemcpyDefault, stream));
  if (src != s.proj.stage) CUCO_CUDA_TRY(cudaMemcpyAsync(s.proj.stage, src, bytes, cudaMemcpyDefault, stream));
  scatter_pages<<<s.scatter_grid, kScatterThreads, 0, stream>>>((uint4*)s.cache, (const uint4*)s.proj.stage,
                                                                s.page_table, pb.L, pb.S, pb.page, pb.row_vecs);
  return cuco_cuda_status(cudaGetLastError());
}

}  // namespace

CUCO_EXPORT int cuco_declare_scratch(const cuco_ctx_t* ctx, cuco_scratch_request_t* req, int max_req) {
  return declare_stage(ctx, req, max_req);
}

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  CUCO_CHECK_ABI(ctx);
  Problem pb;
  Tensors t;
  CUCO_TRY(open_problem(ctx, &pb, &t));
  // Pulling needs rank 0's kv_stage mapped here, and flags to order the pull after rank 0's GEMMs.
  if (pb.world > 1) {
    if (t.stage->peers_host == nullptr || t.stage->peers_host[kPrefillRank] == nullptr) return CUCO_ERR_BACKEND;
    if (ctx->flags.peers == nullptr || ctx->flags.local == nullptr ||
        ctx->flags.count < CUCO_FLAGS_RESERVED + kReadyFlag + 1)
      return CUCO_ERR_BACKEND;
  }
  int sms = ctx->sm_count;
  if (sms <= 0) CUCO_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx->device));

  State* s = cuco_state<State>::open(ctx);
  s->pb = pb;
  s->proj = projection(pb, t);
  s->page_table = (const int*)t.page_table->local;
  s->prefill_stage = pb.world > 1 ? t.stage->peers_host[kPrefillRank] : t.stage->local;
  s->cache = (__nv_bfloat16*)t.cache->local;
  s->flag_peers = ctx->flags.peers;
  s->my_flags = ctx->flags.local;
  s->scatter_grid = sms * kScatterCtasPerSm;
  return CUCO_OK;
}

CUCO_EXPORT int cuco_step(cuco_ctx_t* ctx) {
  const State* state = cuco_state<State>::get(ctx);
  if (state == nullptr) return CUCO_ERR_PARAM;
  const State& s = *state;
  const bool prefill = s.pb.rank == kPrefillRank;
  const bool decode = s.pb.world == 1 || !prefill;

  if (prefill) {
    cublasHandle_t handle = (cublasHandle_t)ctx->cublas;
    CUCO_CUBLAS_TRY(cublasSetStream(handle, ctx->stream));
    for (int l = 0; l < s.pb.L; ++l) CUCO_TRY(s.proj.gemm_layer(handle, l));
    if (s.pb.world > 1) {
      signal_ready<<<1, kSignalThreads, 0, ctx->stream>>>(s.flag_peers, s.pb.world, ctx->epoch);
      CUCO_CUDA_TRY(cudaGetLastError());
    }
  }
  if (decode) {
    // At world size 1 the GEMMs above are on this very stream: no flag needed, and none raised.
    if (s.pb.world > 1) {
      wait_ready<<<1, 1, 0, ctx->stream>>>(s.my_flags, ctx->epoch);
      CUCO_CUDA_TRY(cudaGetLastError());
    }
    CUCO_TRY(transfer_all(s, s.prefill_stage, ctx->stream));
  }
  return CUCO_OK;
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) { return cuco_state<State>::close(ctx); }
