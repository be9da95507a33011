// device_lsa.cu — GEMM + AllGather, device-initiated baseline in NCCL-LSA form (one source, both backends).
// cuco: backends=nccl,symm
//
// Tensor parallel Y_r = AllGather(X) @ W_r, bf16 operands, fp32 accumulation. World size W, TOTAL sizes M, N, K,
// Mr = M/W rows per rank, C = kChunks chunks per shard of Rc = Mr/C rows each:
//
//     x  [Mr, K]    this rank's rows of X                 (input tensor "x")
//     w  [K, N/W]   this rank's columns of W              (input tensor "w")
//     xg [M, K]     gathered X: rank q's rows at q*Mr      (scratch window "xg", on every rank, gemm_host.cuh)
//     y  [M, N/W]   Xg @ w                                (output tensor "y")
//
// Instead of a host all-gather followed by one GEMM (seed_nccl.cu), every rank PUSHES its shard into every
// peer's xg with plain 16-byte stores through NVLink load/store access (LSA: ncclGetLsaPointer maps a peer's
// window into our address space), chunk by chunk, and announces each landed chunk with a flag in the peer's
// flag region. The consumer GEMMs each chunk as soon as its flag says it has landed:
//
//   side stream   put kernel: for chunk c, for every peer p:  x[c] ──16-B stores──▶ p.xg[rank*Mr + c*Rc ..]
//                             then  p.flags[rank*C + c] = epoch   (release, system scope)
//   ctx->stream   GEMM(local shard straight from x, no wait)  ──▶ for chunk c, for source q != rank:
//                 wait(flags[q*C + c] >= epoch) ─▶ GEMM(xg rows of (q, c)) ─▶ y rows of (q, c)
//                 ◀── join: the side stream's event
//
// While remote chunks travel, the tensor cores are busy with the local shard and with chunks that already
// landed: communication hides behind compute. The local shard is never copied into xg: cuBLAS reads it from x.
//
// Design space (the knob block below; every combination compiles and is a working variant):
//   kPlacement  kSequential  put all -> GEMM local -> wait all -> GEMM remote rows, one stream, no overlap
//               kTwoStream   puts on a second stream, one full-width put launch per chunk (chunk c is complete
//                            everywhere before chunk c+1 starts); per-chunk wait + GEMM on ctx->stream
//               kPersistent  ONE persistent put kernel on kPersistentSmPercent of the SMs walking all chunks in
//                            order, concurrent with the per-chunk GEMMs that keep the remaining SMs (the
//                            "fused persistent" slot of the design space; the GEMM itself stays in cuBLAS)
//   kSync       kChunkFlags  one epoch flag per (source, chunk) in the receiver's flag region; the last unit
//                            finishing a (chunk, peer) raises it
//               kBarrier     no flags: every put CTA ends with one ncclLsaBarrierSession (same CTA index on all
//                            ranks), so when the put grid has finished every peer's shard has landed here; the
//                            remote GEMMs wait for the put grid (stream order or the join event)
//   kIssuer     kThread / kWarp / kCta: the unit that owns a piece of a chunk, stores it (thread: a contiguous
//                            run per thread; warp/CTA: coalesced, lane-strided) and reports its arrival
//   kChunks     1, 2, 4, 8: pipeline depth (more chunks: earlier first GEMM, more and smaller GEMMs)
//
// Signalling protocol (cuco_abi.h): ctx->epoch is 1 on the first step and +1 per step; a producer stores
// `epoch` (cuco_signal) and the consumer waits for `>= epoch` (cuco_wait), so flags are never reset. Pieces
// of a (chunk, peer) are counted in a local arrival counter that only ever grows: the unit that brings it to a
// multiple of the piece count is the last one and raises the peer's flag.
//
// Reuse of xg across steps relies on the harness: every step ends with a synchronise and a host + device
// barrier before the next, so no rank pushes step e+1 data while a peer still reads step e's xg.
// At world size 1 nothing is communicated: a step is one cuBLAS GEMM on x.
//
// Build: nvcc ... (nccl backend, links NCCL and cuBLAS) or with -DCUCO_BUILD_SYMM=1 (lsa_compat.h over the
// harness's peer tables: 2-4 ranks sharing one GPU run the same kernels). The GEMM, the operands' checks and the
// "xg" request are gemm_host.cuh's, shared with the seeds (row-major GEMM through cuBLAS's column-major API:
// Y^T = W^T Xg^T, see seed_nccl.cu).
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cuda/atomic>

