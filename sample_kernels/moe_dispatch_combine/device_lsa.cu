// device_lsa.cu — expert-parallel MoE layer, device-initiated baseline in NCCL-LSA form (one source, both
// backends): tokens are STORED into the expert ranks' receive windows, per-source epoch flags say they landed,
// own tokens are computed while remote ones travel, and results go back the same way (or are read in place).
// cuco: backends=nccl,symm
//
// Same computation, tensors, scratch windows and row layouts as seed_nccl.cu (read its header first): route into
// `send` (own assignments sorted by expert), rows of rank q's experts from source s land in q's `recv` grouped
// per local expert, expert outputs go to `out` (own rows first, Cap rows, then the arrived rows' outputs),
// results come home into `ret` in send order, y[t] = sum_k topk_w[t, k] * (expert output of (t, k)).
//
//   ctx->stream:  route ─ push_counts ─ wait(counts) ─ counts to host, sync ─ plan to device ─┬─ own GEMMs ──
//                 ... ─ wait(dispatch flags) ─ arrived GEMMs ─ (kPushBack) copy own outputs, wait(combine
//                 flags), combine from ret  |  (kPull) signal outputs ready, wait, combine reading peers' out
//   side stream:  (kTwoStream)  └▶ push_rows(dispatch) ─────────────── └▶ push_rows(return, kPushBack) ─▶ join
//
//   push_rows: work items are chunks of kChunkRows rows of a host-built segment list (a segment = the rows of
//              one (expert, peer) pair, contiguous on both sides), copied with 16-byte stores through
//              ncclGetLsaPointer into the peer's window; then the peer's flag(s) are raised
//
// Why the host still reads the counts: cuBLAS takes each GEMM's row count on the host, so every variant
// synchronises once per step on the counts exchange (a few KB) before any row moves. The exchange itself is
// device-initiated (push_counts stores each rank's counts row into every peer's counts window and raises a
// flag). Under stream capture the step gives the capture up at once (refuse_capture, as in the seeds).
//
// Design space (the knob block; every combination compiles and is meant as a complete, correct variant):
//   kPlacement  kSequential  dispatch push, own GEMMs, wait, arrived GEMMs, return push, all on ctx->stream:
//                            no overlap (the device-initiated twin of the seed)
//               kTwoStream   pushes on a high-priority side stream: own tokens' GEMMs run while remote tokens
//                            travel, and the return push of outputs runs beside the own-output copy; joined
//                            back to ctx->stream before cuco_step returns
//   kSyncScope  kRank        one flag per source: the push kernel's last CTA (an ever-growing CTA counter,
//                            acq_rel at system scope) raises it on every peer
//               kCta         one flag per (source, push CTA): every CTA raises its own after its stores; no
//                            counter, W*kPutBlocks waits on the receiver
//   kIssuer     kWarp / kCta: the unit that owns one chunk of rows and stores it with lane-strided vectors
//   kCombine    kPushBack    expert ranks store outputs into the sources' ret windows (flags as above), the
//                            combine reads local memory
//               kPull        expert ranks only raise an "outputs ready" flag; the combine loads each (token, k)
//                            row straight from the expert rank's out window (no return copy)
//   kPutBlocks  CTAs of each push kernel: SMs taken from the concurrent GEMMs vs transfer bandwidth
//   kChunkRows  rows per work item: load balance vs per-item overhead
// Dispatch wire format: the workload's FP8 parameter, not a knob (it changes the numbers the layer computes, so
// the reference follows it). FP8=0 moves bf16 rows; FP8=1 moves block-scaled e4m3 rows (H bytes and H/128 fp32
// scales, moe_kernels.cuh): every routed row is encoded right after the gather (own rows then computed on what
// they decode to), the push moves wire rows into the recv window, and the arrived rows are decoded into a
// local bf16 buffer after their flags. Outputs travel back in bf16 either way.
//
// Signalling (cuco_abi.h): ctx->epoch is 1 on the first step and +1 per step; producers store `epoch`
// (cuco_signal: st.release.sys after the CTA's barrier, so the CTA's stores are published) and consumers wait
// for `>= epoch` (cuco_wait: ld.acquire.sys), so nothing is reset and a stale flag never satisfies a wait. Every
// push kernel is launched even with no rows to move, so its flags always arrive. Candidate flag words: counts
// [0, W), dispatch [W, W + W*P), return [W + W*P, W + 2*W*P), outputs ready [W + 2*W*P, W + 2*W*P + W), with
// P = kPutBlocks (kCta) or 1 (kRank). Reuse of every window across steps relies on the harness: each step ends
// with a synchronise and a host + device barrier.
//
// Build: nvcc ... (nccl backend, links NCCL and cuBLAS) or with -DCUCO_BUILD_SYMM=1 (lsa_compat.h over the
// harness's peer tables: 2-4 ranks sharing one GPU run the same kernels). At world size 1 nothing moves between
// ranks: route, own GEMMs, combine. All GEMMs stay on ctx->stream (one cuBLAS handle, one workspace).
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cuda/atomic>
#include <vector>

