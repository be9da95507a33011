// device_lsa.cu — attention with context parallelism, device-initiated baseline in NCCL-LSA form (one source,
// both backends).
// cuco: backends=nccl,symm
//
// The sequence (SEQ tokens, H heads, head dim D) is split across W ranks: rank r holds the Sr = SEQ/W tokens at
// global positions [r*Sr, (r+1)*Sr) and computes the attention output of its queries over the whole sequence
// (causal when CAUSAL=1, comparing global positions). C = kChunks chunks per shard of Cs = Sr/C tokens each:
//
//     q, k, v  [Sr, H, D]   this rank's tokens                        (inputs "q", "k", "v", bf16)
//     kg, vg   [SEQ, H, D]  gathered K / V: rank p's tokens at p*Sr     (scratch windows "kg", "vg", every rank)
//     o        [Sr, H, D]   softmax(q K^T / sqrt(D)) V                  (output "o", bf16)
//
// Instead of a host all-gather followed by attention (seed_nccl.cu), every rank PUSHES its K/V shard into every
// peer's kg / vg with 16-byte stores through NVLink load/store access (LSA: ncclGetLsaPointer maps a peer's
// window into our address space), chunk by chunk, and announces each landed chunk with an epoch flag in the
// peer's flag region. The attention kernel starts at once on the LOCAL block (straight from k / v, never
// copied) and then takes each remote block as its flag arrives, merging with log-sum-exp:
//
//   side stream   put kernel: for chunk c, for every peer p:  k[c], v[c] ──16-B stores──▶ p.kg, p.vg at r*Sr+c*Cs
//                             then  p.flags[r*C + c] = epoch   (release, system scope)
//   ctx->stream   attention(local block, no wait) ─▶ for source s != r, chunk c:
//                     wait(flags[s*C + c] >= epoch) ─▶ attention(kg/vg block (s, c)), LSE-merged
//                 ◀── join: the side stream's event
//
// The LSE merge is the flash-attention online softmax itself: the shared kernel (attention_kernel.cuh, included
// below) walks a list of K/V segments keeping the running max, sum and unnormalised output of each
// query row; between launches that state lives in an fp32 workspace (m, l, O), so partial results of separate
// launches merge exactly like tiles of one launch. Causally, a rank never needs the K/V of higher ranks: their
// segments are dropped on the host and, inside the kernel, every key tile after a CTA's last query is skipped.
//
// Design space (the knob block below; every point that keeps its knob rules compiles and is a working variant):
//   kPlacement  kSequential  puts on ctx->stream, then attention: no overlap (the device-initiated twin of the
//                            seed)
//               kOverlapped  puts on a high-priority side stream launched first; attention on ctx->stream
//                            starts with the local block while remote chunks travel; joined before returning
//   kSync       kChunkFlags  one epoch flag per (source, chunk) in the receiver's flag region; the unit that
//                            completes a (chunk, peer) raises it
//               kBarrier     no flags: every put CTA ends with one ncclLsaBarrierSession (same CTA index on all
//                            ranks), so when the put grid has finished every peer's shard has landed here; the
//                            remote blocks' attention waits for the put grid as a whole (stream order / event)
//   kIssuer     kWarp / kCta: the unit that owns a piece of a chunk, stores it (lane-strided 16-byte vectors)
//                            and reports its arrival
//   kChunks     1, 2, 4: pipeline depth (more chunks: earlier first remote block, more and smaller waits)
//   kWaitMode   kInKernel    (kChunkFlags) one attention launch over all segments; before a remote segment's
//                            first tile, thread 0 of each CTA spins on that segment's flag
//               kWaitKernel  (kChunkFlags) one launch per segment, each remote one preceded by a 1-thread wait
//                            kernel on ctx->stream; state carried between launches in the fp32 workspace
//               (under kBarrier there are no flags and kWaitMode changes nothing)
//   kPutThreads, kLoadBatch  put CTA size; 16-byte loads each put thread keeps in flight before storing them
//   kAttn*      the attention kernel's tile (attention_kernel.cuh's TileConfig): warps per CTA, CTAs per SM asked
//               of __launch_bounds__, K(j+1) prefetched during tile j, and per head dim (32, 64, 128: every one
//               is built, the workload's D picks one at run time) the m-tiles per warp and the keys per K/V tile.
//               The defaults are attn::TileShape<D>, the shapes the seeds run. Only the knobs of the head dim
//               being run change anything.
//
// Signalling protocol (cuco_abi.h): ctx->epoch is 1 on the first step and +1 per step; a producer stores
// `epoch` (cuco_signal) and the consumer waits for `>= epoch`, so flags are never reset. Pieces of a
// (chunk, peer) are counted in a local arrival counter that only ever grows: the unit that brings it to a
// multiple of the piece count (K and V pieces together) is the last one and raises the peer's flag.
//
// Forward progress: a kInKernel CTA spinning on a flag holds its SM. The puts never wait on anything and are
// launched first on the highest-priority stream, so they are dispatched ahead of the attention CTAs; under
// symm (ranks sharing one GPU) each rank's MPS thread share keeps a peer's puts from being starved. The
// harness's capture pass replays the step as a graph that keeps these priorities (UseNodePriority); before it
// did, Overlapped/ChunkFlags/Cta/InKernel/4 hung there at 4 ranks (benchmarks/attention_cp/RESULTS.md).
// Reuse of kg / vg across steps relies on the harness: every step ends with a synchronise and a host + device
// barrier before the next, so no rank pushes step e+1 data while a peer still reads step e's blocks.
// At world size 1 nothing is communicated: a step is one attention launch on the local K/V.
//
// Build: nvcc ... (nccl backend, links NCCL) or with -DCUCO_BUILD_SYMM=1 (lsa_compat.h over the harness's peer
// tables: 2-4 ranks sharing one GPU run the same kernels).
#include <cuda_bf16.h>