#include "cuco_lsa.h"
#include "gemm_host.cuh"  // the workload's shared host code: frozen, on the include path (build.for_workload)

namespace {

enum class Placement { kSequential, kTwoStream, kPersistent };
enum class Sync { kBarrier, kChunkFlags };
enum class Issuer { kThread, kWarp, kCta };

// EVOLVE-BLOCK-START knobs
constexpr Placement kPlacement = Placement::kTwoStream;  // knob: {Placement::kSequential, Placement::kTwoStream, Placement::kPersistent}
constexpr Sync kSync = Sync::kChunkFlags;  // knob: {Sync::kBarrier, Sync::kChunkFlags}
constexpr Issuer kIssuer = Issuer::kWarp;  // knob: {Issuer::kThread, Issuer::kWarp, Issuer::kCta}
constexpr int kChunks = 4;  // knob: {1, 2, 4, 8}
// EVOLVE-BLOCK-END

// EVOLVE-BLOCK-START tuning
constexpr int kPutThreads = 512;           // threads per put CTA
constexpr int kLoadBatch = 4;              // 16-byte loads each thread keeps in flight before storing them
constexpr int kThreadPieceVecs = 64;       // kThread: 1 KiB contiguous per thread-owned piece
constexpr int kWarpVecsPerLane = 8;        // kWarp: 32 lanes x 8 x 16 B = 4 KiB per piece
constexpr int kCtaVecsPerThread = 4;       // kCta: 512 threads x 4 x 16 B = 32 KiB per piece
constexpr int kPersistentSmPercent = 12;   // kPersistent: share of the SMs the put kernel may hold
constexpr int kWaitThreads = 32;           // threads of a wait kernel (one flag each, strided)
// EVOLVE-BLOCK-END

constexpr int kVecBytes = 16;  // one uint4: 8 bf16
constexpr int kWarpSize = 32;

// Threads in one issuing unit and elements (16-byte vectors) of the piece it owns.
template <Issuer I>
__host__ __device__ constexpr int unit_threads() {
  return I == Issuer::kThread ? 1 : I == Issuer::kWarp ? kWarpSize : kPutThreads;
}
template <Issuer I>
__host__ __device__ constexpr size_t piece_vecs() {
  return I == Issuer::kThread ? (size_t)kThreadPieceVecs
         : I == Issuer::kWarp ? (size_t)kWarpSize * kWarpVecsPerLane
                              : (size_t)kPutThreads * kCtaVecsPerThread;
}

// Everything a put launch needs, passed by value.
struct PutArgs {
  const uint4* x;                   // this rank's shard as 16-byte vectors
  ncclWindow_t xg;                  // the "xg" window: ncclGetLsaPointer(xg, off, p) is p's xg + off
  uint64_t* const* flag_peers;      // device table: every rank's flag words
  unsigned long long* arrivals;     // local, [chunk][peer]: pieces stored so far, ever growing
  ncclDevComm dc;                   // for the LSA barrier (kSync == kBarrier)
  size_t chunk_vecs;                // 16-byte vectors per chunk (Rc * K / 8)
  size_t own_rows_offset;           // bytes from xg's start to this rank's rows (rank * Mr * K * 2)
  int rank, world;
  int chunk_begin, chunk_end;       // chunks this launch puts
  unsigned long long pieces;        // pieces per (chunk, peer)
  uint64_t epoch;
};

// Sizes, x, w, y and the local gathered X (read by the GEMMs) come from gemm_ag::Operands.
struct State : gemm_ag::Operands {
  int chunk_rows;
  const uint64_t* my_flags;         // this rank's first candidate flag word
  PutArgs put;                      // per-step fields (chunk range, epoch) are set at launch
  bool dc_made;
  cuco_side_stream_t side;          // the puts' stream (kTwoStream, kPersistent), forked off ctx->stream
  int grid_all;                     // CTAs of a put launch over all chunks
  int grid_chunk;                   // CTAs of a put launch over one chunk
  int grid_persistent;              // CTAs of the persistent put kernel
  int barrier_count;                // LSA barriers requested (>= every grid that ends in a barrier)