#include "cuco_lsa.h"
#include "moe_kernels.cuh"  // the workload's shared kernels: frozen, on the include path (build.for_workload)

namespace {

using namespace moe_kernels;  // routing, gather, SwiGLU, combine: shared by all three sources

enum class Placement { kSequential, kTwoStream };
enum class SyncScope { kRank, kCta };
enum class Issuer { kWarp, kCta };
enum class Combine { kPushBack, kPull };

// EVOLVE-BLOCK-START knobs
constexpr Placement kPlacement = Placement::kTwoStream;  // knob: {Placement::kSequential, Placement::kTwoStream}
constexpr SyncScope kSyncScope = SyncScope::kRank;  // knob: {SyncScope::kRank, SyncScope::kCta}
constexpr Issuer kIssuer = Issuer::kWarp;  // knob: {Issuer::kWarp, Issuer::kCta}
constexpr Combine kCombine = Combine::kPushBack;  // knob: {Combine::kPushBack, Combine::kPull}
constexpr int kPutBlocks = 32;  // knob: {8, 16, 32, 64}
constexpr int kChunkRows = 8;  // knob: {2, 4, 8, 16, 32}
// EVOLVE-BLOCK-END

// EVOLVE-BLOCK-START tuning
constexpr int kPutThreads = 512;   // threads per push CTA
constexpr int kLoadBatch = 4;      // 16-byte loads each thread keeps in flight before storing them
constexpr int kWaitThreads = 256;  // threads of the wait kernels (one flag each, strided)
constexpr int kCombineThreads = 256;
// EVOLVE-BLOCK-END

constexpr int kBf16Bytes = 2;
constexpr int kI32Bytes = 4;
constexpr int kF32Bytes = 4;
constexpr int kVecBytes = 16;  // one uint4: 8 bf16
constexpr int kMaxExperts = 1024;
constexpr int kThreads = 256;
constexpr int kCtasPerSm = 4;
// No kernel here uses an LSA barrier; one keeps the devComm request identical across variants.
constexpr int kLsaBarriers = 1;
// Flags per source for the push kernels' signals.
constexpr int kFlagsPerSource = kSyncScope == SyncScope::kCta ? kPutBlocks : 1;

static_assert(kPutThreads % kWarpSize == 0 && kPutThreads <= 1024, "kPutThreads: whole warps, at most 1024");
static_assert(kPutBlocks > 0 && kChunkRows > 0 && kLoadBatch > 0, "grid, chunk and batch must be positive");
static_assert(kWaitThreads > 0 && kCombineThreads > 0, "wait / combine kernels need threads");

#define MOE_TRY(call)                       \
  do {                                      \
    const int moe_rc_ = (call);             \
    if (moe_rc_ != CUCO_OK) return moe_rc_; \
  } while (0)

// Rows [src_row, src_row + rows) of a local buffer go to rows [dst_row, ...) of dst_rank's window.
struct Segment {
  int src_row, dst_rank, dst_row, rows;
};

// The per-step plan the host uploads (one copy): two segment lists with their chunk prefixes, and for kPull the
// first out row on the expert's rank of each expert's rows from this rank.
struct PlanView {
  Segment* disp;      // [E]
  int* disp_chunk0;   // [E + 1]: chunk index where segment i starts; [n] = total chunks
  Segment* back;      // [E]
  int* back_chunk0;   // [E + 1]
  int* base_row;      // [E]
  int n_disp, n_back;
};

struct PushArgs {
  const uint4* src;               // local rows (send or out)
  ncclWindow_t dst;               // recv (dispatch) or ret (return) window
  const Segment* segs;
  const int* chunk0;
  int n_segs;
  int row_vecs;
  uint64_t* const* flag_peers;
  size_t flag_base;               // first word of this push's flags on the receiver
  int world, rank;
  unsigned long long* done_ctas;  // local, ever growing (kRank)
  uint64_t epoch;
};

struct State {
  int T, H, I, E, K, W, EL, rank, Tr;
  size_t cap;
  int row_vecs;
  int grid;
  bool fp8;                          // FP8=1: block-scaled e4m3 wire rows
  int wire_vecs;                     // one dispatched (wire) row in 16-byte vectors
  size_t arrived;                    // rows this rank received this step (build_plan)
  const __nv_bfloat16* x;
  const int* idx;
  const float* w;
  const __nv_bfloat16* wgu;
  const __nv_bfloat16* wd;
  __nv_bfloat16* y;
  __nv_bfloat16 *send, *recv, *out, *ret;  // send / recv: bf16 rows (the windows themselves when FP8=0)
  uint8_t *send_wire, *recv_wire;    // the send / recv windows: wire rows
  int* counts;
  ncclWindow_t recv_win, out_win, ret_win, counts_win;
  int* send_off;
  int* fill;
  int* pos;
  __nv_bfloat16 *gu, *act;
  int* host_counts;                  // [W, E] pinned
  std::vector<size_t> off;
  std::vector<size_t> rr;
  uint64_t* const* flag_peers;
  const uint64_t* my_flags;
  int* plan_host;                    // pinned, plan_ints ints
  int* plan_dev;
  size_t plan_ints;
  PlanView plan;                     // device pointers into plan_dev
  unsigned long long* done_ctas;     // [2]: dispatch, return
  ncclDevComm dc;
  bool dc_made;
  cudaStream_t side;
  cudaEvent_t ev_plan, ev_gemm, ev_join;
};

bool tensor_ok(const cuco_tensor_t* t, int dtype, size_t bytes) {
  return t != nullptr && t->dtype == dtype && t->local != nullptr && t->capacity_bytes >= bytes;
}

int cuda_ok(cudaError_t e) { return e == cudaSuccess ? CUCO_OK : CUCO_ERR_CUDA; }

size_t flag_counts() { return 0; }
size_t flag_dispatch(int W) { return (size_t)W; }
size_t flag_return(int W) { return (size_t)W + (size_t)W * kFlagsPerSource; }
size_t flag_outputs(int W) { return (size_t)W + 2 * (size_t)W * kFlagsPerSource; }
size_t flag_words(int W) { return flag_outputs(W) + (size_t)W; }

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

// ---- dispatch wire format (FP8=1; nothing to do with bf16 rows) ---------------------------------------------

// The first n send rows into wire rows, and send rewritten with what they decode to (own rows' GEMMs read it).
int encode_dispatch_rows(const State& s, int n, cudaStream_t stream) {
  return s.fp8 ? cuda_ok(fp8_encode_send(s.send, s.send_wire, n, s.H, s.grid, kThreads, stream)) : CUCO_OK;
}

// The rows that arrived in the recv window, decoded into the bf16 rows the arrived GEMMs read.
int decode_arrived_rows(const State& s, cudaStream_t stream) {
  return s.fp8 ? cuda_ok(fp8_decode_recv(s.recv_wire, (int)s.arrived, s.H, s.recv, s.grid, kThreads, stream))
               : CUCO_OK;
}

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

// EVOLVE-BLOCK-START kernels
template <Issuer I>
__host__ __device__ constexpr int unit_threads() {
  return I == Issuer::kWarp ? kWarpSize : kPutThreads;
}

// Push chunks of segments into peers' windows, then raise this source's flag(s) on every peer. Launched with
// exactly kPutBlocks CTAs (the kCta flags are per CTA), and always launched, so the flags arrive even when
// there is nothing to move.
template <Issuer I, SyncScope Y>
__global__ void __launch_bounds__(kPutThreads) push_rows(PushArgs a) {
  constexpr int kUnitThreads = unit_threads<I>();
  constexpr int kUnitsPerCta = kPutThreads / kUnitThreads;
  constexpr int kStride = kUnitThreads;
  const int lane = (int)threadIdx.x % kUnitThreads;
  const int n_units = (int)gridDim.x * kUnitsPerCta;
  const int items = a.n_segs > 0 ? a.chunk0[a.n_segs] : 0;
  for (int item = (int)blockIdx.x * kUnitsPerCta + (int)threadIdx.x / kUnitThreads; item < items;
       item += n_units) {
    int lo = 0, hi = a.n_segs - 1;  // the last segment starting at or before this chunk
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (a.chunk0[mid] <= item) lo = mid; else hi = mid - 1;
    }
    const Segment sg = a.segs[lo];
    const int r0 = (item - a.chunk0[lo]) * kChunkRows;
    const int rows = min(kChunkRows, sg.rows - r0);
    const uint4* src = a.src + (size_t)(sg.src_row + r0) * a.row_vecs;
    uint4* dst = (uint4*)ncclGetLsaPointer(a.dst, (size_t)(sg.dst_row + r0) * a.row_vecs * kVecBytes, sg.dst_rank);
    const int n = rows * a.row_vecs;
    for (int base = lane; base < n; base += kStride * kLoadBatch) {
      uint4 buf[kLoadBatch];
#pragma unroll
      for (int k = 0; k < kLoadBatch; ++k) {
        const int i = base + k * kStride;
        if (i < n) buf[k] = src[i];
      }
#pragma unroll
      for (int k = 0; k < kLoadBatch; ++k) {
        const int i = base + k * kStride;
        if (i < n) dst[i] = buf[k];
      }
    }
  }
  __syncthreads();  // every store of the CTA precedes its signal
  if (threadIdx.x != 0) return;
  if constexpr (Y == SyncScope::kCta) {
    for (int q = 0; q < a.world; ++q)
      if (q != a.rank)
        cuco_signal(cuco_user_flag(a.flag_peers, q, a.flag_base + (size_t)a.rank * kFlagsPerSource + blockIdx.x),
                    a.epoch);
  } else {
    // One acq_rel count at system scope per CTA; whoever completes a multiple of the grid is the launch's last
    // CTA, has acquired every other CTA's stores and publishes them with the flags.
    cuda::atomic_ref<unsigned long long, cuda::thread_scope_system> done(*a.done_ctas);
    const unsigned long long before = done.fetch_add(1ull, cuda::memory_order_acq_rel);
    if ((before + 1) % gridDim.x == 0)
      for (int q = 0; q < a.world; ++q)
        if (q != a.rank) cuco_signal(cuco_user_flag(a.flag_peers, q, a.flag_base + (size_t)a.rank), a.epoch);
  }
}

