// gemm_allgather after Stage B with --backend gin, for both backends (a SCRIPTED fast-path answer, kept as a test
// fixture): the host ncclAllGather is replaced by GIN one-sided puts of this rank's x window into every peer's xg
// window, each completing with a +1 on signal 0 at the peer; a rank waits until its signal reaches
// epoch * (world - 1). The devComm comes from cuco_devcomm_create_gin, so the same source builds against NCCL's GIN
// (nccl) and against runtime/gin_compat.h (symm), where the fast path checks it at 1 and 2 ranks on one GPU.
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include "cuco_lsa.h"
#include "gemm_host.cuh"  // the workload's shared host code: frozen, on the include path (build.for_workload)

constexpr int kBlocks = 16;    // knob: {8, 16, 32, 64}
constexpr int kThreads = 512;  // knob: {128, 256, 512, 1024}

namespace {

struct State : gemm_ag::Operands {
  ncclWindow_t xgWin;
  ncclWindow_t xWin;
  size_t shard_bytes;
  size_t shard_vecs;  // this rank's x in 16-byte vectors
  ncclDevComm devComm;
};

}  // namespace

// Block 0 thread 0 issues the puts (one per peer) and waits; every thread copies the local shard.
__global__ void __launch_bounds__(kThreads)
gin_push(ncclDevComm devComm, ncclWindow_t xWin, ncclWindow_t xgWin, const uint4* __restrict__ x,
         size_t nVec, size_t shardBytes, uint64_t epoch) {
  const int me = devComm.rank;
  const int world = devComm.nRanks;
  ncclGin gin(devComm, 0);
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    for (int k = 1; k < world; ++k) {
      const int peer = (me + k) % world;
      gin.put(ncclTeamWorld(devComm), peer, xgWin, (size_t)me * shardBytes, xWin, 0, shardBytes,
              ncclGin_SignalInc{0});
    }
  }
  uint4* local = (uint4*)ncclGetLocalPointer(xgWin, (size_t)me * shardBytes);
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < nVec; i += (size_t)gridDim.x * blockDim.x)
    local[i] = x[i];
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    gin.waitSignal(ncclCoopThread(), 0, epoch * (uint64_t)(world - 1));
    gin.flush(ncclCoopThread());
  }
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
  ncclWindow_t xWin = cuco_window(cuco_tensor(ctx, "x"));
  if (xWin == nullptr) return CUCO_ERR_BACKEND;

  State* s = new State{op, xgWin, xWin, shard_bytes, shard_bytes / sizeof(uint4)};
  // one GIN context and one signal; no LSA barrier, no counter
  const int rc = cuco_devcomm_create_gin(ctx, 0, 1, 1, 0, &s->devComm);
  if (rc != CUCO_OK) {
    delete s;
    return rc;
  }
  ctx->user = s;
  return CUCO_OK;
}

CUCO_EXPORT int cuco_step(cuco_ctx_t* ctx) {
  const State& s = *(const State*)ctx->user;
  gin_push<<<kBlocks, kThreads, 0, ctx->stream>>>(s.devComm, s.xWin, s.xgWin, (const uint4*)s.x, s.shard_vecs,
                                                   s.shard_bytes, ctx->epoch);
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
