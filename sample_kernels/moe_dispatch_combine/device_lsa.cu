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
// (cuco_signal: a release store at system scope after the CTA's barrier, so the CTA's stores are published) and
// consumers wait for `>= epoch` (cuco_wait: acquire loads at system scope), so nothing is reset and a stale flag
// never satisfies a wait. Every push kernel is launched even with no rows to move, so its flags always arrive.
// Candidate flag words: counts [0, W), dispatch [W, W + W*P), return [W + W*P, W + 2*W*P), outputs ready
// [W + 2*W*P, W + 2*W*P + W), with P = kPutBlocks (kCta) or 1 (kRank). Reuse of every window across steps relies
// on the harness: each step ends with a synchronise and a host + device barrier.
//
// Build: nvcc ... (nccl backend, links NCCL and cuBLAS) or with -DCUCO_BUILD_SYMM=1 (lsa_compat.h over the
// harness's peer tables: 2-4 ranks sharing one GPU run the same kernels). At world size 1 nothing moves between
// ranks: route, own GEMMs, combine. All GEMMs stay on ctx->stream (one cuBLAS handle, one workspace).
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cuda/atomic>

#include "cuco_lsa.h"
#include "moe_host.cuh"     // the workload's shared host code: frozen, on the include path (build.for_workload)
#include "moe_kernels.cuh"  // the workload's shared kernels: frozen, on the include path (build.for_workload)

namespace {

using namespace moe_host;     // the layer's windows, routing, plan and expert MLP: shared by all three sources
using namespace moe_kernels;  // routing, gather, SwiGLU, combine kernels: shared by all three sources

enum class Placement { kSequential, kTwoStream };
enum class SyncScope { kRank, kCta };
enum class Issuer { kWarp, kCta };
enum class Combine { kPushBack, kPull };

// EVOLVE-BLOCK-START knobs
constexpr Placement kPlacement = Placement::kTwoStream;  // knob: {Placement::kSequential, Placement::kTwoStream}
constexpr SyncScope kSyncScope = SyncScope::kRank;  // knob: {SyncScope::kRank, SyncScope::kCta}
constexpr Issuer kIssuer = Issuer::kWarp;  // knob: {Issuer::kWarp, Issuer::kCta}
constexpr Combine kCombine = Combine::kPushBack;  // knob: {Combine::kPushBack, Combine::kPull}
constexpr int kPutBlocks = 32;  // knob: range 4..64 step 4
constexpr int kChunkRows = 8;  // knob: {2, 4, 8, 16, 32}
// EVOLVE-BLOCK-END

// EVOLVE-BLOCK-START tuning
constexpr int kPutThreads = 512;   // threads per push CTA
constexpr int kLoadBatch = 4;      // 16-byte loads each thread keeps in flight before storing them
constexpr int kWaitThreads = 256;  // threads of the wait kernels (one flag each, strided)
constexpr int kCombineThreads = 256;
// EVOLVE-BLOCK-END

constexpr const char* kWindowNames[kWindows] = {"send", "recv", "out", "ret", "counts"};
// No kernel here uses an LSA barrier; one keeps the devComm request identical across variants.
constexpr int kLsaBarriers = 1;
// Flags per source for the push kernels' signals.
constexpr int kFlagsPerSource = kSyncScope == SyncScope::kCta ? kPutBlocks : 1;

static_assert(kPutThreads % kWarpSize == 0 && kPutThreads <= 1024, "kPutThreads: whole warps, at most 1024");
static_assert(kPutBlocks > 0 && kChunkRows > 0 && kLoadBatch > 0, "grid, chunk and batch must be positive");
static_assert(kWaitThreads > 0 && kCombineThreads > 0, "wait / combine kernels need threads");

// Rows [src_row, src_row + rows) of a local buffer go to rows [dst_row, ...) of dst_rank's window.
struct Segment {
  int src_row, dst_rank, dst_row, rows;
};
static_assert(sizeof(Segment) == kSegmentInts * sizeof(int), "plan_layout counts a segment as kSegmentInts ints");

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

// The lists' pointers into a plan buffer of plan_layout(E).ints ints: the pinned host copy or the device one.
PlanView plan_view(int* buf, size_t E) {
  const PlanLayout at = plan_layout(E);
  PlanView v{};
  v.disp = (Segment*)(buf + at.disp);
  v.disp_chunk0 = buf + at.disp_chunk0;
  v.back = (Segment*)(buf + at.back);
  v.back_chunk0 = buf + at.back_chunk0;
  v.base_row = buf + at.base_row;
  return v;
}

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

struct State : Layer {
  int wire_vecs;                     // one dispatched (wire) row in 16-byte vectors
  ncclWindow_t recv_win, out_win, ret_win, counts_win;
  uint64_t* const* flag_peers;
  const uint64_t* my_flags;
  int* plan_host;                    // pinned, plan_ints ints
  int* plan_dev;
  size_t plan_ints;
  PlanView plan;                     // device pointers into plan_dev
  unsigned long long* done_ctas;     // [2]: dispatch, return
  ncclDevComm dc;
  bool dc_made;
  cuco_side_stream_t side;           // kTwoStream: the pushes' stream