// This rank's counts row into row `rank` of every peer's counts window, then the peer's counts flag.
__global__ void push_counts(ncclWindow_t counts_win, const int* my_counts, int E, int world, int rank,
                            uint64_t* const* flag_peers, size_t flag_base, uint64_t epoch) {
  for (int q = 0; q < world; ++q) {
    if (q == rank) continue;
    int* dst = (int*)ncclGetLsaPointer(counts_win, (size_t)rank * E * kI32Bytes, q);
    for (int e = threadIdx.x; e < E; e += blockDim.x) dst[e] = my_counts[e];
  }
  __syncthreads();
  if (threadIdx.x == 0)
    for (int q = 0; q < world; ++q)
      if (q != rank) cuco_signal(cuco_user_flag(flag_peers, q, flag_base + (size_t)rank), epoch);
}

// Stream-ordered after this rank's GEMMs (kPull): publish the out window, then raise "outputs ready" on peers.
__global__ void signal_outputs(uint64_t* const* flag_peers, int world, int rank, size_t flag_base, uint64_t epoch) {
  __threadfence_system();
  for (int q = threadIdx.x; q < world; q += blockDim.x)
    if (q != rank) cuco_signal(cuco_user_flag(flag_peers, q, flag_base + (size_t)rank), epoch);
}

