// seed_nccl.cu — expert-parallel MoE layer, the host-driven baseline: counts all-gather, grouped ncclSend/ncclRecv
// dispatch, per-expert cuBLAS SwiGLU MLPs, grouped send/recv back, weighted combine.
// cuco: backends=nccl
//
// World size W, E experts, EL = E/W per rank (rank q owns experts [q*EL, (q+1)*EL)); T token capacity per rank,
// of which T_r are valid (x's valid_bytes / (H*2)); top-K routing; hidden H, expert intermediate I (see
// workload.py). Row-major everywhere. Cap = T*min(K, EL) is the most rows one rank can send to one expert rank.
//
//     x          [T, H]       bf16  input   tokens (first T_r valid)
//     topk_idx   [T, K]       i32   input   expert of each (token, slot)
//     topk_w     [T, K]       f32   input   combine weight of each (token, slot)
//     w_gate_up  [EL, H, 2I]  bf16  input   own experts: gate columns [0, I), up columns [I, 2I)
//     w_down     [EL, I, H]   bf16  input   own experts
//     y          [T, H]       bf16  output  first T_r rows
//   scratch windows (declared below, sizes in workload.scratch_bytes):
//     send   [T*K] wire rows  own assignments sorted by expert (all dests; the slice for rank q is contiguous)
//     recv   [(W-1)*Cap] wire rows from other ranks, grouped per local expert, sources ascending within one
//     out    [W*Cap, H]      expert outputs: rows [0, Cap) for own tokens (in send order), then recv's outputs
//     ret    [T*K, H]        every assignment's expert output back home, in send order
//     counts [W, E]          i32: counts[s][e] = rows source s sends to expert e
//
// One step, everything on ctx->stream:
//   route:    count rows per expert, exclusive scan -> send offsets, one warp per assignment claims its row and
//             copies x[t] into send (pos[t*K+k] = its row); FP8=1: the rows are encoded into wire rows
//             (moe_kernels.cuh: e4m3, one fp32 scale per 128 elements) and send holds what they decode to
//   counts:   ncclAllGather of each rank's counts row; copied to the host and the stream synchronised (cuBLAS
//             takes row counts on the host, so every variant reads them there)
//   dispatch: one group: per (peer, expert) ncclSend of the wire rows / ncclRecv into recv (both sides issue
//             them in expert order, so pairs match); FP8=1: arrived rows decoded to bf16 for the GEMMs
//   experts:  per local expert: own rows straight from send, arrived rows from recv (decoded), each
//             gu = X Wgu (cublasGemmEx), act = silu(gu[:, :I]) * gu[:, I:], out = act Wd (cublasGemmEx)
//   return:   one group: per (peer, expert) ncclSend of out rows back / ncclRecv into ret; own rows copied
//   combine:  y[t] = sum_k topk_w[t, k] * ret[pos[t*K+k]] in fp32, rounded to bf16
// Nothing overlaps: that serial chain is what device_lsa.cu and the search race against.
//
// A wire row is the bf16 row (FP8=0, the default) or H e4m3 bytes and H/128 fp32 scales (FP8=1): with FP8=1 the
// send / recv windows hold wire rows and the bf16 rows the GEMMs read live in two local buffers.
// cuBLAS is column-major, our matrices row-major: out = A @ B is computed as out^T = B^T A^T, i.e.
// cublasGemmEx(N, N, m = cols(B), n = rows(A), k, B, ld cols(B), A, ld k, out, ld cols(B)).
// The step synchronises its stream to read the counts, which stream capture forbids: under capture it gives
// the capture up at once (see refuse_capture) and the harness runs it eagerly.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <nccl.h>

#include <algorithm>
#include <vector>

#include "cuco_abi.h"
#include "moe_kernels.cuh"  // the workload's shared kernels: frozen, on the include path (build.for_workload)