#include <algorithm>
#include <cuda/atomic>

#include "cuco_lsa.h"

#include "attention_host.cuh"    // the workload's shared host code: frozen, on the include path (build.for_workload)
#include "attention_kernel.cuh"  // the workload's shared kernel: frozen, on the include path (build.for_workload)

namespace {

enum class Placement { kSequential, kOverlapped };
enum class Sync { kBarrier, kChunkFlags };
enum class Issuer { kWarp, kCta };
enum class WaitMode { kInKernel, kWaitKernel };

// EVOLVE-BLOCK-START knobs
constexpr Placement kPlacement = Placement::kOverlapped;  // knob: {Placement::kSequential, Placement::kOverlapped}
constexpr Sync kSync = Sync::kChunkFlags;  // knob: {Sync::kBarrier, Sync::kChunkFlags}
constexpr Issuer kIssuer = Issuer::kWarp;  // knob: {Issuer::kWarp, Issuer::kCta}
constexpr int kChunks = 2;  // knob: {1, 2, 4}
constexpr WaitMode kWaitMode = WaitMode::kInKernel;  // knob: {WaitMode::kInKernel, WaitMode::kWaitKernel}
// Threads per put CTA, whole warps (a kWarp unit never straddles two CTAs), and the 16-byte loads each put thread
// keeps in flight before storing them.
constexpr int kPutThreads = 256;  // knob: range 128..1024 step 128
constexpr int kLoadBatch = 4;  // knob: pow2 1..16
// The attention kernel's tile: warps per CTA, CTAs per SM for __launch_bounds__, K(j+1) prefetched during tile j
// (1) or not (0); then per head dim the m-tiles (16 query rows) per warp and the keys per K/V tile. Defaults:
// attn::TileShape<D>.
constexpr int kAttnWarps = 4;  // knob: pow2 1..8
constexpr int kAttnMinCtas = 1;  // knob: range 1..4
constexpr int kAttnPrefetchK = 0;  // knob: range 0..1
constexpr int kAttnMTiles32 = 1;  // knob: range 1..2
constexpr int kAttnBlockK32 = 128;  // knob: range 16..128 step 16
constexpr int kAttnMTiles64 = 2;  // knob: range 1..2
constexpr int kAttnBlockK64 = 64;  // knob: range 16..128 step 16
constexpr int kAttnMTiles128 = 1;  // knob: range 1..2
constexpr int kAttnBlockK128 = 64;  // knob: range 16..128 step 16
// The Q tile (warps x 16 x m-tiles rows) is staged through the K and V buffers (2 x keys rows): the kernel's
// static_assert, per head dim.
// knob-rule: kAttnWarps * 16 * kAttnMTiles32 <= 2 * kAttnBlockK32
// knob-rule: kAttnWarps * 16 * kAttnMTiles64 <= 2 * kAttnBlockK64
// knob-rule: kAttnWarps * 16 * kAttnMTiles128 <= 2 * kAttnBlockK128
// (The K and V buffers, 2 x keys rows of D + 8 bf16, are static shared memory: at most 68 KiB here, within the
// 227 KiB a CTA may have on sm_90, so no rule is needed for them.)
// EVOLVE-BLOCK-END

// EVOLVE-BLOCK-START tuning
constexpr int kWarpVecsPerLane = 8;       // kWarp: 32 lanes x 8 x 16 B = 4 KiB per piece
constexpr int kCtaVecsPerThread = 8;      // kCta: kPutThreads x 8 x 16 B per piece (32 KiB at 256 threads)
constexpr int kOverlapPutSmPercent = 20;  // kOverlapped: share of the SMs the put grid may hold
constexpr int kWaitThreads = 32;          // threads of a wait kernel
// EVOLVE-BLOCK-END

constexpr int kVecBytes = 16;  // one uint4: 8 bf16
constexpr int kWarpSize = 32;

// One attention launch at the knob block's tile for head dim d (cudaErrorInvalidValue for another head dim).
cudaError_t launch_attention(const attn::Params& p, int d, cudaStream_t stream) {
  constexpr bool kPrefetch = kAttnPrefetchK != 0;
  switch (d) {
    case 32:
      return attn::launch_shape<32, kAttnMTiles32, kAttnBlockK32, kPrefetch, kAttnMinCtas, kAttnWarps>(p, stream);
    case 64:
      return attn::launch_shape<64, kAttnMTiles64, kAttnBlockK64, kPrefetch, kAttnMinCtas, kAttnWarps>(p, stream);
    case 128:
      return attn::launch_shape<128, kAttnMTiles128, kAttnBlockK128, kPrefetch, kAttnMinCtas, kAttnWarps>(p, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

template <Issuer I>
__host__ __device__ constexpr int unit_threads() {
  return I == Issuer::kWarp ? kWarpSize : kPutThreads;
}
template <Issuer I>
__host__ __device__ constexpr size_t piece_vecs() {
  return I == Issuer::kWarp ? (size_t)kWarpSize * kWarpVecsPerLane : (size_t)kPutThreads * kCtaVecsPerThread;
}

// Everything a put launch needs, passed by value.
struct PutArgs {
  const uint4* k;                   // this rank's K shard as 16-byte vectors
  const uint4* v;                   // this rank's V shard
  ncclWindow_t kg, vg;              // ncclGetLsaPointer(kg, off, p) is p's kg + off
  uint64_t* const* flag_peers;      // device table: every rank's flag words
  unsigned long long* arrivals;     // local, [chunk][peer]: pieces stored so far, ever growing
  ncclDevComm dc;                   // for the LSA barrier (kSync == kBarrier)
  size_t chunk_vecs;                // 16-byte vectors per chunk of one tensor (Cs * H * D / 8)
  size_t own_offset;                // bytes from kg's start to this rank's tokens (r * Sr * H * D * 2)
  int rank, world;
  unsigned long long pieces;        // pieces per (chunk, tensor); a (chunk, peer) completes at 2 * pieces
  uint64_t epoch;
};

struct State {
  int d, rank, world, chunk_rows;
  const uint64_t* my_flags;         // this rank's first candidate flag word
  PutArgs put;
  attn::Params attn;                // q, o, workspace, sizes; segments and modes are set per launch
  attn::Segment local;              // the local block (no wait)
  attn::Segment remote[attn::kMaxSegments];  // remote blocks this rank needs, flags set (kChunkFlags)
  int n_remote;
  float* ws;                        // fp32 workspace: O [H, Sr, D] then (m, l) [H, Sr, 2]
  bool dc_made;
  cuco_side_stream_t side;          // kOverlapped: the puts' stream
  int put_grid;
  int barrier_count;

  // Free everything setup made (also after a failed setup); cuco_state<State>::close calls it.
  int release(cuco_ctx_t* ctx) {
    cuco_side_stream_destroy(&side);
    if (put.arrivals) cudaFree(put.arrivals);
    if (ws) cudaFree(ws);
    return dc_made ? cuco_devcomm_destroy(ctx, &put.dc) : CUCO_OK;
  }
};

// One attention launch over `segs` on `stream`, with the state flags of its place in the sequence of launches.
int attend(const State& s, const attn::Segment* segs, int n, bool load, bool store, bool write, uint64_t epoch,
           cudaStream_t stream) {
  attn::Params p = s.attn;
  p.n_seg = n;
  for (int i = 0; i < n; ++i) p.seg[i] = segs[i];
  p.load_state = load;
  p.store_state = store;
  p.write_out = write;
  p.epoch = epoch;
  return cuco_cuda_status(launch_attention(p, s.d, stream));
}

// EVOLVE-BLOCK-START put_kernel
// Copy vectors [v0, v1) of src to dst: this thread takes v0 + lane, + stride, ... with kLoadBatch loads in
// flight (stride = unit size: coalesced).
__device__ __forceinline__ void copy_piece(uint4* dst, const uint4* src, size_t v0, size_t v1, int lane,
                                           int stride) {
  for (size_t base = v0 + lane; base < v1; base += (size_t)stride * kLoadBatch) {
    uint4 buf[kLoadBatch];
#pragma unroll
    for (int j = 0; j < kLoadBatch; ++j) {
      const size_t i = base + (size_t)j * stride;
      if (i < v1) buf[j] = __ldg(src + i);
    }
#pragma unroll
    for (int j = 0; j < kLoadBatch; ++j) {
      const size_t i = base + (size_t)j * stride;
      if (i < v1) dst[i] = buf[j];
    }
  }
}

template <Issuer I>
__device__ __forceinline__ void unit_sync() {
  if constexpr (I == Issuer::kWarp) __syncwarp();
  if constexpr (I == Issuer::kCta) __syncthreads();
}

// Work items are (chunk, piece, peer), chunk-major so chunks complete in order, peer fastest so every peer
// receives chunk c at the same time; pieces [0, pieces) are K, [pieces, 2*pieces) are V. With kChunkFlags the
// unit's leader bumps the (chunk, peer) arrival counter (acq_rel, system scope: it carries the unit's stores
// along) and the leader that completes the count raises the peer's (source = rank, chunk) flag. With kBarrier
// every CTA then joins LSA barrier blockIdx.x: it returns once the same CTA of every peer has stored its share.
// A kCta unit's trip count is the same for all its threads (item is per CTA), so __syncthreads is safe.
template <Issuer I, Sync S>
__global__ void __launch_bounds__(kPutThreads) put_kernel(PutArgs a) {
  constexpr int kUnitThreads = unit_threads<I>();
  constexpr int kUnitsPerCta = kPutThreads / kUnitThreads;
  constexpr size_t kPieceVecs = piece_vecs<I>();
  const int lane = (int)(threadIdx.x % kUnitThreads);
  const size_t unit = (size_t)blockIdx.x * kUnitsPerCta + threadIdx.x / kUnitThreads;
  const size_t n_units = (size_t)gridDim.x * kUnitsPerCta;
  const size_t peers = (size_t)(a.world - 1);
  const size_t per_chunk = peers * 2 * a.pieces;
  const size_t items = (size_t)kChunks * per_chunk;
  for (size_t item = unit; item < items; item += n_units) {
    const int c = (int)(item / per_chunk);
    const size_t rem = item % per_chunk;
    const size_t piece2 = rem / peers;
    const int peer = (a.rank + 1 + (int)(rem % peers)) % a.world;
    const bool is_v = piece2 >= a.pieces;
    const size_t piece = is_v ? piece2 - a.pieces : piece2;
    const size_t v0 = piece * kPieceVecs;
    const size_t v1 = v0 + kPieceVecs < a.chunk_vecs ? v0 + kPieceVecs : a.chunk_vecs;
    const uint4* src = (is_v ? a.v : a.k) + (size_t)c * a.chunk_vecs;
    uint4* dst = (uint4*)ncclGetLsaPointer(is_v ? a.vg : a.kg,
                                           a.own_offset + (size_t)c * a.chunk_vecs * kVecBytes, peer);
    copy_piece(dst, src, v0, v1, lane, kUnitThreads);
    if constexpr (S == Sync::kChunkFlags) {
      unit_sync<I>();
      if (lane == 0) {
        cuda::atomic_ref<unsigned long long, cuda::thread_scope_system> arrived(
            a.arrivals[(size_t)c * a.world + peer]);
        const unsigned long long before = arrived.fetch_add(1ull, cuda::memory_order_acq_rel);
        if ((before + 1) % (2 * a.pieces) == 0)
          cuco_signal(cuco_user_flag(a.flag_peers, peer, (size_t)a.rank * kChunks + c), a.epoch);
      }
    }
  }
  if constexpr (S == Sync::kBarrier) {
    ncclLsaBarrierSession<ncclCoopCta> bar(ncclCoopCta(), a.dc, ncclTeamTagLsa(), blockIdx.x);
    bar.sync(ncclCoopCta(), cuda::memory_order_acq_rel);
  }
}

// Spin until *flag >= epoch (one thread; the rest of the grid has nothing to do).
__global__ void wait_kernel(const uint64_t* flag, uint64_t epoch) {
  if (threadIdx.x == 0) cuco_wait(flag, epoch);
}
// EVOLVE-BLOCK-END

// EVOLVE-BLOCK-START launch_shape
// Put CTAs, capped at what can be resident at once: with kBarrier every CTA spins in the barrier until its
// peers' twins arrive, so the put grids of all ranks sharing a GPU (symm) must fit on it together. Overlapped
// puts keep to kOverlapPutSmPercent of the SMs so the attention keeps the rest.
int plan_grids(const cuco_ctx_t* ctx, State& s) {
  int occupancy = 0;
  CUCO_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occupancy, put_kernel<kIssuer, kSync>,
                                                              kPutThreads, 0));
  int sms = ctx->sm_count;
  if (sms <= 0) CUCO_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx->device));
  const int sharing = ctx->backend == CUCO_BACKEND_SYMM ? s.world : 1;  // ranks on this GPU
  long long resident = std::max(1LL, (long long)sms * occupancy / sharing);
  if constexpr (kPlacement == Placement::kOverlapped)
    resident = std::min(resident, std::max(1LL, (long long)sms * kOverlapPutSmPercent / 100 / sharing));
  const long long units_per_cta = kPutThreads / unit_threads<kIssuer>();
  const long long items = (long long)kChunks * (s.world - 1) * 2 * (long long)s.put.pieces;
  s.put_grid = (int)std::max(1LL, std::min(resident, (items + units_per_cta - 1) / units_per_cta));
  // Flags need no barrier, but a devComm with one keeps setup identical across variants.
  s.barrier_count = kSync == Sync::kBarrier ? s.put_grid : 1;
  return CUCO_OK;
}
// EVOLVE-BLOCK-END