// Hold the stream until flags base + s*per_source + b (every source s != rank, b < per_source) reached epoch.
__global__ void wait_sources(const uint64_t* my_flags, size_t base, int world, int rank, int per_source,
                             uint64_t epoch) {
  const int n = world * per_source;
  for (int i = threadIdx.x; i < n; i += blockDim.x)
    if (i / per_source != rank) cuco_wait(my_flags + base + i, epoch);
  __syncthreads();
}

// y[t] = sum_k w[t, k] * ret[pos[t*K + k]] (kPushBack), fp32 accumulation; a CTA per token.
__global__ void combine_local(const uint4* ret, const int* pos, const float* w, int Tr, int K, int row_vecs,
                              uint4* y) {
  for (int t = blockIdx.x; t < Tr; t += gridDim.x) {
    for (int v = threadIdx.x; v < row_vecs; v += blockDim.x) {
      float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
      for (int k = 0; k < K; ++k) {
        const int p = pos[t * K + k];
        if (p < 0) continue;
        const float wk = w[t * K + k];
        const uint4 q = ret[(size_t)p * row_vecs + v];
        const __nv_bfloat16* b = (const __nv_bfloat16*)&q;
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[i] += wk * __bfloat162float(b[i]);
      }
      uint4 o;
      __nv_bfloat16* ob = (__nv_bfloat16*)&o;
#pragma unroll
      for (int i = 0; i < 8; ++i) ob[i] = __float2bfloat16(acc[i]);
      y[(size_t)t * row_vecs + v] = o;
    }
  }
}

// kPull: the same sum, each (t, k) row loaded from expert e's rank q's out window at
// base_row[e] + (pos - send_off[e]). Plain loads: the rows were written by another rank during this step.
__global__ void combine_pull(ncclWindow_t out_win, const int* idx, const int* pos, const int* send_off,
                             const int* base_row, const float* w, int Tr, int K, int EL, int row_vecs, uint4* y) {
  for (int t = blockIdx.x; t < Tr; t += gridDim.x) {
    for (int v = threadIdx.x; v < row_vecs; v += blockDim.x) {
      float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
      for (int k = 0; k < K; ++k) {
        const int j = t * K + k;
        const int p = pos[j];
        if (p < 0) continue;
        const int e = idx[j];
        const size_t row = (size_t)base_row[e] + (size_t)(p - send_off[e]);
        const uint4* src = (const uint4*)ncclGetLsaPointer(out_win, (row * row_vecs + v) * kVecBytes, e / EL);
        const uint4 q = *src;
        const float wk = w[j];
        const __nv_bfloat16* b = (const __nv_bfloat16*)&q;
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[i] += wk * __bfloat162float(b[i]);
      }
      uint4 o;
      __nv_bfloat16* ob = (__nv_bfloat16*)&o;
#pragma unroll
      for (int i = 0; i < 8; ++i) ob[i] = __float2bfloat16(acc[i]);
      y[(size_t)t * row_vecs + v] = o;
    }
  }
}
// EVOLVE-BLOCK-END