namespace {

using namespace moe_kernels;  // routing, gather, SwiGLU, combine: shared by all three sources

constexpr int kBf16Bytes = 2;
constexpr int kI32Bytes = 4;
constexpr int kF32Bytes = 4;
constexpr int kVecBytes = 16;  // one uint4: 8 bf16
constexpr int kMaxExperts = 1024;
constexpr int kThreads = 256;
constexpr int kCtasPerSm = 4;

#define MOE_TRY(call)                       \
  do {                                      \
    const int moe_rc_ = (call);             \
    if (moe_rc_ != CUCO_OK) return moe_rc_; \
  } while (0)

struct State {
  int T, H, I, E, K, W, EL, rank, Tr;
  size_t cap;                        // T * min(K, EL)
  int row_vecs;                      // H bf16 in 16-byte vectors
  bool fp8;                          // FP8=1: block-scaled e4m3 wire rows
  size_t wire_row;                   // bytes of one dispatched row
  size_t arrived;                    // rows this rank received this step (build_plan)
  int grid;                          // CTAs of the grid-stride kernels
  const __nv_bfloat16* x;
  const int* idx;
  const float* w;
  const __nv_bfloat16* wgu;
  const __nv_bfloat16* wd;
  __nv_bfloat16* y;
  __nv_bfloat16 *send, *recv, *out, *ret;  // send / recv: bf16 rows (the windows themselves when FP8=0)
  uint8_t *send_wire, *recv_wire;    // the send / recv windows: wire rows
  int* counts;                       // [W, E] window, own row = rank
  int* send_off;                     // [E + 1] device, own send offsets
  int* fill;                         // [E] device
  int* pos;                          // [T * K] device
  __nv_bfloat16 *gu, *act;           // [W*Cap, 2I], [W*Cap, I] device
  int* host_counts;                  // [W, E] pinned
  std::vector<size_t> off;           // [W, E + 1] every source's send offsets
  std::vector<size_t> rr;            // [W, EL, W] row in rank q's recv of (q's expert le, source s)
};

bool tensor_ok(const cuco_tensor_t* t, int dtype, size_t bytes) {
  return t != nullptr && t->dtype == dtype && t->local != nullptr && t->capacity_bytes >= bytes;
}

int cuda_ok(cudaError_t e) { return e == cudaSuccess ? CUCO_OK : CUCO_ERR_CUDA; }

ncclResult_t settle(ncclComm_t comm, ncclResult_t r) {
  while (r == ncclInProgress) {
    if (ncclCommGetAsyncError(comm, &r) != ncclSuccess) return ncclSystemError;
  }
  return r;
}

int nccl_ok(ncclComm_t comm, ncclResult_t r) { return settle(comm, r) == ncclSuccess ? CUCO_OK : CUCO_ERR_NCCL; }

// Under stream capture the host read of the counts cannot happen. A synchronise on a capturing stream is
// refused and invalidates the capture, so cudaStreamEndCapture fails, the harness notes "cannot be captured"
// and runs the step eagerly; nothing collective was issued before, so the ranks stay in step.
int refuse_capture(cudaStream_t stream) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &st) != cudaSuccess) return CUCO_ERR_CUDA;
  if (st == cudaStreamCaptureStatusNone) return CUCO_OK;
  (void)cudaStreamSynchronize(stream);
  (void)cudaGetLastError();
  return CUCO_ERR_CUDA;
}

// ---- routing -------------------------------------------------------------------------------------------------

// ---- expert MLP ----------------------------------------------------------------------------------------------

// out[row0 + i] = expert le applied to x rows [0, n); gu / act rows row0.. are its workspace.
int expert_mlp(cublasHandle_t handle, const State& s, int le, const __nv_bfloat16* x, int n, size_t row0,
               cudaStream_t stream) {
  if (n <= 0) return CUCO_OK;
  const float one = 1.0f, zero = 0.0f;
  const int I2 = 2 * s.I;
  __nv_bfloat16* gu = s.gu + row0 * I2;
  __nv_bfloat16* act = s.act + row0 * s.I;
  cublasStatus_t st = cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, I2, n, s.H, &one,
                                   s.wgu + (size_t)le * s.H * I2, CUDA_R_16BF, I2, x, CUDA_R_16BF, s.H, &zero, gu,
                                   CUDA_R_16BF, I2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (st != CUBLAS_STATUS_SUCCESS) return CUCO_ERR_CUBLAS;
  const size_t elems = (size_t)n * s.I;
  const int grid = (int)std::min<size_t>((elems + kThreads - 1) / kThreads, (size_t)s.grid);
  swiglu<<<grid, kThreads, 0, stream>>>(gu, (size_t)n, s.I, act);
  MOE_TRY(cuda_ok(cudaGetLastError()));
  st = cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, s.H, n, s.I, &one, s.wd + (size_t)le * s.I * s.H,
                    CUDA_R_16BF, s.H, act, CUDA_R_16BF, s.I, &zero, s.out + row0 * s.H, CUDA_R_16BF, s.H,
                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  return st == CUBLAS_STATUS_SUCCESS ? CUCO_OK : CUCO_ERR_CUBLAS;
}

