// device_gin.cu — expert-parallel MoE layer, device-initiated over GIN (NCCL's network path), as the CUCo paper
// runs it across nodes: token rows are PUT one-sided into the expert ranks' receive windows, each put raises a
// signal at the receiver, the receiver waits until its signal reaches the number of puts it is owed, and results
// come home the same way. No load or store ever touches a peer's memory directly: everything a peer sees arrives
// through a put.
//
// Same computation, tensors, scratch windows and row layouts as seed_nccl.cu and device_lsa.cu (read seed_nccl.cu's
// header first), plus one window of its own, `stage`: every push CTA's ring of kStageSlots staging slots.
//
//   ctx->stream:  route ─ put_counts ─ wait(counts signal) ─ counts to host, sync ─ plan to device ─┬─ own GEMMs ─
//                 ... ─ wait(dispatch signal) ─ arrived GEMMs ─ copy own outputs ─ wait(return signal) ─ combine
//   push stream:  (ctx->stream, or a side stream with kTwoStream)  └▶ put_rows(dispatch) ──── └▶ put_rows(return)
//
//   put_rows: work items are chunks of kChunkRows rows of a host-built segment list (a segment = the rows of one
//             (expert, peer) pair, contiguous on both sides). A CTA packs each chunk into the next slot of its
//             staging ring, then puts the slot into the peer's window with ncclGin_SignalInc: one +1 per chunk at
//             the receiver. Before it rewrites the ring (every kStageSlots chunks, and when the kernel ends, since
//             the next push reuses it) the CTA calls gin.flush: a put's source belongs to the network until the
//             put has completed locally, and flush is what says it has.
//
// Signals (GIN's own, in the devComm; gin_compat.h under symm): kSigCounts, kSigDispatch, kSigReturn. Signals only
// grow, so a receiver waits for a running total, kept on the host and identical on every rank (the counts matrix
// says how many chunks each source owes each receiver): counts_total += W - 1 every step, dispatch_total += the
// chunks other ranks put into this rank's recv, return_total += the chunks of results coming back. A total, not
// `epoch * n`: how many chunks arrive changes with the routing every step.
//
// Why stage at all, when `send` and `out` are windows already: the slot is where a design converts or reorders
// rows on their way out (the per-(expert, peer) layout, a wire format), and it makes the rule about sources
// visible in the code: without the flushes a CTA would overwrite slots the network is still reading.
//
// Design space (the knob block; every combination compiles and is meant as a complete, correct variant):
//   kPlacement   kSequential  every put_rows on ctx->stream: no overlap
//                kTwoStream   put_rows on a high-priority side stream: own tokens' GEMMs run while remote tokens
//                             travel; joined back to ctx->stream before cuco_step returns
//   kPutBlocks   CTAs of each put_rows launch (each with its own ring)
//   kChunkRows   rows per put: fewer, larger puts vs load balance
//   kStageSlots  slots per ring: puts in flight per CTA between flushes
//   kPutThreads  threads per push CTA (they pack each chunk into its slot)
//   kWaitThreads threads of the wait kernel and of the counts put
// Dispatch wire format: the workload's FP8 parameter (moe_kernels.cuh), as in device_lsa.cu. Outputs travel back
// in bf16.
//
// Build: nvcc ... (nccl backend: NCCL's GIN, over the NICs across nodes) or with -DCUCO_BUILD_SYMM=1 (gin_compat.h
// over the harness's peer tables: 2-4 ranks sharing one GPU run the same kernels, which checks correctness, not
// network speed). At world size 1 nothing moves between ranks and no devComm is made: route, own GEMMs, combine.
// cuco: backends=nccl,symm
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <algorithm>

#include "cuco_lsa.h"
#include "moe_host.cuh"     // the workload's shared host code: frozen, on the include path (build.for_workload)
#include "moe_kernels.cuh"  // the workload's shared kernels: frozen, on the include path (build.for_workload)