// EVOLVE-BLOCK-START schedule
int launch_puts(State& s, cudaStream_t stream, uint64_t epoch) {
  PutArgs a = s.put;
  a.epoch = epoch;
  put_kernel<kIssuer, kSync><<<s.put_grid, kPutThreads, 0, stream>>>(a);
  return cuco_cuda_status(cudaGetLastError());
}

// Attention of the local block and then every remote block this rank needs, on ctx->stream.
int attend_all(State& s, cudaStream_t stream, uint64_t epoch) {
  attn::Segment segs[attn::kMaxSegments];
  if constexpr (kSync == Sync::kBarrier && kPlacement == Placement::kOverlapped) {
    // Local block while the puts travel; the remote blocks once the put grid (and its barrier) is done.
    if (s.n_remote == 0) return attend(s, &s.local, 1, false, false, true, epoch, stream);
    CUCO_TRY(attend(s, &s.local, 1, false, true, false, epoch, stream));
    CUCO_TRY(cuco_side_stream_join(&s.side, stream));
    for (int i = 0; i < s.n_remote; ++i) {
      segs[i] = s.remote[i];
      segs[i].flag = nullptr;
    }
    return attend(s, segs, s.n_remote, true, false, true, epoch, stream);
  } else if constexpr (kSync == Sync::kBarrier || kWaitMode == WaitMode::kInKernel) {
    // One launch: local block first, then every remote block (waiting on its flag inside the kernel; under
    // kBarrier + kSequential the put grid has already finished on this stream, so no flags).
    segs[0] = s.local;
    for (int i = 0; i < s.n_remote; ++i) {
      segs[1 + i] = s.remote[i];
      if constexpr (kSync == Sync::kBarrier) segs[1 + i].flag = nullptr;
    }
    return attend(s, segs, 1 + s.n_remote, false, false, true, epoch, stream);
  } else {
    // kWaitKernel: one launch per block, the state carried in the workspace, a wait kernel before each remote.
    CUCO_TRY(attend(s, &s.local, 1, false, s.n_remote > 0, s.n_remote == 0, epoch, stream));
    for (int i = 0; i < s.n_remote; ++i) {
      wait_kernel<<<1, kWaitThreads, 0, stream>>>(s.remote[i].flag, epoch);
      CUCO_CUDA_TRY(cudaGetLastError());
      attn::Segment seg = s.remote[i];
      seg.flag = nullptr;
      const bool last = i == s.n_remote - 1;
      CUCO_TRY(attend(s, &seg, 1, true, !last, last, epoch, stream));
    }
    return CUCO_OK;
  }
}

