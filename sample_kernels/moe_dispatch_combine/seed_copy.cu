// seed_copy.cu — expert-parallel MoE layer, host-driven through the copy engines (the seed where host NCCL cannot
// run, e.g. `symm`): flag handshakes, then peer cudaMemcpyAsync pulls for dispatch and return.
// cuco: backends=symm,nccl
//
// Same computation, tensors, scratch windows and row layouts as seed_nccl.cu (read its header first); only the
// transport differs. One step, everything on ctx->stream:
//   route:    as in seed_nccl.cu; this rank's counts row lands in its own counts window, row `rank`
//   ready:    signal_all raises candidate flag kReady + rank on every rank (release, system scope, after a
//             system fence: the route kernels before it on this stream wrote send and counts); wait_all spins
//             until every rank's kReady flag reached ctx->epoch (acquire)
//   counts:   each rank's counts row is copied to the host straight from that rank's window; the stream is
//             synchronised (cuBLAS takes row counts on the host)
//   dispatch: per (source, local expert) one cudaMemcpyAsync PULL of wire rows from the source's send window
//             into recv (FP8=1: encoded before the ready flag, arrived rows decoded after the pulls)
//   experts:  as in seed_nccl.cu
//   done:     signal_all / wait_all on kOutReady: every rank's expert outputs are in its out window
//   return:   per (expert rank, expert) one cudaMemcpyAsync pull from that rank's out window into ret
//   combine:  as in seed_nccl.cu
// Flags follow the ABI's epoch protocol (cuco_abi.h): producers store ctx->epoch, consumers wait for >= epoch, so
// nothing is reset. Reuse of the windows across steps relies on the harness: every step ends with a synchronise
// and a host + device barrier, so nobody rewrites send / out while a peer still pulls from them.
// The copies are done by DMA engines through the mappings the harness made (torch symmetric memory under `symm`,
// NVLink peer mappings under `nccl`). Under `symm` the ranks share one GPU and one L2: timings say nothing
// about NVLink. Nothing overlaps, on purpose (the simple baseline).
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <vector>

#include "cuco_lsa.h"  // cuco_signal / cuco_wait and the flag layout (CUCO_FLAGS_RESERVED)
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
constexpr size_t kReady = 0;  // candidate flag words: [kReady, kReady + W) send + counts of rank s are ready
// [kOutReady, kOutReady + W): expert outputs of rank s are ready (kOutReady = W, set in State)

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
  void* const* send_peers;           // host tables of every rank's windows
  void* const* out_peers;
  void* const* counts_peers;
  uint64_t* const* flag_peers;       // device table of every rank's flag words
  const uint64_t* my_flags;          // this rank's first candidate word
};

bool tensor_ok(const cuco_tensor_t* t, int dtype, size_t bytes) {
  return t != nullptr && t->dtype == dtype && t->local != nullptr && t->capacity_bytes >= bytes;
}

int cuda_ok(cudaError_t e) { return e == cudaSuccess ? CUCO_OK : CUCO_ERR_CUDA; }

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

// ---- handshake ----------------------------------------------------------------------------------------------

// Raise flag `word` on every rank: everything this stream ran before (stream order) is published first.
__global__ void signal_all(uint64_t* const* flag_peers, int W, size_t word, uint64_t epoch) {
  __threadfence_system();
  for (int q = threadIdx.x; q < W; q += blockDim.x) cuco_signal(cuco_user_flag(flag_peers, q, word), epoch);
}

// Hold the stream until flags [first, first + W) of this rank reached the epoch.
__global__ void wait_all(const uint64_t* flags, int W, uint64_t epoch) {
  for (int q = threadIdx.x; q < W; q += blockDim.x) cuco_wait(flags + q, epoch);
  __syncthreads();
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
  // Any backend whose windows have peer tables; the flag region must hold 2W candidate words.
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
  if (send->peers_host == nullptr || out->peers_host == nullptr || counts->peers_host == nullptr ||
      ctx->flags.local == nullptr || ctx->flags.peers == nullptr ||
      ctx->flags.count < CUCO_FLAGS_RESERVED + kReady + 2 * (size_t)W)
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
  s->send_peers = send->peers_host;
  s->out_peers = out->peers_host;
  s->counts_peers = counts->peers_host;
  s->flag_peers = ctx->flags.peers;
  s->my_flags = ctx->flags.local + CUCO_FLAGS_RESERVED;
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

  // ready: send and counts of every rank, then the counts matrix on the host
  const uint64_t epoch = ctx->epoch;
  const size_t out_ready = kReady + (size_t)W;
  signal_all<<<1, kWarpSize, 0, st>>>(s.flag_peers, W, kReady + me, epoch);
  wait_all<<<1, kWarpSize, 0, st>>>(s.my_flags + kReady, W, epoch);
  MOE_TRY(cuda_ok(cudaGetLastError()));
  for (int src = 0; src < W; ++src)
    MOE_TRY(cuda_ok(cudaMemcpyAsync(s.host_counts + (size_t)src * E, (const int*)s.counts_peers[src] + (size_t)src * E,
                                    sizeof(int) * (size_t)E, cudaMemcpyDefault, st)));
  MOE_TRY(cuda_ok(cudaStreamSynchronize(st)));
  MOE_TRY(build_plan(s));

  // dispatch: pull my experts' rows from every other rank's send window
  for (int src = 0; src < W; ++src) {
    if (src == me) continue;
    const uint8_t* peer_send = (const uint8_t*)s.send_peers[src];
    for (int le = 0; le < EL; ++le) {
      const size_t c = cnt(s, src, me * EL + le);
      if (c)
        MOE_TRY(cuda_ok(cudaMemcpyAsync(s.recv_wire + rrow(s, me, le, src) * s.wire_row,
                                        peer_send + off(s, src, me * EL + le) * s.wire_row, c * s.wire_row,
                                        cudaMemcpyDefault, st)));
    }
  }
  if (s.fp8) MOE_TRY(cuda_ok(fp8_decode_recv(s.recv_wire, (int)s.arrived, s.H, s.recv, s.grid, kThreads, st)));

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

  // done: every rank's outputs, then pull mine back from every expert rank's out window
  signal_all<<<1, kWarpSize, 0, st>>>(s.flag_peers, W, out_ready + me, epoch);
  wait_all<<<1, kWarpSize, 0, st>>>(s.my_flags + out_ready, W, epoch);
  MOE_TRY(cuda_ok(cudaGetLastError()));
  for (int q = 0; q < W; ++q) {
    if (q == me) continue;
    const __nv_bfloat16* peer_out = (const __nv_bfloat16*)s.out_peers[q];
    for (int le = 0; le < EL; ++le) {
      const size_t c = cnt(s, me, q * EL + le);
      if (c)
        MOE_TRY(cuda_ok(cudaMemcpyAsync(s.ret + off(s, me, q * EL + le) * H, peer_out + (s.cap + rrow(s, q, le, me)) * H,
                                        c * H * kBf16Bytes, cudaMemcpyDefault, st)));
    }
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
