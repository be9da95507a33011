// gemm_allgather after Stage B (a SCRIPTED WRONG answer, kept as a test fixture: it does not compile): the host ncclAllGather is
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

constexpr int kBlocks = 32;    // knob: {8, 16, 32, 64}
constexpr int kThreads = 512;  // knob: {128, 256, 512, 1024}

namespace {

constexpr int kBf16Bytes = 2;

struct State {
  int M, Nr, K, rows_per_rank;
  const __nv_bfloat16* x;
  const __nv_bfloat16* w;
  __nv_bfloat16* y;
  __nv_bfloat16* xg;
  ncclWindow_t xgWin;
  size_t shard_vecs;  // this rank's x in 16-byte vectors
  ncclDevComm devComm;
};

bool tensor_ok(const cuco_tensor_t* t, int64_t rows, int64_t cols) {
  return t != nullptr && t->dtype == CUCO_DTYPE_BF16 && t->ndim == 2 && t->shape[0] == rows &&
         t->shape[1] == cols && t->local != nullptr &&
         t->capacity_bytes >= (size_t)rows * (size_t)cols * kBf16Bytes;
}

int gemm_rows(cublasHandle_t h, const State& s, const __nv_bfloat16* a, int row0, int rows) {
  const float one = 1.0f, zero = 0.0f;
  cublasStatus_t st = cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, s.Nr, rows, s.K, &one, s.w, CUDA_R_16BF, s.Nr,
                                   a, CUDA_R_16BF, s.K, &zero, s.y + (size_t)row0 * s.Nr, CUDA_R_16BF, s.Nr,
                                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  return st == CUBLAS_STATUS_SUCCESS ? CUCO_OK : CUCO_ERR_CUBLAS;
}

}  // namespace

__global__ void __launch_bounds__(kThreads)
push_shard(ncclDevComm devComm, ncclWindow_t xgWin, const uint4* __restrict__ x, size_t nVec) {
  ncclLsaBarierSession<ncclCoopCta> bar(ncclCoopCta(), devComm, ncclTeamTagLsa{}, blockIdx.x);
  bar.sync(ncclCoopCta(), cuda::memory_order_relaxed);
  const int me = devComm.lsaRank;
  const int world = devComm.lsaSize;
  const size_t dst_offset = (size_t)me * nVec * sizeof(uint4);
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < nVec; i += (size_t)gridDim.x * blockDim.x) {
    const uint4 v = x[i];
    for (int k = 0; k < world; ++k) {
      int peer = me + k;
      if (peer >= world) peer -= world;
      ((uint4*)ncclGetLsaPointer(xgWin, dst_offset, peer))[i] = v;
    }
  }
  bar.sync(ncclCoopCta(), cuda::memory_order_acq_rel);
}

CUCO_EXPORT int cuco_declare_scratch(const cuco_ctx_t* ctx, cuco_scratch_request_t* req, int max_req) {
  const int64_t M = cuco_param(ctx, "M"), K = cuco_param(ctx, "K");
  if (max_req < 1 || M <= 0 || K <= 0) return 0;
  memset(&req[0], 0, sizeof(req[0]));
  strncpy(req[0].name, "xg", CUCO_NAME_LEN - 1);
  req[0].bytes = (size_t)M * (size_t)K * kBf16Bytes;
  return 1;
}

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  CUCO_CHECK_ABI(ctx);
  if (ctx->cublas == nullptr) return CUCO_ERR_PARAM;
  const int64_t M = cuco_param(ctx, "M"), N = cuco_param(ctx, "N"), K = cuco_param(ctx, "K");
  const int W = ctx->world_size;
  if (M <= 0 || N <= 0 || K <= 0 || W < 1 || M % W != 0 || N % W != 0) return CUCO_ERR_PARAM;
  cuco_tensor_t* x = cuco_tensor(ctx, "x");
  cuco_tensor_t* w = cuco_tensor(ctx, "w");
  cuco_tensor_t* y = cuco_tensor(ctx, "y");
  cuco_tensor_t* xg = cuco_scratch(ctx, "xg");
  if (!tensor_ok(x, M / W, K) || !tensor_ok(w, K, N / W) || !tensor_ok(y, M, N / W)) return CUCO_ERR_PARAM;
  if (xg == nullptr || xg->local == nullptr || cuco_window(xg) == nullptr ||
      xg->capacity_bytes < (size_t)M * (size_t)K * kBf16Bytes)
    return CUCO_ERR_PARAM;
  const size_t shard_bytes = (size_t)(M / W) * (size_t)K * kBf16Bytes;
  if (shard_bytes % sizeof(uint4) != 0) return CUCO_ERR_PARAM;

  State* s = new State();
  s->M = (int)M;
  s->Nr = (int)(N / W);
  s->K = (int)K;
  s->rows_per_rank = (int)(M / W);
  s->x = (const __nv_bfloat16*)x->local;
  s->w = (const __nv_bfloat16*)w->local;
  s->y = (__nv_bfloat16*)y->local;
  s->xg = (__nv_bfloat16*)xg->local;
  s->xgWin = cuco_window(xg);
  s->shard_vecs = shard_bytes / sizeof(uint4);
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
  if (cublasSetStream(h, ctx->stream) != CUBLAS_STATUS_SUCCESS) return CUCO_ERR_CUBLAS;
  return gemm_rows(h, s, s.xg, 0, s.M);
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) {
  State* s = (State*)ctx->user;
  if (s == nullptr) return CUCO_OK;
  const int rc = cuco_devcomm_destroy(ctx, &s->devComm);
  delete s;
  ctx->user = nullptr;
  return rc;
}