// Segment lists, chunk prefixes and base rows for this step, written into the pinned plan buffer (uploaded by
// the schedule). Dispatch: own rows for rank q's expert le -> q's recv at its row of (le, me). Return: outputs
// of the rows rank s sent for my expert le -> s's ret at s's send offset of that expert.
void fill_plan(State& s) {
  const int me = s.rank, W = s.W, EL = s.EL, E = s.E;
  PlanView& p = s.plan;
  int* h = s.plan_host;
  Segment* disp = (Segment*)h;
  int* disp_chunk0 = h + 4 * (size_t)E;
  Segment* back = (Segment*)(h + 5 * (size_t)E + 1);
  int* back_chunk0 = h + 9 * (size_t)E + 1;
  int* base_row = h + 10 * (size_t)E + 2;
  int nd = 0, nb = 0, cd = 0, cb = 0;
  for (int q = 0; q < W; ++q) {
    if (q == me) continue;
    for (int le = 0; le < EL; ++le) {
      const int e = q * EL + le;
      const int c = (int)cnt(s, me, e);
      if (c) {
        disp[nd] = Segment{(int)off(s, me, e), q, (int)rrow(s, q, le, me), c};
        disp_chunk0[nd++] = cd;
        cd += (c + kChunkRows - 1) / kChunkRows;
      }
      const int cr = (int)cnt(s, q, me * EL + le);
      if (cr) {
        back[nb] = Segment{(int)(s.cap + rrow(s, me, le, q)), q, (int)off(s, q, me * EL + le), cr};
        back_chunk0[nb++] = cb;
        cb += (cr + kChunkRows - 1) / kChunkRows;
      }
    }
  }
  disp_chunk0[nd] = cd;
  back_chunk0[nb] = cb;
  p.n_disp = nd;
  p.n_back = nb;
  const size_t own0 = off(s, me, me * EL);
  for (int e = 0; e < E; ++e) {
    const int q = e / EL;
    base_row[e] = q == me ? (int)(off(s, me, e) - own0) : (int)(s.cap + rrow(s, q, e % EL, me));
  }
}

void release(cuco_ctx_t* ctx, State* s) {
  if (s == nullptr) return;
  if (s->ev_join) cudaEventDestroy(s->ev_join);
  if (s->ev_gemm) cudaEventDestroy(s->ev_gemm);
  if (s->ev_plan) cudaEventDestroy(s->ev_plan);
  if (s->side) cudaStreamDestroy(s->side);
  cudaFree(s->done_ctas);
  cudaFree(s->plan_dev);
  cudaFreeHost(s->plan_host);
  cudaFree(s->send_off);
  cudaFree(s->fill);
  cudaFree(s->pos);
  cudaFree(s->gu);
  cudaFree(s->act);
  cudaFreeHost(s->host_counts);
  free_bf16_dispatch_rows(s->fp8, s->send, s->recv);
  if (s->dc_made) cuco_devcomm_destroy(ctx, &s->dc);
  delete s;
}

// EVOLVE-BLOCK-START schedule
int launch_push(const State& s, bool dispatch, uint64_t epoch, cudaStream_t stream) {
  PushArgs a;
  a.src = dispatch ? (const uint4*)s.send_wire : (const uint4*)s.out;
  a.dst = dispatch ? s.recv_win : s.ret_win;
  a.segs = dispatch ? s.plan.disp : s.plan.back;
  a.chunk0 = dispatch ? s.plan.disp_chunk0 : s.plan.back_chunk0;
  a.n_segs = dispatch ? s.plan.n_disp : s.plan.n_back;
  a.row_vecs = dispatch ? s.wire_vecs : s.row_vecs;
  a.flag_peers = s.flag_peers;
  a.flag_base = dispatch ? flag_dispatch(s.W) : flag_return(s.W);
  a.world = s.W;
  a.rank = s.rank;
  a.done_ctas = s.done_ctas + (dispatch ? 0 : 1);
  a.epoch = epoch;
  push_rows<kIssuer, kSyncScope><<<kPutBlocks, kPutThreads, 0, stream>>>(a);
  return cuda_ok(cudaGetLastError());
}

int launch_wait(const State& s, size_t base, int per_source, uint64_t epoch, cudaStream_t stream) {
  wait_sources<<<1, kWaitThreads, 0, stream>>>(s.my_flags, base, s.W, s.rank, per_source, epoch);
  return cuda_ok(cudaGetLastError());
}