  // Free everything setup made (also after a failed setup); cuco_state<State>::close calls it.
  int release(cuco_ctx_t* ctx) {
    cuco_side_stream_destroy(&side);
    cudaFree(done_ctas);
    cudaFree(plan_dev);
    cudaFreeHost(plan_host);
    close();
    return dc_made ? cuco_devcomm_destroy(ctx, &dc) : CUCO_OK;
  }
};

size_t flag_counts() { return 0; }
size_t flag_dispatch(int W) { return (size_t)W; }
size_t flag_return(int W) { return (size_t)W + (size_t)W * kFlagsPerSource; }
size_t flag_outputs(int W) { return (size_t)W + 2 * (size_t)W * kFlagsPerSource; }
size_t flag_words(int W) { return flag_outputs(W) + (size_t)W; }

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
        bf16x8_accumulate(acc, wk, q);
      }
      y[(size_t)t * row_vecs + v] = bf16x8_pack(acc);
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
        bf16x8_accumulate(acc, wk, q);
      }
      y[(size_t)t * row_vecs + v] = bf16x8_pack(acc);
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
  const PlanView h = plan_view(s.plan_host, (size_t)E);
  Segment* disp = h.disp;
  int* disp_chunk0 = h.disp_chunk0;
  Segment* back = h.back;
  int* back_chunk0 = h.back_chunk0;
  int* base_row = h.base_row;
  int nd = 0, nb = 0, cd = 0, cb = 0;
  for (int q = 0; q < W; ++q) {
    if (q == me) continue;
    for (int le = 0; le < EL; ++le) {
      const int e = q * EL + le;
      const int c = (int)s.cnt(me, e);
      if (c) {
        disp[nd] = Segment{(int)s.off(me, e), q, (int)s.rrow(q, le, me), c};
        disp_chunk0[nd++] = cd;
        cd += (c + kChunkRows - 1) / kChunkRows;
      }
      const int cr = (int)s.cnt(q, me * EL + le);
      if (cr) {
        back[nb] = Segment{(int)(s.cap + s.rrow(me, le, q)), q, (int)s.off(q, me * EL + le), cr};
        back_chunk0[nb++] = cb;
        cb += (cr + kChunkRows - 1) / kChunkRows;
      }
    }
  }
  disp_chunk0[nd] = cd;
  back_chunk0[nb] = cb;
  p.n_disp = nd;
  p.n_back = nb;
  const size_t own0 = s.off(me, me * EL);
  for (int e = 0; e < E; ++e) {
    const int q = e / EL;
    base_row[e] = q == me ? (int)(s.off(me, e) - own0) : (int)(s.cap + s.rrow(q, e % EL, me));
  }
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
  return cuco_cuda_status(cudaGetLastError());
}