namespace {

using namespace moe_host;     // the layer's windows, routing, plan and expert MLP: shared by every source
using namespace moe_kernels;  // routing, gather, SwiGLU, combine kernels: shared by every source

enum class Placement { kSequential, kTwoStream };

// EVOLVE-BLOCK-START knobs
constexpr Placement kPlacement = Placement::kTwoStream;  // knob: {Placement::kSequential, Placement::kTwoStream}
constexpr int kPutBlocks = 16;  // knob: range 4..32 step 4
constexpr int kChunkRows = 8;  // knob: {2, 4, 8, 16}
constexpr int kStageSlots = 4;  // knob: {2, 4, 8}
// Threads per push CTA, whole warps (they pack a chunk; the put is the CTA's).
constexpr int kPutThreads = 512;  // knob: range 128..1024 step 128
// Threads of the wait kernel (one waits, the rest keep its coop) and of the counts put.
constexpr int kWaitThreads = 32;  // knob: pow2 32..512
// EVOLVE-BLOCK-END

// The five windows every source has, then the staging rings.
constexpr const char* kWindowNames[kWindows] = {"send", "recv", "out", "ret", "counts"};
constexpr const char* kStageName = "stage";
// GIN resources of the devComm: one context, three signals, no counters, no LSA barrier.
constexpr int kGinContexts = 1;
constexpr ncclGinSignal_t kSigCounts = 0, kSigDispatch = 1, kSigReturn = 2;
constexpr int kGinSignals = 3;

static_assert(kPutThreads % kWarpSize == 0 && kPutThreads <= 1024, "kPutThreads: whole warps, at most 1024");
static_assert(kPutBlocks > 0 && kChunkRows > 0 && kStageSlots > 0, "grid, chunk and ring must be positive");

// Rows [src_row, src_row + rows) of a local buffer go to rows [dst_row, ...) of dst_rank's window.
struct Segment {
  int src_row, dst_rank, dst_row, rows;
};
static_assert(sizeof(Segment) == kSegmentInts * sizeof(int), "plan_layout counts a segment as kSegmentInts ints");

// One put_rows launch: a segment list and where its rows come from and go.
struct PutArgs {
  const uint4* src;          // local rows (send wire rows, or out)
  uint4* stage;              // this rank's staging window (local)
  ncclWindow_t dst_win;      // recv (dispatch) or ret (return)
  ncclWindow_t stage_win;
  const Segment* segs;
  const int* chunk0;         // [n_segs + 1]: chunk index where segment i starts; [n_segs] = total chunks
  int n_segs;
  size_t row_bytes;          // one row of this launch
  size_t slot_bytes;         // one staging slot (kChunkRows rows of the larger row kind)
  ncclGinSignal_t signal;
};

// Per-step uploads: two segment lists with their chunk prefixes, in plan_layout's buffer.
struct PlanView {
  Segment* disp;
  int* disp_chunk0;
  Segment* back;
  int* back_chunk0;
  int n_disp, n_back;
};

PlanView plan_view(int* buf, size_t E) {
  const PlanLayout at = plan_layout(E);
  PlanView v{};
  v.disp = (Segment*)(buf + at.disp);
  v.disp_chunk0 = buf + at.disp_chunk0;
  v.back = (Segment*)(buf + at.back);
  v.back_chunk0 = buf + at.back_chunk0;
  return v;
}

struct State : Layer {
  ncclWindow_t recv_win, ret_win, counts_win, stage_win;
  uint4* stage;                      // local staging rings, kPutBlocks * kStageSlots slots
  size_t slot_bytes;
  int* plan_host;                    // pinned, plan_ints ints
  int* plan_dev;
  size_t plan_ints;
  PlanView plan;                     // device pointers into plan_dev (counts on the host)
  uint64_t counts_total, dispatch_total, return_total;  // what each signal must reach (running totals)
  ncclDevComm dc;
  bool dc_made;
  cuco_side_stream_t side;           // kTwoStream: the pushes' stream