// ---- combine -------------------------------------------------------------------------------------------------

// ---- host plan -----------------------------------------------------------------------------------------------

// From the [W, E] counts: every source's send offsets, and for every rank q the recv row of each (expert le of q,
// source s != q): experts in order, sources ascending within an expert.
// Refuses (CUCO_ERR_PARAM, on every rank alike: all hold the same counts) more rows to one rank than the windows
// hold, which only routing with repeated experts per token could produce.
int build_plan(State& s) {
  const int W = s.W, E = s.E, EL = s.EL;
  for (int src = 0; src < W; ++src)
    for (int q = 0; q < W; ++q) {
      size_t rows = 0;
      for (int le = 0; le < EL; ++le) rows += (size_t)s.host_counts[(size_t)src * E + q * EL + le];
      if (rows > s.cap) return CUCO_ERR_PARAM;
    }
  for (int src = 0; src < W; ++src) {
    size_t acc = 0;
    for (int e = 0; e < E; ++e) {
      s.off[(size_t)src * (E + 1) + e] = acc;
      acc += (size_t)s.host_counts[(size_t)src * E + e];
    }
    s.off[(size_t)src * (E + 1) + E] = acc;
  }
  for (int q = 0; q < W; ++q) {
    size_t acc = 0;
    for (int le = 0; le < EL; ++le)
      for (int src = 0; src < W; ++src) {
        s.rr[((size_t)q * EL + le) * W + src] = acc;
        if (src != q) acc += (size_t)s.host_counts[(size_t)src * E + q * EL + le];
      }
    if (q == s.rank) s.arrived = acc;
  }
  return CUCO_OK;
}

size_t cnt(const State& s, int src, int e) { return (size_t)s.host_counts[(size_t)src * s.E + e]; }
size_t off(const State& s, int src, int e) { return s.off[(size_t)src * (s.E + 1) + e]; }
size_t rrow(const State& s, int q, int le, int src) { return s.rr[((size_t)q * s.EL + le) * s.W + src]; }

// T_r from x's valid bytes (whole rows, at most the capacity); topk_idx / topk_w must cover as many rows.
int valid_rows(cuco_ctx_t* ctx, State& s) {
  const cuco_tensor_t* x = cuco_tensor(ctx, "x");
  const cuco_tensor_t* idx = cuco_tensor(ctx, "topk_idx");
  const cuco_tensor_t* w = cuco_tensor(ctx, "topk_w");
  if (x == nullptr || idx == nullptr || w == nullptr) return CUCO_ERR_PARAM;
  const size_t tr = x->valid_bytes / ((size_t)s.H * kBf16Bytes);
  if (tr == 0 || tr > (size_t)s.T || idx->valid_bytes < tr * s.K * kI32Bytes || w->valid_bytes < tr * s.K * kF32Bytes)
    return CUCO_ERR_PARAM;
  s.Tr = (int)tr;
  return CUCO_OK;
}

void release(State* s) {
  if (s == nullptr) return;
  cudaFree(s->send_off);
  cudaFree(s->fill);
  cudaFree(s->pos);
  cudaFree(s->gu);
  cudaFree(s->act);
  cudaFreeHost(s->host_counts);
  free_bf16_dispatch_rows(s->fp8, s->send, s->recv);
  delete s;
}

}  // namespace