int launch_wait(const State& s, size_t base, int per_source, uint64_t epoch, cudaStream_t stream) {
  wait_sources<<<1, kWaitThreads, 0, stream>>>(s.my_flags, base, s.W, s.rank, per_source, epoch);
  return cuco_cuda_status(cudaGetLastError());
}

// Own rows (from send) of every local expert, or the arrived rows (from recv).
int expert_gemms(cublasHandle_t handle, const State& s, bool own, cudaStream_t stream) {
  for (int le = 0; le < s.EL; ++le)
    CUCO_TRY(own ? s.expert_own(handle, le, stream) : s.expert_arrived(handle, le, stream));
  return CUCO_OK;
}

int schedule(cuco_ctx_t* ctx, State& s) {
  cudaStream_t st = ctx->stream;
  cublasHandle_t handle = (cublasHandle_t)ctx->cublas;
  CUCO_CUBLAS_TRY(cublasSetStream(handle, st));
  const uint64_t epoch = ctx->epoch;
  const int me = s.rank, W = s.W, E = s.E;
  const bool remote = W > 1;
  constexpr bool kSide = kPlacement == Placement::kTwoStream;
  cudaStream_t push_stream = kSide ? s.side.stream : st;
  int* my_counts = s.counts + (size_t)me * E;

  // route (FP8=1: and encode)
  CUCO_TRY(s.route(st));

  // counts exchange, then the plan on the host and back on the device
  if (remote) {
    push_counts<<<1, kThreads, 0, st>>>(s.counts_win, my_counts, E, W, me, s.flag_peers, flag_counts(), epoch);
    CUCO_CUDA_TRY(cudaGetLastError());
    CUCO_TRY(launch_wait(s, flag_counts(), 1, epoch, st));
  }
  CUCO_CUDA_TRY(cudaMemcpyAsync(s.host_counts, s.counts, sizeof(int) * (size_t)W * E, cudaMemcpyDeviceToHost, st));
  CUCO_CUDA_TRY(cudaStreamSynchronize(st));
  CUCO_TRY(s.build_plan());
  fill_plan(s);
  CUCO_CUDA_TRY(cudaMemcpyAsync(s.plan_dev, s.plan_host, sizeof(int) * s.plan_ints, cudaMemcpyHostToDevice, st));

  // dispatch beside the own tokens' GEMMs, then the arrived tokens' GEMMs
  if (remote) {
    if constexpr (kSide) CUCO_TRY(cuco_side_stream_fork(&s.side, st));  // the plan is on the device
    CUCO_TRY(launch_push(s, true, epoch, push_stream));
  }
  CUCO_TRY(expert_gemms(handle, s, true, st));
  if (remote) {
    CUCO_TRY(launch_wait(s, flag_dispatch(W), kFlagsPerSource, epoch, st));
    CUCO_TRY(s.decode_arrived_rows(st));
    CUCO_TRY(expert_gemms(handle, s, false, st));
  }

  // combine
  const int combine_grid = std::max(1, std::min(s.Tr, s.grid));
  if constexpr (kCombine == Combine::kPushBack) {
    if (remote) {
      if constexpr (kSide) CUCO_TRY(cuco_side_stream_fork(&s.side, st));  // the arrived rows' outputs are in out
      CUCO_TRY(launch_push(s, false, epoch, push_stream));
    }
    CUCO_TRY(s.copy_own_outputs(st));
    if (remote) CUCO_TRY(launch_wait(s, flag_return(W), kFlagsPerSource, epoch, st));
    combine_local<<<combine_grid, kCombineThreads, 0, st>>>((const uint4*)s.ret, s.pos, s.w, s.Tr, s.K, s.row_vecs,
                                                            (uint4*)s.y);
  } else {
    if (remote) {
      signal_outputs<<<1, kWarpSize, 0, st>>>(s.flag_peers, W, me, flag_outputs(W), epoch);
      CUCO_CUDA_TRY(cudaGetLastError());
      CUCO_TRY(launch_wait(s, flag_outputs(W), 1, epoch, st));
    }
    combine_pull<<<combine_grid, kCombineThreads, 0, st>>>(s.out_win, s.idx, s.pos, s.send_off, s.plan.base_row, s.w,
                                                           s.Tr, s.K, s.EL, s.row_vecs, (uint4*)s.y);
  }
  CUCO_CUDA_TRY(cudaGetLastError());
  if constexpr (kSide) {
    if (remote) CUCO_TRY(cuco_side_stream_join(&s.side, st));
  }
  return CUCO_OK;
}
// EVOLVE-BLOCK-END

}  // namespace