  int release(cuco_ctx_t* ctx) {
    cuco_side_stream_destroy(&side);
    cudaFree(plan_dev);
    cudaFreeHost(plan_host);
    close();
    return dc_made ? cuco_devcomm_destroy(ctx, &dc) : CUCO_OK;
  }
};

int chunks(size_t rows) { return (int)((rows + kChunkRows - 1) / kChunkRows); }

// EVOLVE-BLOCK-START kernels
// Pack chunk after chunk into this CTA's staging ring and put each slot into its peer's window, +1 on `signal`
// there per chunk. Always launched with kPutBlocks CTAs (each owns ring blockIdx.x); a launch with nothing to move
// puts nothing, and the receiver's total says so.
__global__ void __launch_bounds__(kPutThreads) put_rows(ncclDevComm dc, PutArgs a) {
  ncclGin gin(dc, 0);
  const ncclTeam world = ncclTeamWorld(dc);
  const int items = a.n_segs > 0 ? a.chunk0[a.n_segs] : 0;
  const size_t ring = (size_t)blockIdx.x * kStageSlots * a.slot_bytes;  // this CTA's ring, in bytes
  int used = 0;
  for (int item = (int)blockIdx.x; item < items; item += (int)gridDim.x, ++used) {
    const int slot = used % kStageSlots;
    // The ring comes round: its slots' puts must have read them before they are rewritten.
    if (slot == 0 && used > 0) gin.flush(ncclCoopCta());
    int lo = 0, hi = a.n_segs - 1;  // the last segment starting at or before this chunk
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (a.chunk0[mid] <= item) lo = mid; else hi = mid - 1;
    }
    const Segment sg = a.segs[lo];
    const int r0 = (item - a.chunk0[lo]) * kChunkRows;
    const int rows = min(kChunkRows, sg.rows - r0);
    const size_t bytes = (size_t)rows * a.row_bytes;
    const size_t off = ring + (size_t)slot * a.slot_bytes;
    const uint4* src = a.src + (size_t)(sg.src_row + r0) * (a.row_bytes / kVecBytes);
    uint4* dst = a.stage + off / kVecBytes;
    for (size_t i = threadIdx.x; i < bytes / kVecBytes; i += blockDim.x) dst[i] = src[i];
    // The put's own barrier orders the CTA's packing before it.
    gin.put(world, sg.dst_rank, a.dst_win, (size_t)(sg.dst_row + r0) * a.row_bytes, a.stage_win, off, bytes,
            ncclGin_SignalInc{a.signal}, ncclGin_None{}, ncclCoopCta());
  }
  gin.flush(ncclCoopCta());  // the next put_rows (the return, or the next step) packs into the same ring
}

// This rank's counts row (row `rank` of the counts window) into row `rank` of every peer's counts window.
__global__ void put_counts(ncclDevComm dc, ncclWindow_t counts_win, size_t row_bytes) {
  ncclGin gin(dc, 0);
  const ncclTeam world = ncclTeamWorld(dc);
  const size_t off = (size_t)world.rank * row_bytes;
  for (int k = 1; k < world.nRanks; ++k)
    gin.put(world, (world.rank + k) % world.nRanks, counts_win, off, counts_win, off, row_bytes,
            ncclGin_SignalInc{kSigCounts}, ncclGin_None{}, ncclCoopCta());
  gin.flush(ncclCoopCta());  // route rewrites the row next step
}

// Hold the stream until this rank's `signal` reached `least` (every put it counts has landed).
__global__ void wait_signal(ncclDevComm dc, ncclGinSignal_t signal, uint64_t least) {
  ncclGin gin(dc, 0);
  gin.waitSignal(ncclCoopCta(), signal, least);
}
// EVOLVE-BLOCK-END

// This step's segment lists and chunk prefixes in the pinned plan buffer, and what each signal must reach. Dispatch:
// own rows for rank q's expert le -> q's recv at its row of (le, me). Return: outputs of the rows rank q sent to my
// expert le -> q's ret at q's send offset of that expert. Every rank computes every total from the same counts.
void fill_plan(State& s) {
  const int me = s.rank, W = s.W, EL = s.EL;
  const PlanView h = plan_view(s.plan_host, (size_t)s.E);
  int nd = 0, nb = 0, cd = 0, cb = 0;
  uint64_t disp_in = 0, ret_in = 0;
  for (int q = 0; q < W; ++q) {
    if (q == me) continue;
    for (int le = 0; le < EL; ++le) {
      const size_t c = s.cnt(me, q * EL + le);  // my rows for q's expert le
      if (c) {
        h.disp[nd] = Segment{(int)s.off(me, q * EL + le), q, (int)s.rrow(q, le, me), (int)c};
        h.disp_chunk0[nd++] = cd;
        cd += chunks(c);
      }
      const size_t cr = s.cnt(q, me * EL + le);  // q's rows for my expert le
      if (cr) {
        h.back[nb] = Segment{(int)(s.cap + s.rrow(me, le, q)), q, (int)s.off(q, me * EL + le), (int)cr};
        h.back_chunk0[nb++] = cb;
        cb += chunks(cr);
      }
      disp_in += (uint64_t)chunks(cr);  // q puts these into my recv
      ret_in += (uint64_t)chunks(c);    // and sends these results back into my ret
    }
  }
  h.disp_chunk0[nd] = cd;
  h.back_chunk0[nb] = cb;
  s.plan.n_disp = nd;
  s.plan.n_back = nb;
  s.dispatch_total += disp_in;
  s.return_total += ret_in;
}