  // Free everything setup made (also after a failed setup); cuco_state<State>::close calls it.
  int release(cuco_ctx_t* ctx) {
    cuco_side_stream_destroy(&side);
    if (put.arrivals) cudaFree(put.arrivals);
    return dc_made ? cuco_devcomm_destroy(ctx, &put.dc) : CUCO_OK;
  }
};

// EVOLVE-BLOCK-START put_kernel
// Copy vectors [v0, v1) of src to dst: this thread takes v0 + lane, + stride, ... with kLoadBatch loads in
// flight. stride 1 (kThread) walks a contiguous run; stride 32 / blockDim (kWarp / kCta) coalesces.
__device__ __forceinline__ void copy_piece(uint4* dst, const uint4* src, size_t v0, size_t v1, int lane,
                                           int stride) {
  for (size_t base = v0 + lane; base < v1; base += (size_t)stride * kLoadBatch) {
    uint4 buf[kLoadBatch];
#pragma unroll
    for (int k = 0; k < kLoadBatch; ++k) {
      const size_t v = base + (size_t)k * stride;
      if (v < v1) buf[k] = __ldg(src + v);
    }
#pragma unroll
    for (int k = 0; k < kLoadBatch; ++k) {
      const size_t v = base + (size_t)k * stride;
      if (v < v1) dst[v] = buf[k];
    }
  }
}

// Order the whole unit's stores before its leader's release (NCCL's pattern: coop.sync, then one release).
template <Issuer I>
__device__ __forceinline__ void unit_sync() {
  if constexpr (I == Issuer::kWarp) __syncwarp();
  if constexpr (I == Issuer::kCta) __syncthreads();
}

// Work items are (chunk, piece, peer), chunk-major so chunks complete in order, peer fastest so every peer
// receives chunk c at the same time. Each item is owned by one unit. With kChunkFlags the unit's leader bumps
// the (chunk, peer) arrival counter (acq_rel, system scope: it carries the unit's stores along) and the
// leader that completes the count raises the peer's (source = rank, chunk) flag. With kFinalBarrier every CTA
// then joins LSA barrier blockIdx.x: it returns once the same CTA of every peer has stored its share.
template <Issuer I, Sync S, bool kFinalBarrier>
__global__ void __launch_bounds__(kPutThreads) put_kernel(PutArgs a) {
  constexpr int kUnitThreads = unit_threads<I>();
  constexpr int kUnitsPerCta = kPutThreads / kUnitThreads;
  constexpr size_t kPieceVecs = piece_vecs<I>();
  const int lane = (int)(threadIdx.x % kUnitThreads);
  const size_t unit = (size_t)blockIdx.x * kUnitsPerCta + threadIdx.x / kUnitThreads;
  const size_t n_units = (size_t)gridDim.x * kUnitsPerCta;
  const size_t peers = (size_t)(a.world - 1);
  const size_t per_chunk = peers * a.pieces;
  const size_t items = (size_t)(a.chunk_end - a.chunk_begin) * per_chunk;
  for (size_t item = unit; item < items; item += n_units) {
    const int c = a.chunk_begin + (int)(item / per_chunk);
    const size_t rem = item % per_chunk;
    const size_t piece = rem / peers;
    const int peer = (a.rank + 1 + (int)(rem % peers)) % a.world;
    const size_t v0 = piece * kPieceVecs;
    const size_t v1 = v0 + kPieceVecs < a.chunk_vecs ? v0 + kPieceVecs : a.chunk_vecs;
    const uint4* src = a.x + (size_t)c * a.chunk_vecs;
    uint4* dst = (uint4*)ncclGetLsaPointer(a.xg, a.own_rows_offset + (size_t)c * a.chunk_vecs * kVecBytes, peer);
    copy_piece(dst, src, v0, v1, lane, kUnitThreads);
    if constexpr (S == Sync::kChunkFlags) {
      unit_sync<I>();
      if (lane == 0) {
        cuda::atomic_ref<unsigned long long, cuda::thread_scope_system> arrived(
            a.arrivals[(size_t)c * a.world + peer]);
        const unsigned long long before = arrived.fetch_add(1ull, cuda::memory_order_acq_rel);
        if ((before + 1) % a.pieces == 0)
          cuco_signal(cuco_user_flag(a.flag_peers, peer, (size_t)a.rank * kChunks + c), a.epoch);
      }
    }
  }
  if constexpr (kFinalBarrier) {
    ncclLsaBarrierSession<ncclCoopCta> bar(ncclCoopCta(), a.dc, ncclTeamTagLsa(), blockIdx.x);
    bar.sync(ncclCoopCta(), cuda::memory_order_acq_rel);
  }
}

// Spin until flags[i] >= epoch for every i in [0, n) outside [skip_begin, skip_end) (our own chunks).
__global__ void wait_kernel(const uint64_t* flags, int n, int skip_begin, int skip_end, uint64_t epoch) {
  for (int i = threadIdx.x; i < n; i += blockDim.x)
    if (i < skip_begin || i >= skip_end) cuco_wait(flags + i, epoch);
}
// EVOLVE-BLOCK-END

// EVOLVE-BLOCK-START launch_shape
// CTAs for a launch of `items` work items, capped at what can be resident at once: with kBarrier every CTA
// spins in the barrier until its peers' twins arrive, so the put grids of all ranks sharing a GPU (symm) must
// fit on it together, or a resident CTA could wait forever for a twin that never gets an SM.
int plan_grids(const cuco_ctx_t* ctx, State& s) {
  int occupancy = 0;
  CUCO_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      &occupancy, put_kernel<kIssuer, kSync, kSync == Sync::kBarrier>, kPutThreads, 0));
  int sms = ctx->sm_count;
  if (sms <= 0) CUCO_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx->device));
  const int sharing = ctx->backend == CUCO_BACKEND_SYMM ? s.world : 1;  // ranks on this GPU
  const long long resident = std::max(1LL, (long long)sms * occupancy / sharing);
  const long long units_per_cta = kPutThreads / unit_threads<kIssuer>();
  const long long chunk_items = (long long)(s.world - 1) * (long long)s.put.pieces;
  auto ctas = [&](long long items) {
    return (int)std::max(1LL, std::min(resident, (items + units_per_cta - 1) / units_per_cta));
  };
  s.grid_all = ctas(chunk_items * kChunks);
  s.grid_chunk = ctas(chunk_items);
  const long long persistent = std::max(1LL, (long long)sms * kPersistentSmPercent / 100 / sharing);
  s.grid_persistent = std::min(ctas(chunk_items * kChunks), (int)std::min(persistent, resident));
  int barrier_grid = s.grid_all;
  if constexpr (kPlacement == Placement::kTwoStream) barrier_grid = s.grid_chunk;
  if constexpr (kPlacement == Placement::kPersistent) barrier_grid = s.grid_persistent;
  // Flags need no barrier, but a devComm with one keeps setup identical across variants.
  s.barrier_count = kSync == Sync::kBarrier ? barrier_grid : 1;
  return CUCO_OK;
}
// EVOLVE-BLOCK-END