// The token-row windows and the counts matrix (workload.scratch_bytes gives the same sizes).
CUCO_EXPORT int cuco_declare_scratch(const cuco_ctx_t* ctx, cuco_scratch_request_t* req, int max_req) {
  return declare_windows(ctx, kWindowNames, req, max_req);
}

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  CUCO_CHECK_ABI(ctx);
  if (ctx->backend != cuco_build_backend) return CUCO_ERR_BACKEND;  // built for the other backend
  const int W = ctx->world_size;
  if (ctx->flags.local == nullptr || ctx->flags.peers == nullptr ||
      ctx->flags.count < CUCO_FLAGS_RESERVED + flag_words(W))
    return CUCO_ERR_PARAM;  // not enough candidate flag words

  State* s = cuco_state<State>::open(ctx);
  int rc = s->open(ctx, kWindowNames);
  // A chunk's vectors are int in the push kernel too.
  if (rc == CUCO_OK && (int64_t)W * (int64_t)s->cap * s->row_vecs >= ((int64_t)1 << 31)) rc = CUCO_ERR_PARAM;
  if (rc == CUCO_OK) {
    s->wire_vecs = (int)(s->wire_row / kVecBytes);
    // Peers store into recv, ret and counts and (kPull) load from out.
    s->recv_win = cuco_window(s->windows[kRecv]);
    s->out_win = cuco_window(s->windows[kOut]);
    s->ret_win = cuco_window(s->windows[kRet]);
    s->counts_win = cuco_window(s->windows[kCounts]);
    if (s->recv_win == nullptr || s->ret_win == nullptr || s->out_win == nullptr || s->counts_win == nullptr)
      rc = CUCO_ERR_BACKEND;
  }
  s->flag_peers = ctx->flags.peers;
  s->my_flags = ctx->flags.local + CUCO_FLAGS_RESERVED;
  s->plan_ints = plan_layout((size_t)s->E).ints;
  if (rc == CUCO_OK) {
    rc = cuco_devcomm_create_lsa_world(ctx, kLsaBarriers, &s->dc);  // every peer's windows reachable
    s->dc_made = rc == CUCO_OK;
  }
  if (rc == CUCO_OK) rc = cuco_cuda_status(cudaMallocHost(&s->plan_host, sizeof(int) * s->plan_ints));
  if (rc == CUCO_OK) rc = cuco_cuda_status(cudaMalloc(&s->plan_dev, sizeof(int) * s->plan_ints));
  if (rc == CUCO_OK) rc = cuco_alloc_zeroed(&s->done_ctas, 2);  // dispatch, return
  if (rc == CUCO_OK) s->plan = plan_view(s->plan_dev, (size_t)s->E);  // the layout fill_plan writes
  if (rc == CUCO_OK) rc = cuco_side_stream_create(&s->side);  // pushes ahead of queued GEMM CTAs
  return cuco_state<State>::settle(ctx, rc);  // the CTA counters are zero before step 1
}

CUCO_EXPORT int cuco_step(cuco_ctx_t* ctx) {
  State* s = cuco_state<State>::get(ctx);
  if (s == nullptr) return CUCO_ERR_PARAM;
  CUCO_TRY(refuse_capture(ctx->stream));
  CUCO_TRY(s->read_valid_rows(ctx));
  return schedule(ctx, *s);
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) { return cuco_state<State>::close(ctx); }