// EVOLVE-BLOCK-START schedule
int launch_put(const State& s, bool dispatch, cudaStream_t stream) {
  PutArgs a;
  a.src = dispatch ? (const uint4*)s.send_wire : (const uint4*)s.out;
  a.stage = s.stage;
  a.dst_win = dispatch ? s.recv_win : s.ret_win;
  a.stage_win = s.stage_win;
  a.segs = dispatch ? s.plan.disp : s.plan.back;
  a.chunk0 = dispatch ? s.plan.disp_chunk0 : s.plan.back_chunk0;
  a.n_segs = dispatch ? s.plan.n_disp : s.plan.n_back;
  a.row_bytes = dispatch ? s.wire_row : (size_t)s.H * kBf16Bytes;
  a.slot_bytes = s.slot_bytes;
  a.signal = dispatch ? kSigDispatch : kSigReturn;
  put_rows<<<kPutBlocks, kPutThreads, 0, stream>>>(s.dc, a);
  return cuco_cuda_status(cudaGetLastError());
}

int launch_wait(const State& s, ncclGinSignal_t signal, uint64_t least, cudaStream_t stream) {
  wait_signal<<<1, kWaitThreads, 0, stream>>>(s.dc, signal, least);
  return cuco_cuda_status(cudaGetLastError());
}

int expert_gemms(cublasHandle_t handle, const State& s, bool own, cudaStream_t stream) {
  for (int le = 0; le < s.EL; ++le)
    CUCO_TRY(own ? s.expert_own(handle, le, stream) : s.expert_arrived(handle, le, stream));
  return CUCO_OK;
}

int schedule(cuco_ctx_t* ctx, State& s) {
  cudaStream_t st = ctx->stream;
  cublasHandle_t handle = (cublasHandle_t)ctx->cublas;
  CUCO_CUBLAS_TRY(cublasSetStream(handle, st));
  const int W = s.W, E = s.E;
  const bool remote = W > 1;
  constexpr bool kSide = kPlacement == Placement::kTwoStream;
  cudaStream_t push = kSide ? s.side.stream : st;

  // route (FP8=1: and encode), then the counts exchange and the plan
  CUCO_TRY(s.route(st));
  if (remote) {
    put_counts<<<1, kWaitThreads, 0, st>>>(s.dc, s.counts_win, (size_t)E * kI32Bytes);
    CUCO_CUDA_TRY(cudaGetLastError());
    s.counts_total += (uint64_t)(W - 1);
    CUCO_TRY(launch_wait(s, kSigCounts, s.counts_total, st));
  }
  CUCO_CUDA_TRY(cudaMemcpyAsync(s.host_counts, s.counts, sizeof(int) * (size_t)W * E, cudaMemcpyDeviceToHost, st));
  CUCO_CUDA_TRY(cudaStreamSynchronize(st));
  CUCO_TRY(s.build_plan());
  if (remote) {
    fill_plan(s);
    CUCO_CUDA_TRY(cudaMemcpyAsync(s.plan_dev, s.plan_host, sizeof(int) * s.plan_ints, cudaMemcpyHostToDevice, st));
  }

  // dispatch beside the own tokens' GEMMs, then the arrived tokens' GEMMs
  if (remote) {
    if constexpr (kSide) CUCO_TRY(cuco_side_stream_fork(&s.side, st));  // the plan is on the device
    CUCO_TRY(launch_put(s, true, push));
  }
  CUCO_TRY(expert_gemms(handle, s, true, st));
  if (remote) {
    CUCO_TRY(launch_wait(s, kSigDispatch, s.dispatch_total, st));
    CUCO_TRY(s.decode_arrived_rows(st));
    CUCO_TRY(expert_gemms(handle, s, false, st));
    if constexpr (kSide) CUCO_TRY(cuco_side_stream_fork(&s.side, st));  // the arrived rows' outputs are in out
    CUCO_TRY(launch_put(s, false, push));
  }

  // combine: own outputs copied, the rest waited for
  CUCO_TRY(s.copy_own_outputs(st));
  if (remote) CUCO_TRY(launch_wait(s, kSigReturn, s.return_total, st));
  combine<<<std::max(1, std::min(s.Tr, s.grid)), kThreads, 0, st>>>((const uint4*)s.ret, s.pos, s.w, s.Tr, s.K,
                                                                    s.row_vecs, (uint4*)s.y);
  CUCO_CUDA_TRY(cudaGetLastError());
  if constexpr (kSide) {
    if (remote) CUCO_TRY(cuco_side_stream_join(&s.side, st));
  }
  return CUCO_OK;
}
// EVOLVE-BLOCK-END

}  // namespace