// Own rows (from send) of every local expert, or the arrived rows (from recv).
int expert_gemms(cublasHandle_t handle, const State& s, bool own, cudaStream_t stream) {
  const int me = s.rank, EL = s.EL;
  const size_t H = (size_t)s.H;
  const size_t own0 = off(s, me, me * EL);
  for (int le = 0; le < EL; ++le) {
    const int e = me * EL + le;
    if (own) {
      MOE_TRY(expert_mlp(handle, s, le, s.send + off(s, me, e) * H, (int)cnt(s, me, e), off(s, me, e) - own0, stream));
      continue;
    }
    size_t arrived = 0, first = 0;
    bool have_first = false;
    for (int src = 0; src < s.W; ++src) {
      if (src == me) continue;
      if (!have_first) {
        first = rrow(s, me, le, src);
        have_first = true;
      }
      arrived += cnt(s, src, e);
    }
    if (arrived) MOE_TRY(expert_mlp(handle, s, le, s.recv + first * H, (int)arrived, s.cap + first, stream));
  }
  return CUCO_OK;
}

int schedule(cuco_ctx_t* ctx, State& s) {
  cudaStream_t st = ctx->stream;
  cublasHandle_t handle = (cublasHandle_t)ctx->cublas;
  if (cublasSetStream(handle, st) != CUBLAS_STATUS_SUCCESS) return CUCO_ERR_CUBLAS;
  const uint64_t epoch = ctx->epoch;
  const int me = s.rank, W = s.W, E = s.E;
  const bool remote = W > 1;
  constexpr bool kSide = kPlacement == Placement::kTwoStream;
  cudaStream_t push_stream = kSide ? s.side : st;
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
  MOE_TRY(encode_dispatch_rows(s, n, st));

  // counts exchange, then the plan on the host and back on the device
  if (remote) {
    push_counts<<<1, kThreads, 0, st>>>(s.counts_win, my_counts, E, W, me, s.flag_peers, flag_counts(), epoch);
    MOE_TRY(cuda_ok(cudaGetLastError()));
    MOE_TRY(launch_wait(s, flag_counts(), 1, epoch, st));
  }
  MOE_TRY(cuda_ok(cudaMemcpyAsync(s.host_counts, s.counts, sizeof(int) * (size_t)W * E, cudaMemcpyDeviceToHost, st)));
  MOE_TRY(cuda_ok(cudaStreamSynchronize(st)));
  MOE_TRY(build_plan(s));
  fill_plan(s);
  MOE_TRY(cuda_ok(cudaMemcpyAsync(s.plan_dev, s.plan_host, sizeof(int) * s.plan_ints, cudaMemcpyHostToDevice, st)));

  // dispatch beside the own tokens' GEMMs, then the arrived tokens' GEMMs
  if (remote) {
    if constexpr (kSide) {
      MOE_TRY(cuda_ok(cudaEventRecord(s.ev_plan, st)));
      MOE_TRY(cuda_ok(cudaStreamWaitEvent(s.side, s.ev_plan, 0)));
    }
    MOE_TRY(launch_push(s, true, epoch, push_stream));
  }
  MOE_TRY(expert_gemms(handle, s, true, st));
  if (remote) {
    MOE_TRY(launch_wait(s, flag_dispatch(W), kFlagsPerSource, epoch, st));
    MOE_TRY(decode_arrived_rows(s, st));
    MOE_TRY(expert_gemms(handle, s, false, st));
  }

  // combine
  const size_t H = (size_t)s.H;
  const int combine_grid = std::max(1, std::min(s.Tr, s.grid));
  if constexpr (kCombine == Combine::kPushBack) {
    if (remote) {
      if constexpr (kSide) {
        MOE_TRY(cuda_ok(cudaEventRecord(s.ev_gemm, st)));
        MOE_TRY(cuda_ok(cudaStreamWaitEvent(s.side, s.ev_gemm, 0)));
      }
      MOE_TRY(launch_push(s, false, epoch, push_stream));
    }
    const size_t own0 = off(s, me, me * s.EL);
    const size_t own_rows = off(s, me, (me + 1) * s.EL) - own0;
    if (own_rows)
      MOE_TRY(cuda_ok(cudaMemcpyAsync(s.ret + own0 * H, s.out, own_rows * H * kBf16Bytes, cudaMemcpyDeviceToDevice, st)));
    if (remote) MOE_TRY(launch_wait(s, flag_return(W), kFlagsPerSource, epoch, st));
    combine_local<<<combine_grid, kCombineThreads, 0, st>>>((const uint4*)s.ret, s.pos, s.w, s.Tr, s.K, s.row_vecs,
                                                            (uint4*)s.y);
  } else {
    if (remote) {
      signal_outputs<<<1, kWarpSize, 0, st>>>(s.flag_peers, W, me, flag_outputs(W), epoch);
      MOE_TRY(cuda_ok(cudaGetLastError()));
      MOE_TRY(launch_wait(s, flag_outputs(W), 1, epoch, st));
    }
    combine_pull<<<combine_grid, kCombineThreads, 0, st>>>(s.out_win, s.idx, s.pos, s.send_off, s.plan.base_row, s.w,
                                                           s.Tr, s.K, s.EL, s.row_vecs, (uint4*)s.y);
  }
  MOE_TRY(cuda_ok(cudaGetLastError()));
  if constexpr (kSide) {
    if (remote) {
      MOE_TRY(cuda_ok(cudaEventRecord(s.ev_join, s.side)));
      MOE_TRY(cuda_ok(cudaStreamWaitEvent(st, s.ev_join, 0)));
    }
  }
  return CUCO_OK;
}
// EVOLVE-BLOCK-END

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
  if (ctx->backend != cuco_build_backend) return CUCO_ERR_BACKEND;  // built for the other backend
  if (ctx->cublas == nullptr) return CUCO_ERR_PARAM;
  const int64_t T = cuco_param(ctx, "T"), H = cuco_param(ctx, "H"), I = cuco_param(ctx, "I"),
                E = cuco_param(ctx, "E"), K = cuco_param(ctx, "K");
  const int W = ctx->world_size;
  if (T <= 0 || H <= 0 || I <= 0 || E <= 0 || K <= 0 || W < 1 || E % W != 0 || K > E || E > kMaxExperts)
    return CUCO_ERR_PARAM;
  if ((H * kBf16Bytes) % kVecBytes != 0 || (I * kBf16Bytes) % kVecBytes != 0) return CUCO_ERR_PARAM;
  if (T * K >= ((int64_t)1 << 31) || (int64_t)W * T * std::min<int64_t>(K, E / W) >= ((int64_t)1 << 31) ||
      (int64_t)W * T * std::min<int64_t>(K, E / W) * (H * kBf16Bytes / kVecBytes) >= ((int64_t)1 << 31))
    return CUCO_ERR_PARAM;  // rows (and a chunk's vectors) are int in the kernels and in cuBLAS
  const int fp8 = fp8_mode(cuco_param(ctx, "FP8"), H);
  if (fp8 < 0) return CUCO_ERR_PARAM;
  const int EL = (int)(E / W);
  const size_t cap = (size_t)T * (size_t)std::min<int64_t>(K, EL);
  const size_t row = (size_t)H * kBf16Bytes;
  const size_t wire = wire_row_bytes((int)H, fp8 == 1);
  if (ctx->flags.local == nullptr || ctx->flags.peers == nullptr ||
      ctx->flags.count < CUCO_FLAGS_RESERVED + flag_words(W))
    return CUCO_ERR_PARAM;  // not enough candidate flag words
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
      send->local == nullptr || recv->local == nullptr || out->local == nullptr || ret->local == nullptr ||
      counts->local == nullptr || send->capacity_bytes < (size_t)T * K * wire ||
      out->capacity_bytes < (size_t)W * cap * row || recv->capacity_bytes < (size_t)(W - 1) * cap * wire ||
      ret->capacity_bytes < (size_t)T * K * row || counts->capacity_bytes < (size_t)W * E * kI32Bytes)
    return CUCO_ERR_PARAM;
  // Peers store into recv, ret and counts and (kPull) load from out.
  if (cuco_window(recv) == nullptr || cuco_window(ret) == nullptr || cuco_window(out) == nullptr ||
      cuco_window(counts) == nullptr)
    return CUCO_ERR_BACKEND;
  int sms = ctx->sm_count;
  if (sms <= 0 && cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx->device) != cudaSuccess)
    return CUCO_ERR_CUDA;

  State* s = new State();
  ctx->user = s;
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
  s->wire_vecs = (int)(wire / kVecBytes);
  s->fp8 = fp8 == 1;
  s->grid = sms * kCtasPerSm;
  s->x = (const __nv_bfloat16*)x->local;
  s->idx = (const int*)idx->local;
  s->w = (const float*)w->local;
  s->wgu = (const __nv_bfloat16*)wgu->local;
  s->wd = (const __nv_bfloat16*)wd->local;
  s->y = (__nv_bfloat16*)y->local;
  s->send_wire = (uint8_t*)send->local;
  s->recv_wire = (uint8_t*)recv->local;
  s->out = (__nv_bfloat16*)out->local;
  s->ret = (__nv_bfloat16*)ret->local;
  s->counts = (int*)counts->local;
  s->recv_win = cuco_window(recv);
  s->out_win = cuco_window(out);
  s->ret_win = cuco_window(ret);
  s->counts_win = cuco_window(counts);
  s->flag_peers = ctx->flags.peers;
  s->my_flags = ctx->flags.local + CUCO_FLAGS_RESERVED;
  s->off.assign((size_t)W * (E + 1), 0);
  s->rr.assign((size_t)W * EL * W, 0);
  s->plan_ints = 11 * (size_t)E + 2;  // see fill_plan
  const size_t rows_all = (size_t)W * cap;

  int rc = cuco_devcomm_create(ctx, kLsaBarriers, &s->dc);
  if (rc == CUCO_OK) {
    s->dc_made = true;
    // LSA must reach every rank (one NVLink domain), and world rank r must be LSA rank r.
    if (ncclTeamLsa(s->dc).nRanks != W || s->dc.lsaRank != ctx->rank) rc = CUCO_ERR_BACKEND;
  }
  if (rc == CUCO_OK) rc = cuda_ok(cudaMalloc(&s->send_off, sizeof(int) * (size_t)(E + 1)));
  if (rc == CUCO_OK) rc = cuda_ok(cudaMalloc(&s->fill, sizeof(int) * (size_t)E));
  if (rc == CUCO_OK) rc = cuda_ok(cudaMalloc(&s->pos, sizeof(int) * (size_t)T * K));
  if (rc == CUCO_OK) rc = cuda_ok(cudaMalloc(&s->gu, rows_all * 2 * I * kBf16Bytes));
  if (rc == CUCO_OK) rc = cuda_ok(cudaMalloc(&s->act, rows_all * I * kBf16Bytes));
  if (rc == CUCO_OK) rc = cuda_ok(cudaMallocHost(&s->host_counts, sizeof(int) * (size_t)W * E));
  if (rc == CUCO_OK)
    rc = cuda_ok(bf16_dispatch_rows(s->fp8, send->local, recv->local, (size_t)T * K * row,
                                    std::max<size_t>(1, (size_t)(W - 1) * cap) * row, s->send, s->recv));
  if (rc == CUCO_OK) rc = cuda_ok(cudaMallocHost(&s->plan_host, sizeof(int) * s->plan_ints));
  if (rc == CUCO_OK) rc = cuda_ok(cudaMalloc(&s->plan_dev, sizeof(int) * s->plan_ints));
  if (rc == CUCO_OK) rc = cuda_ok(cudaMalloc(&s->done_ctas, 2 * sizeof(unsigned long long)));
  if (rc == CUCO_OK) rc = cuda_ok(cudaMemset(s->done_ctas, 0, 2 * sizeof(unsigned long long)));
  if (rc == CUCO_OK) {
    int* d = s->plan_dev;  // same offsets as fill_plan's host view
    s->plan.disp = (Segment*)d;
    s->plan.disp_chunk0 = d + 4 * (size_t)E;
    s->plan.back = (Segment*)(d + 5 * (size_t)E + 1);
    s->plan.back_chunk0 = d + 9 * (size_t)E + 1;
    s->plan.base_row = d + 10 * (size_t)E + 2;
  }
  // The side stream gets the highest priority so push CTAs are scheduled ahead of queued GEMM CTAs.
  int lowest = 0, highest = 0;
  if (rc == CUCO_OK) rc = cuda_ok(cudaDeviceGetStreamPriorityRange(&lowest, &highest));
  if (rc == CUCO_OK) rc = cuda_ok(cudaStreamCreateWithPriority(&s->side, cudaStreamNonBlocking, highest));
  if (rc == CUCO_OK) rc = cuda_ok(cudaEventCreateWithFlags(&s->ev_plan, cudaEventDisableTiming));
  if (rc == CUCO_OK) rc = cuda_ok(cudaEventCreateWithFlags(&s->ev_gemm, cudaEventDisableTiming));
  if (rc == CUCO_OK) rc = cuda_ok(cudaEventCreateWithFlags(&s->ev_join, cudaEventDisableTiming));
  if (rc == CUCO_OK) rc = cuda_ok(cudaDeviceSynchronize());  // the CTA counters are zero before step 1
  if (rc != CUCO_OK) {
    release(ctx, s);
    ctx->user = nullptr;
  }
  return rc;
}

CUCO_EXPORT int cuco_step(cuco_ctx_t* ctx) {
  if (ctx->user == nullptr) return CUCO_ERR_PARAM;
  State& s = *(State*)ctx->user;
  MOE_TRY(refuse_capture(ctx->stream));
  MOE_TRY(valid_rows(ctx, s));
  return schedule(ctx, s);
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) {
  State* s = (State*)ctx->user;
  if (s == nullptr) return CUCO_OK;
  const int rc = s->dc_made ? cuco_devcomm_destroy(ctx, &s->dc) : CUCO_OK;
  s->dc_made = false;
  release(ctx, s);
  ctx->user = nullptr;
  return rc;
}