// EVOLVE-BLOCK-START schedule
// One put launch over chunks [c0, c1) on `stream`, ending in the LSA barrier when `final_barrier`.
int launch_puts(State& s, cudaStream_t stream, int c0, int c1, int grid, bool final_barrier, uint64_t epoch) {
  PutArgs a = s.put;
  a.chunk_begin = c0;
  a.chunk_end = c1;
  a.epoch = epoch;
  // (With kChunkFlags both branches are the same kernel: callers never ask for a barrier then.)
  if (final_barrier)
    put_kernel<kIssuer, kSync, kSync == Sync::kBarrier><<<grid, kPutThreads, 0, stream>>>(a);
  else
    put_kernel<kIssuer, kSync, false><<<grid, kPutThreads, 0, stream>>>(a);
  return cuco_cuda_status(cudaGetLastError());
}

int launch_wait(const uint64_t* flags, int n, int skip_begin, int skip_end, uint64_t epoch, cudaStream_t stream) {
  wait_kernel<<<1, kWaitThreads, 0, stream>>>(flags, n, skip_begin, skip_end, epoch);
  return cuco_cuda_status(cudaGetLastError());
}

// GEMM the rows of every other rank (at most two contiguous ranges around our own shard), from xg.
int gemm_remote_rows(cublasHandle_t h, const State& s) {
  const int own0 = s.rank * s.rows_per_rank, own1 = own0 + s.rows_per_rank;
  if (own0 > 0) CUCO_TRY(s.gemm_rows(h, s.xg, 0, own0));
  if (own1 < s.M) CUCO_TRY(s.gemm_rows(h, s.xg + (size_t)own1 * s.K, own1, s.M - own1));
  return CUCO_OK;
}