// The five token-row windows (workload.scratch_bytes gives their sizes), then the staging rings.
CUCO_EXPORT int cuco_declare_scratch(const cuco_ctx_t* ctx, cuco_scratch_request_t* req, int max_req) {
  const int n = declare_windows(ctx, kWindowNames, req, max_req);
  const int64_t H = cuco_param(ctx, "H");
  if (n != kWindows || max_req <= kWindows || H <= 0) return n;
  const size_t row = std::max(wire_row_bytes((int)H, fp8_mode(cuco_param(ctx, "FP8"), H) == 1), (size_t)H * kBf16Bytes);
  memset(&req[n], 0, sizeof(req[n]));
  strncpy(req[n].name, kStageName, CUCO_NAME_LEN - 1);
  req[n].bytes = (size_t)kPutBlocks * kStageSlots * kChunkRows * row;
  return n + 1;
}

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  CUCO_CHECK_ABI(ctx);
  if (ctx->backend != cuco_build_backend) return CUCO_ERR_BACKEND;  // built for the other backend
  State* s = cuco_state<State>::open(ctx);
  int rc = s->open(ctx, kWindowNames);
  const cuco_tensor_t* stage = cuco_scratch(ctx, kStageName);
  if (rc == CUCO_OK) {
    s->slot_bytes = (size_t)kChunkRows * std::max(s->wire_row, (size_t)s->H * kBf16Bytes);
    s->recv_win = cuco_window(s->windows[kRecv]);
    s->ret_win = cuco_window(s->windows[kRet]);
    s->counts_win = cuco_window(s->windows[kCounts]);
    s->stage_win = stage != nullptr ? cuco_window(stage) : nullptr;
    if (stage == nullptr || stage->capacity_bytes < (size_t)kPutBlocks * kStageSlots * s->slot_bytes)
      rc = CUCO_ERR_PARAM;
    else if (s->W > 1 && (s->recv_win == nullptr || s->ret_win == nullptr || s->counts_win == nullptr ||
                          s->stage_win == nullptr))
      rc = CUCO_ERR_BACKEND;
  }
  if (rc == CUCO_OK) s->stage = (uint4*)stage->local;
  s->plan_ints = plan_layout((size_t)s->E).ints;
  if (rc == CUCO_OK && s->W > 1) {  // GIN only where something moves between ranks
    rc = cuco_devcomm_create_gin(ctx, 0, kGinContexts, kGinSignals, 0, &s->dc);
    s->dc_made = rc == CUCO_OK;
  }
  if (rc == CUCO_OK) rc = cuco_cuda_status(cudaMallocHost(&s->plan_host, sizeof(int) * s->plan_ints));
  if (rc == CUCO_OK) rc = cuco_cuda_status(cudaMalloc(&s->plan_dev, sizeof(int) * s->plan_ints));
  if (rc == CUCO_OK) s->plan = plan_view(s->plan_dev, (size_t)s->E);  // the layout fill_plan writes
  if (rc == CUCO_OK) rc = cuco_side_stream_create(&s->side);
  return cuco_state<State>::settle(ctx, rc);
}

CUCO_EXPORT int cuco_step(cuco_ctx_t* ctx) {
  State* s = cuco_state<State>::get(ctx);
  if (s == nullptr) return CUCO_ERR_PARAM;
  CUCO_TRY(refuse_capture(ctx->stream));
  CUCO_TRY(s->read_valid_rows(ctx));
  return schedule(ctx, *s);
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) { return cuco_state<State>::close(ctx); }
