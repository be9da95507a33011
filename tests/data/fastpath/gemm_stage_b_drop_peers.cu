// gemm_allgather after Stage B (a SCRIPTED WRONG answer, kept as a test fixture: it drops the stores to peers): the host ncclAllGather is
// replaced by a device-initiated push over LSA, then the same cuBLAS GEMM runs on ctx->stream.
// cuco: backends=nccl,symm
//
//     rank r:  x ──push_shard (LSA stores into every rank's xg window)──▶ xg ──cublasGemmEx──▶ y
//
// push_shard: CTA b of every rank pairs with CTA b of every peer through LSA barrier b.
//   entry sync(relaxed): every peer has started this step, so its previous GEMM no longer reads its xg.
//   exit  sync(acq_rel): release publishes this CTA's 16-byte stores; acquire makes the peers' CTA-b stores into
//                        our xg visible. Once all CTAs are past it, every shard has landed and the GEMM may read.
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include "cuco_lsa.h"
#include "gemm_host.cuh"  // the workload's shared host code: frozen, on the include path (build.for_workload)

constexpr int kBlocks = 32;    // knob: {8, 16, 32, 64}
constexpr int kThreads = 512;  // knob: {128, 256, 512, 1024}

namespace {

struct State : gemm_ag::Operands {
  ncclWindow_t xgWin;
  size_t shard_vecs;  // this rank's x in 16-byte vectors
  ncclDevComm devComm;
};

}  // namespace

__global__ void __launch_bounds__(kThreads)
push_shard(ncclDevComm devComm, ncclWindow_t xgWin, const uint4* __restrict__ x, size_t nVec) {
  ncclLsaBarrierSession<ncclCoopCta> bar(ncclCoopCta(), devComm, ncclTeamTagLsa{}, blockIdx.x);
  bar.sync(ncclCoopCta(), cuda::memory_order_relaxed);
  const int me = devComm.lsaRank;
  const int world = devComm.lsaSize;
  const size_t dst_offset = (size_t)me * nVec * sizeof(uint4);
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < nVec; i += (size_t)gridDim.x * blockDim.x) {
    const uint4 v = x[i];
    (void)world;
    ((uint4*)ncclGetLsaPointer(xgWin, dst_offset, me))[i] = v;  // only this rank's own xg
  }
  bar.sync(ncclCoopCta(), cuda::memory_order_acq_rel);
}

CUCO_EXPORT int cuco_declare_scratch(const cuco_ctx_t* ctx, cuco_scratch_request_t* req, int max_req) {
  return gemm_ag::GatheredX{ctx}.declare(req, max_req);
}

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  CUCO_CHECK_ABI(ctx);
  if (ctx->cublas == nullptr) return CUCO_ERR_PARAM;
  gemm_ag::Operands op;
  CUCO_TRY(op.open(ctx, 1));
  const size_t shard_bytes = (size_t)op.rows_per_rank * (size_t)op.K * gemm_ag::kBf16Bytes;
  ncclWindow_t xgWin = cuco_window(cuco_scratch(ctx, "xg"));
  if (xgWin == nullptr || shard_bytes % sizeof(uint4) != 0) return CUCO_ERR_PARAM;

  State* s = new State{op, xgWin, shard_bytes / sizeof(uint4)};
  const int rc = cuco_devcomm_create(ctx, kBlocks, &s->devComm);
  if (rc != CUCO_OK) {
    delete s;
    return rc;
  }
  ctx->user = s;
  return CUCO_OK;
}

CUCO_EXPORT int cuco_step(cuco_ctx_t* ctx) {
  const State& s = *(const State*)ctx->user;
  push_shard<<<kBlocks, kThreads, 0, ctx->stream>>>(s.devComm, s.xgWin, (const uint4*)s.x, s.shard_vecs);
  CUCO_CUDA_TRY(cudaGetLastError());
  cublasHandle_t h = (cublasHandle_t)ctx->cublas;
  CUCO_CUBLAS_TRY(cublasSetStream(h, ctx->stream));
  return s.gemm_rows(h, s.xg, 0, s.M);
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) {
  State* s = (State*)ctx->user;
  if (s == nullptr) return CUCO_OK;
  const int rc = cuco_devcomm_destroy(ctx, &s->devComm);
  delete s;
  ctx->user = nullptr;
  return rc;
}