int schedule(cuco_ctx_t* ctx, State& s) {
  cublasHandle_t h = (cublasHandle_t)ctx->cublas;
  CUCO_CUBLAS_TRY(cublasSetStream(h, ctx->stream));
  const int own_row0 = s.rank * s.rows_per_rank;
  if (s.world == 1) return s.gemm_rows(h, s.x, own_row0, s.rows_per_rank);  // nothing to gather
  const uint64_t epoch = ctx->epoch;
  const int n_flags = s.world * kChunks;

  if constexpr (kPlacement == Placement::kSequential) {
    CUCO_TRY(launch_puts(s, ctx->stream, 0, kChunks, s.grid_all, kSync == Sync::kBarrier, epoch));
    CUCO_TRY(s.gemm_rows(h, s.x, own_row0, s.rows_per_rank));
    if constexpr (kSync == Sync::kChunkFlags)
      CUCO_TRY(launch_wait(s.my_flags, n_flags, s.rank * kChunks, (s.rank + 1) * kChunks, epoch, ctx->stream));
    return gemm_remote_rows(h, s);
  } else {
    // Fork: the puts read this step's x, which the harness filled on ctx->stream.
    CUCO_TRY(cuco_side_stream_fork(&s.side, ctx->stream));
    if constexpr (kPlacement == Placement::kTwoStream) {
      for (int c = 0; c < kChunks; ++c)
        CUCO_TRY(launch_puts(s, s.side.stream, c, c + 1, s.grid_chunk, kSync == Sync::kBarrier && c == kChunks - 1,
                             epoch));
    } else {
      CUCO_TRY(launch_puts(s, s.side.stream, 0, kChunks, s.grid_persistent, kSync == Sync::kBarrier, epoch));
    }
    // The local shard needs no wait: GEMM it while the peers' chunks travel.
    CUCO_TRY(s.gemm_rows(h, s.x, own_row0, s.rows_per_rank));
    if constexpr (kSync == Sync::kBarrier) {
      CUCO_TRY(cuco_side_stream_join(&s.side, ctx->stream));  // barrier passed: all shards landed
      return gemm_remote_rows(h, s);
    } else {
      for (int c = 0; c < kChunks; ++c) {
        for (int j = 0; j < s.world - 1; ++j) {
          const int src = (s.rank - 1 - j + s.world) % s.world;
          const int row0 = src * s.rows_per_rank + c * s.chunk_rows;
          CUCO_TRY(launch_wait(s.my_flags + (size_t)src * kChunks + c, 1, 0, 0, epoch, ctx->stream));
          CUCO_TRY(s.gemm_rows(h, s.xg + (size_t)row0 * s.K, row0, s.chunk_rows));
        }
      }
      return cuco_side_stream_join(&s.side, ctx->stream);  // rejoin the side stream
    }
  }
}
// EVOLVE-BLOCK-END

}  // namespace

