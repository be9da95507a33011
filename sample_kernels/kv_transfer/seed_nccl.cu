// seed_nccl.cu — KV-cache transfer prefill -> decode, the host-driven baseline: per layer a GEMM, then
// ncclSend/ncclRecv of that layer's KV.
//
// Rank 0 is the prefill rank, ranks 1..W-1 decode ranks (each receives the whole KV); at world size 1 rank 0
// plays both roles and the transfer is a local copy. Per layer l of L (sizes are workload parameters):
//
//     h        [S, D]            prefill's hidden states              (input "h", rank 0)
//     wkv      [L, D, 2*KVD]     per-layer K/V projections            (input "wkv", rank 0)
//     kv_stage [L, S, 2*KVD]     KV_l = h @ wkv[l], bf16              (scratch window "kv_stage", kv_host.cuh)
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
// The GEMM (kv_host.cuh's gemm_layer, shared with the other sources) is row-major through column-major cuBLAS.
// Host NCCL needs a communicator (ctx->nccl_comm): NCCL's under `nccl`; under `symm` the harness binds the host API
// of runtime/symm_nccl/nccl.h, over the ranks' shared memory (seed_copy.cu remains the `symm` seed candidates are
// measured against).
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <nccl.h>

#include "cuco_abi.h"
#include "cuco_errors.h"
#include "cuco_state.h"
#include "kv_host.cuh"  // the workload's shared host code: frozen, on the include path (build.for_workload)

namespace {

using namespace kv_transfer;  // parameters, tensors, the prefill GEMM: shared by all three sources

constexpr int kScatterThreads = 256;
constexpr int kScatterCtasPerSm = 4;

struct State {
  Problem pb;
  Projection proj;                     // the prefill GEMMs (h, wkv -> kv_stage)
  const int* page_table;               // this rank's own table (decode side)
  __nv_bfloat16* cache;
  int scatter_grid;
};

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
  const Problem& pb = s.pb;
  const size_t off = (size_t)l * pb.layer_elems;
  if (pb.page == kContiguous)
    return cuco_cuda_status(cudaMemcpyAsync(s.cache + off, s.proj.stage + off, pb.layer_elems * kBf16Bytes,
                                            cudaMemcpyDeviceToDevice, stream));
  scatter_pages<<<s.scatter_grid, kScatterThreads, 0, stream>>>((uint4*)(s.cache + off),
                                                                (const uint4*)(s.proj.stage + off), s.page_table,
                                                                pb.S, pb.page, pb.row_vecs);
  return cuco_cuda_status(cudaGetLastError());
}

}  // namespace

// Staging for every layer's KV: written by the prefill GEMMs, and the landing zone of paged receives.
CUCO_EXPORT int cuco_declare_scratch(const cuco_ctx_t* ctx, cuco_scratch_request_t* req, int max_req) {
  return declare_stage(ctx, req, max_req);
}

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  CUCO_CHECK_ABI(ctx);
  if (ctx->nccl_comm == nullptr) return CUCO_ERR_BACKEND;
  Problem pb;
  Tensors t;
  CUCO_TRY(open_problem(ctx, &pb, &t));
  int sms = ctx->sm_count;
  if (sms <= 0) CUCO_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx->device));

  State* s = cuco_state<State>::open(ctx);
  s->pb = pb;
  s->proj = projection(pb, t);
  s->page_table = (const int*)t.page_table->local;
  s->cache = (__nv_bfloat16*)t.cache->local;
  s->scatter_grid = sms * kScatterCtasPerSm;
  return CUCO_OK;
}

CUCO_EXPORT int cuco_step(cuco_ctx_t* ctx) {
  const State* state = cuco_state<State>::get(ctx);
  if (state == nullptr) return CUCO_ERR_PARAM;
  const State& s = *state;
  const Problem& pb = s.pb;
  ncclComm_t comm = (ncclComm_t)ctx->nccl_comm;
  cublasHandle_t handle = (cublasHandle_t)ctx->cublas;
  CUCO_CUBLAS_TRY(cublasSetStream(handle, ctx->stream));
  const bool prefill = pb.rank == kPrefillRank;
  const bool decode = pb.world == 1 || !prefill;

  for (int l = 0; l < pb.L; ++l) {
    const size_t off = (size_t)l * pb.layer_elems;
    if (prefill) CUCO_TRY(s.proj.gemm_layer(handle, l));
    if (pb.world == 1) {  // both roles on one rank: the transfer is a local copy
      CUCO_TRY(place_layer(s, l, ctx->stream));
      continue;
    }
    // One group per layer: the prefill rank's sends to every decode rank go out together.
    CUCO_NCCL_TRY(comm, ncclGroupStart());
    if (prefill) {
      for (int d = 0; d < pb.world; ++d)
        if (d != kPrefillRank)
          CUCO_NCCL_TRY(comm, ncclSend(s.proj.stage + off, pb.layer_elems, ncclBfloat16, d, comm, ctx->stream));
    } else {
      __nv_bfloat16* dst = pb.page == kContiguous ? s.cache + off : s.proj.stage + off;
      CUCO_NCCL_TRY(comm, ncclRecv(dst, pb.layer_elems, ncclBfloat16, kPrefillRank, comm, ctx->stream));
    }
    CUCO_NCCL_TRY(comm, ncclGroupEnd());
    if (decode && pb.page != kContiguous) CUCO_TRY(place_layer(s, l, ctx->stream));
  }
  return CUCO_OK;
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) { return cuco_state<State>::close(ctx); }