// The token-row windows and the counts matrix (workload.scratch_bytes gives the same sizes).
CUCO_EXPORT int cuco_declare_scratch(const cuco_ctx_t* ctx, cuco_scratch_request_t* req, int max_req) {
  const int64_t T = cuco_param(ctx, "T"), H = cuco_param(ctx, "H"), E = cuco_param(ctx, "E"),
                K = cuco_param(ctx, "K");
  const int64_t W = ctx->world_size;
  if (max_req < 5 || T <= 0 || H <= 0 || E <= 0 || K <= 0 || W < 1 || E % W != 0) return 0;  // setup refuses
  const int fp8 = fp8_mode(cuco_param(ctx, "FP8"), H);
  if (fp8 < 0) return 0;
  const size_t cap = (size_t)T * (size_t)std::min<int64_t>(K, E / W);
  const size_t row = (size_t)H * kBf16Bytes;
  const size_t wire = wire_row_bytes((int)H, fp8 == 1);
  const char* names[5] = {"send", "recv", "out", "ret", "counts"};
  const size_t bytes[5] = {(size_t)T * K * wire, std::max<size_t>(1, (size_t)(W - 1) * cap) * wire,
                           (size_t)W * cap * row, (size_t)T * K * row, (size_t)W * E * kI32Bytes};
  for (int i = 0; i < 5; ++i) {
    memset(&req[i], 0, sizeof(req[i]));
    strncpy(req[i].name, names[i], CUCO_NAME_LEN - 1);
    req[i].bytes = bytes[i];
  }
  return 5;
}

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  CUCO_CHECK_ABI(ctx);
  if (ctx->backend != CUCO_BACKEND_NCCL || ctx->nccl_comm == nullptr) return CUCO_ERR_BACKEND;
  if (ctx->cublas == nullptr) return CUCO_ERR_PARAM;
  const int64_t T = cuco_param(ctx, "T"), H = cuco_param(ctx, "H"), I = cuco_param(ctx, "I"),
                E = cuco_param(ctx, "E"), K = cuco_param(ctx, "K");
  const int W = ctx->world_size;
  if (T <= 0 || H <= 0 || I <= 0 || E <= 0 || K <= 0 || W < 1 || E % W != 0 || K > E || E > kMaxExperts)
    return CUCO_ERR_PARAM;
  if ((H * kBf16Bytes) % kVecBytes != 0 || (I * kBf16Bytes) % kVecBytes != 0) return CUCO_ERR_PARAM;
  if (T * K >= ((int64_t)1 << 31) || (int64_t)W * T * std::min<int64_t>(K, E / W) >= ((int64_t)1 << 31))
    return CUCO_ERR_PARAM;  // rows are int in the kernels and in cuBLAS
  const int fp8 = fp8_mode(cuco_param(ctx, "FP8"), H);
  if (fp8 < 0) return CUCO_ERR_PARAM;
  const int EL = (int)(E / W);
  const size_t cap = (size_t)T * (size_t)std::min<int64_t>(K, EL);
  const size_t row = (size_t)H * kBf16Bytes;
  const size_t wire = wire_row_bytes((int)H, fp8 == 1);
  cuco_tensor_t* x = cuco_tensor(ctx, "x");
  cuco_tensor_t* idx = cuco_tensor(ctx, "topk_idx");
  cuco_tensor_t* w = cuco_tensor(ctx, "topk_w");
  cuco_tensor_t* wgu = cuco_tensor(ctx, "w_gate_up");
  cuco_tensor_t* wd = cuco_tensor(ctx, "w_down");
  cuco_tensor_t* y = cuco_tensor(ctx, "y");
  cuco_tensor_t* send = cuco_scratch(ctx, "send");
  cuco_tensor_t* recv = cuco_scratch(ctx, "recv");
  cuco_tensor_t* out = cuco_scratch(ctx, "out");
  cuco_tensor_t* ret = cuco_scratch(ctx, "ret");
  cuco_tensor_t* counts = cuco_scratch(ctx, "counts");
  if (!tensor_ok(x, CUCO_DTYPE_BF16, (size_t)T * row) || !tensor_ok(idx, CUCO_DTYPE_I32, (size_t)T * K * kI32Bytes) ||
      !tensor_ok(w, CUCO_DTYPE_F32, (size_t)T * K * kF32Bytes) ||
      !tensor_ok(wgu, CUCO_DTYPE_BF16, (size_t)EL * H * 2 * I * kBf16Bytes) ||
      !tensor_ok(wd, CUCO_DTYPE_BF16, (size_t)EL * I * H * kBf16Bytes) || !tensor_ok(y, CUCO_DTYPE_BF16, (size_t)T * row))
    return CUCO_ERR_PARAM;
  if (send == nullptr || recv == nullptr || out == nullptr || ret == nullptr || counts == nullptr ||
      send->capacity_bytes < (size_t)T * K * wire || out->capacity_bytes < (size_t)W * cap * row ||
      recv->capacity_bytes < (size_t)(W - 1) * cap * wire || ret->capacity_bytes < (size_t)T * K * row ||
      counts->capacity_bytes < (size_t)W * E * kI32Bytes)
    return CUCO_ERR_PARAM;
  int sms = ctx->sm_count;
  if (sms <= 0 && cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx->device) != cudaSuccess)
    return CUCO_ERR_CUDA;

  State* s = new State();
  s->T = (int)T;
  s->H = (int)H;
  s->I = (int)I;
  s->E = (int)E;
  s->K = (int)K;
  s->W = W;
  s->EL = EL;
  s->rank = ctx->rank;
  s->cap = cap;
  s->row_vecs = (int)(row / kVecBytes);
  s->grid = sms * kCtasPerSm;
  s->x = (const __nv_bfloat16*)x->local;
  s->idx = (const int*)idx->local;
  s->w = (const float*)w->local;
  s->wgu = (const __nv_bfloat16*)wgu->local;
  s->wd = (const __nv_bfloat16*)wd->local;
  s->y = (__nv_bfloat16*)y->local;
  s->fp8 = fp8 == 1;
  s->wire_row = wire;
  s->send_wire = (uint8_t*)send->local;
  s->recv_wire = (uint8_t*)recv->local;
  s->out = (__nv_bfloat16*)out->local;
  s->ret = (__nv_bfloat16*)ret->local;
  s->counts = (int*)counts->local;
  s->off.assign((size_t)W * (E + 1), 0);
  s->rr.assign((size_t)W * EL * W, 0);
  const size_t rows_all = (size_t)W * cap;
  int rc = cuda_ok(cudaMalloc(&s->send_off, sizeof(int) * (size_t)(E + 1)));
  if (rc == CUCO_OK) rc = cuda_ok(cudaMalloc(&s->fill, sizeof(int) * (size_t)E));
  if (rc == CUCO_OK) rc = cuda_ok(cudaMalloc(&s->pos, sizeof(int) * (size_t)T * K));
  if (rc == CUCO_OK) rc = cuda_ok(cudaMalloc(&s->gu, rows_all * 2 * I * kBf16Bytes));
  if (rc == CUCO_OK) rc = cuda_ok(cudaMalloc(&s->act, rows_all * I * kBf16Bytes));
  if (rc == CUCO_OK) rc = cuda_ok(cudaMallocHost(&s->host_counts, sizeof(int) * (size_t)W * E));
  if (rc == CUCO_OK)
    rc = cuda_ok(bf16_dispatch_rows(s->fp8, send->local, recv->local, (size_t)T * K * row,
                                    std::max<size_t>(1, (size_t)(W - 1) * cap) * row, s->send, s->recv));
  if (rc != CUCO_OK) {
    release(s);
    return rc;
  }
  ctx->user = s;
  return CUCO_OK;
}