CUCO_EXPORT int cuco_declare_scratch(const cuco_ctx_t* ctx, cuco_scratch_request_t* req, int max_req) {
  return gemm_ag::GatheredX{ctx}.declare(req, max_req);
}

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  CUCO_CHECK_ABI(ctx);
  if (ctx->backend != cuco_build_backend) return CUCO_ERR_BACKEND;  // built for the other backend
  if (ctx->cublas == nullptr) return CUCO_ERR_PARAM;
  // Shards split into kChunks whole chunks of whole 16-byte vectors.
  gemm_ag::Operands op;
  CUCO_TRY(op.open(ctx, kChunks));
  const int W = op.world;
  if ((size_t)op.K * gemm_ag::kBf16Bytes % kVecBytes != 0) return CUCO_ERR_PARAM;
  if (W > 1 && ctx->flags.count < CUCO_FLAGS_RESERVED + (size_t)W * kChunks)
    return CUCO_ERR_PARAM;  // not enough candidate flag words for one per (source, chunk)
  const cuco_tensor_t* xg = cuco_scratch(ctx, "xg");
  if (W > 1 && (cuco_window(xg) == nullptr || ctx->flags.peers == nullptr || ctx->flags.local == nullptr))
    return CUCO_ERR_BACKEND;  // pushing needs the peers' windows and flags

  State* s = cuco_state<State>::open(ctx, op);
  s->chunk_rows = s->rows_per_rank / kChunks;
  s->my_flags = ctx->flags.local == nullptr ? nullptr : ctx->flags.local + CUCO_FLAGS_RESERVED;

  PutArgs& a = s->put;
  a.x = (const uint4*)s->x;
  a.xg = cuco_window(xg);
  a.flag_peers = ctx->flags.peers;
  a.chunk_vecs = (size_t)s->chunk_rows * (size_t)s->K * gemm_ag::kBf16Bytes / kVecBytes;
  a.own_rows_offset = (size_t)s->rank * s->rows_per_rank * (size_t)s->K * gemm_ag::kBf16Bytes;
  a.rank = s->rank;
  a.world = W;
  a.pieces = (a.chunk_vecs + piece_vecs<kIssuer>() - 1) / piece_vecs<kIssuer>();

  int rc = plan_grids(ctx, *s);
  if (rc == CUCO_OK) {
    rc = cuco_devcomm_create_lsa_world(ctx, s->barrier_count, &a.dc);  // push: every peer's window reachable
    s->dc_made = rc == CUCO_OK;
  }
  if (rc == CUCO_OK) rc = cuco_alloc_zeroed(&a.arrivals, (size_t)kChunks * W);
  if (rc == CUCO_OK) rc = cuco_side_stream_create(&s->side);  // puts ahead of queued GEMM CTAs
  return cuco_state<State>::settle(ctx, rc);  // the arrival counters are zero before step 1
}

CUCO_EXPORT int cuco_step(cuco_ctx_t* ctx) {
  State* s = cuco_state<State>::get(ctx);
  return s == nullptr ? CUCO_ERR_PARAM : schedule(ctx, *s);
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) { return cuco_state<State>::close(ctx); }