int schedule(cuco_ctx_t* ctx, State& s) {
  const uint64_t epoch = ctx->epoch;
  if (s.world == 1) return attend(s, &s.local, 1, false, false, true, epoch, ctx->stream);  // nothing to gather
  if constexpr (kPlacement == Placement::kSequential) {
    CUCO_TRY(launch_puts(s, ctx->stream, epoch));
    return attend_all(s, ctx->stream, epoch);
  } else {
    // Fork: the puts read this step's k / v, which the harness filled on ctx->stream. Puts are enqueued first
    // (highest priority) so their CTAs are dispatched before any attention CTA can spin on a flag.
    CUCO_TRY(cuco_side_stream_fork(&s.side, ctx->stream));
    CUCO_TRY(launch_puts(s, s.side.stream, epoch));
    CUCO_TRY(attend_all(s, ctx->stream, epoch));
    return cuco_side_stream_join(&s.side, ctx->stream);  // rejoin the side stream
  }
}
// EVOLVE-BLOCK-END

}  // namespace

CUCO_EXPORT int cuco_declare_scratch(const cuco_ctx_t* ctx, cuco_scratch_request_t* req, int max_req) {
  return attn::declare_kv_scratch(ctx, req, max_req);
}

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  CUCO_CHECK_ABI(ctx);
  if (ctx->backend != cuco_build_backend) return CUCO_ERR_BACKEND;  // built for the other backend
  // Shards split into kChunks whole chunks; every (source, chunk) block is one attention segment.
  attn::Problem pb;
  attn::Tensors t;
  CUCO_TRY(attn::read_problem(ctx, kChunks, &pb));
  const int W = pb.world, Sr = pb.rows_per_rank;
  if (1 + (W - 1) * kChunks > attn::kMaxSegments) return CUCO_ERR_PARAM;
  if (W > 1 && ctx->flags.count < CUCO_FLAGS_RESERVED + (size_t)W * kChunks)
    return CUCO_ERR_PARAM;  // not enough candidate flag words for one per (source, chunk)
  CUCO_TRY(attn::find_tensors(ctx, pb, &t));
  cuco_tensor_t* kg = cuco_scratch(ctx, "kg");
  cuco_tensor_t* vg = cuco_scratch(ctx, "vg");
  if (!attn::scratch_ok(kg, attn::kv_bytes(ctx)) || !attn::scratch_ok(vg, attn::kv_bytes(ctx))) return CUCO_ERR_PARAM;
  if (W > 1 && (cuco_window(kg) == nullptr || cuco_window(vg) == nullptr || ctx->flags.peers == nullptr ||
                ctx->flags.local == nullptr))
    return CUCO_ERR_BACKEND;  // pushing needs the peers' windows and flags

  State* s = cuco_state<State>::open(ctx);
  s->d = pb.d;
  s->rank = pb.rank;
  s->world = W;
  s->chunk_rows = Sr / kChunks;
  s->my_flags = ctx->flags.local == nullptr ? nullptr : ctx->flags.local + CUCO_FLAGS_RESERVED;
  const size_t row_elems = (size_t)pb.heads * (size_t)pb.d;

  attn::Params& p = s->attn;
  p = attn::query_params(pb, t);
  s->local = attn::Segment{(const __nv_bfloat16*)t.k->local, (const __nv_bfloat16*)t.v->local, nullptr, p.q0, Sr};
  // Remote blocks, previous rank first (causally the nearest keys); causally, blocks after our last query go.
  const __nv_bfloat16* kgl = (const __nv_bfloat16*)kg->local;
  const __nv_bfloat16* vgl = (const __nv_bfloat16*)vg->local;
  for (int j = 1; j < W; ++j) {
    const int src = (s->rank - j + W) % W;
    for (int c = 0; c < kChunks; ++c) {
      const int key0 = src * Sr + c * s->chunk_rows;
      if (pb.causal && key0 > p.q0 + Sr - 1) continue;
      const size_t off = (size_t)key0 * row_elems;
      s->remote[s->n_remote++] =
          attn::Segment{kgl + off, vgl + off, s->my_flags + (size_t)src * kChunks + c, key0, s->chunk_rows};
    }
  }

  PutArgs& a = s->put;
  a.k = (const uint4*)t.k->local;
  a.v = (const uint4*)t.v->local;
  a.kg = cuco_window(kg);
  a.vg = cuco_window(vg);
  a.flag_peers = ctx->flags.peers;
  a.chunk_vecs = (size_t)s->chunk_rows * row_elems * attn::kBf16Bytes / kVecBytes;
  a.own_offset = (size_t)s->rank * (size_t)Sr * row_elems * attn::kBf16Bytes;
  a.rank = s->rank;
  a.world = W;
  a.pieces = (a.chunk_vecs + piece_vecs<kIssuer>() - 1) / piece_vecs<kIssuer>();

  const size_t ws_floats = (size_t)pb.heads * (size_t)Sr * ((size_t)pb.d + 2);
  int rc = cuco_cuda_status(cudaMalloc(&s->ws, ws_floats * sizeof(float)));
  if (rc == CUCO_OK) {
    p.ws_o = s->ws;
    p.ws_ml = s->ws + (size_t)pb.heads * (size_t)Sr * (size_t)pb.d;
    rc = plan_grids(ctx, *s);
  }
  if (rc == CUCO_OK) {
    rc = cuco_devcomm_create_lsa_world(ctx, s->barrier_count, &a.dc);  // push: every peer's window reachable
    s->dc_made = rc == CUCO_OK;
  }
  if (rc == CUCO_OK) rc = cuco_alloc_zeroed(&a.arrivals, (size_t)kChunks * W);
  if (rc == CUCO_OK) rc = cuco_side_stream_create(&s->side);  // puts ahead of queued attention CTAs
  return cuco_state<State>::settle(ctx, rc);  // the arrival counters are zero before step 1
}

CUCO_EXPORT int cuco_step(cuco_ctx_t* ctx) {
  State* s = cuco_state<State>::get(ctx);
  return s == nullptr ? CUCO_ERR_PARAM : schedule(ctx, *s);
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) { return cuco_state<State>::close(ctx); }