CUCO_EXPORT int cuco_step(cuco_ctx_t* ctx) {
  if (ctx->user == nullptr) return CUCO_ERR_PARAM;
  State& s = *(State*)ctx->user;
  MOE_TRY(refuse_capture(ctx->stream));
  ncclComm_t comm = (ncclComm_t)ctx->nccl_comm;
  cudaStream_t st = ctx->stream;
  cublasHandle_t handle = (cublasHandle_t)ctx->cublas;
  if (cublasSetStream(handle, st) != CUBLAS_STATUS_SUCCESS) return CUCO_ERR_CUBLAS;
  MOE_TRY(valid_rows(ctx, s));
  const int me = s.rank, W = s.W, E = s.E, EL = s.EL;
  const size_t H = (size_t)s.H;
  int* my_counts = s.counts + (size_t)me * E;

  // route
  const int n = s.Tr * s.K;
  MOE_TRY(cuda_ok(cudaMemsetAsync(my_counts, 0, sizeof(int) * (size_t)E, st)));
  count_experts<<<std::max(1, std::min(s.grid, (n + kThreads - 1) / kThreads)), kThreads, 0, st>>>(s.idx, n, E,
                                                                                                   my_counts);
  scan_counts<<<1, kThreads, 0, st>>>(my_counts, E, s.send_off, s.fill);
  gather_rows<<<s.grid, kThreads, 0, st>>>((const uint4*)s.x, s.idx, n, s.K, E, s.row_vecs, s.send_off, s.fill,
                                           s.pos, (uint4*)s.send);
  MOE_TRY(cuda_ok(cudaGetLastError()));
  if (s.fp8) MOE_TRY(cuda_ok(fp8_encode_send(s.send, s.send_wire, n, s.H, s.grid, kThreads, st)));

  // counts: every rank's row, then on the host
  if (W > 1) MOE_TRY(nccl_ok(comm, ncclAllGather(my_counts, s.counts, (size_t)E, ncclInt32, comm, st)));
  MOE_TRY(cuda_ok(cudaMemcpyAsync(s.host_counts, s.counts, sizeof(int) * (size_t)W * E, cudaMemcpyDeviceToHost, st)));
  MOE_TRY(cuda_ok(cudaStreamSynchronize(st)));
  MOE_TRY(build_plan(s));

  // dispatch
  if (W > 1) {
    MOE_TRY(nccl_ok(comm, ncclGroupStart()));
    for (int q = 0; q < W; ++q) {
      if (q == me) continue;
      for (int le = 0; le < EL; ++le) {
        const size_t c = cnt(s, me, q * EL + le);
        if (c)
          MOE_TRY(nccl_ok(comm, ncclSend(s.send_wire + off(s, me, q * EL + le) * s.wire_row, c * s.wire_row, ncclUint8, q,
                                         comm, st)));
      }
      for (int le = 0; le < EL; ++le) {
        const size_t c = cnt(s, q, me * EL + le);
        if (c)
          MOE_TRY(nccl_ok(comm, ncclRecv(s.recv_wire + rrow(s, me, le, q) * s.wire_row, c * s.wire_row, ncclUint8, q,
                                         comm, st)));
      }
    }
    MOE_TRY(nccl_ok(comm, ncclGroupEnd()));
    if (s.fp8) MOE_TRY(cuda_ok(fp8_decode_recv(s.recv_wire, (int)s.arrived, s.H, s.recv, s.grid, kThreads, st)));
  }

  // experts: own rows from send (out rows [0, Cap) in send order), arrived rows from recv (out rows Cap + recv row)
  const size_t own0 = off(s, me, me * EL);
  for (int le = 0; le < EL; ++le) {
    const int e = me * EL + le;
    MOE_TRY(expert_mlp(handle, s, le, s.send + off(s, me, e) * H, (int)cnt(s, me, e), off(s, me, e) - own0, st));
    size_t arrived = 0, first = 0;
    bool have_first = false;
    for (int src = 0; src < W; ++src) {
      if (src == me) continue;
      if (!have_first) {
        first = rrow(s, me, le, src);
        have_first = true;
      }
      arrived += cnt(s, src, e);
    }
    if (arrived) MOE_TRY(expert_mlp(handle, s, le, s.recv + first * H, (int)arrived, s.cap + first, st));
  }

  // return
  if (W > 1) {
    MOE_TRY(nccl_ok(comm, ncclGroupStart()));
    for (int q = 0; q < W; ++q) {
      if (q == me) continue;
      for (int le = 0; le < EL; ++le) {
        const size_t c = cnt(s, q, me * EL + le);
        if (c)
          MOE_TRY(nccl_ok(comm, ncclSend(s.out + (s.cap + rrow(s, me, le, q)) * H, c * H, ncclBfloat16, q, comm, st)));
      }
      for (int le = 0; le < EL; ++le) {
        const size_t c = cnt(s, me, q * EL + le);
        if (c) MOE_TRY(nccl_ok(comm, ncclRecv(s.ret + off(s, me, q * EL + le) * H, c * H, ncclBfloat16, q, comm, st)));
      }
    }
    MOE_TRY(nccl_ok(comm, ncclGroupEnd()));
  }
  const size_t own_rows = off(s, me, (me + 1) * EL) - own0;
  if (own_rows)
    MOE_TRY(cuda_ok(cudaMemcpyAsync(s.ret + own0 * H, s.out, own_rows * H * kBf16Bytes, cudaMemcpyDeviceToDevice, st)));

  // combine
  combine<<<std::max(1, std::min(s.Tr, s.grid)), kThreads, 0, st>>>((const uint4*)s.ret, s.pos, s.w, s.Tr, s.K,
                                                                     s.row_vecs, (uint4*)s.y);
  return cuda_ok(cudaGetLastError());
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) {
  release((State*)ctx->user);
  ctx->user = nullptr;
  return CUCO_OK;
}
