// exercise_wait.cu — GEMM + AllGather with a chunked transfer: place the wait (an exercise of 05_teaching).
// cuco: backends=nccl,symm
//
// Tensor parallel Y_r = AllGather(X) @ W_r (bf16, fp32 accumulation). Every rank PUSHES its rows of X into every
// peer's gathered buffer xg, chunk by chunk (kChunks chunks per shard), on a side stream; after each chunk has
// landed in a peer, the put kernel raises ONE flag in that peer's flag region:
//
//     s.my_flags[src * kChunks + c] >= epoch   <=>   chunk c of rank src has fully landed in this rank's xg
//
// Then ctx->stream GEMMs this rank's own rows and the rows of every other rank, one chunk at a time, out of xg.
//
// THE EXERCISE: a GEMM that reads a chunk of xg before that chunk has landed computes with stale data, and one
// that waits for more than it reads leaves the GPU idle while data travels. schedule() has two gaps, before the
// own-rows GEMM and before each chunk's GEMM; put the wait where it belongs (a gap may stay empty). The harness
// grades correctness (fresh inputs each trial, a late rank and random pauses around every signal and wait) and
// how much of the transfer your schedule hides behind the GEMMs (the overlap fraction of the kernel timeline).
//
// What you may call (defined below): launch_wait(flags, n, skip_begin, skip_end, epoch, stream) enqueues a
// one-CTA kernel on `stream` that spins until flags[i] >= epoch for every i in [0, n) outside [skip_begin,
// skip_end); kernels enqueued after it on the same stream start only once it has returned. Wrap calls that
// return a status in CUCO_TRY(...).
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cuda/atomic>

#include "cuco_lsa.h"
#include "gemm_host.cuh"  // the workload's shared host code (Operands: sizes, x, w, y, xg, gemm_rows)

namespace {

constexpr int kChunks = 4;          // chunks per rank's shard
constexpr int kPutThreads = 512;    // threads per put CTA
constexpr int kLoadBatch = 4;       // 16-byte loads each thread keeps in flight before storing them
constexpr int kWarpVecsPerLane = 8; // 32 lanes x 8 x 16 B = 4 KiB per piece a warp owns
constexpr int kWaitThreads = 32;    // threads of a wait kernel (one flag each, strided)
constexpr int kVecBytes = 16;       // one uint4: 8 bf16
constexpr int kWarpSize = 32;
constexpr size_t kPieceVecs = (size_t)kWarpSize * kWarpVecsPerLane;

// Everything a put launch needs, passed by value.
struct PutArgs {
  const uint4* x;                   // this rank's shard as 16-byte vectors
  ncclWindow_t xg;                  // the "xg" window: ncclGetLsaPointer(xg, off, p) is p's xg + off
  uint64_t* const* flag_peers;      // device table: every rank's flag words
  unsigned long long* arrivals;     // local, [chunk][peer]: pieces stored so far, ever growing
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
  cuco_side_stream_t side;          // the puts' stream, forked off ctx->stream
  int grid_chunk;                   // CTAs of a put launch over one chunk

  // Free everything setup made (also after a failed setup); cuco_state<State>::close calls it.
  int release(cuco_ctx_t* ctx) {
    cuco_side_stream_destroy(&side);
    if (put.arrivals) cudaFree(put.arrivals);
    (void)ctx;
    return CUCO_OK;
  }
};

// Copy vectors [v0, v1) of src to dst: this lane takes v0 + lane, + stride, ... with kLoadBatch loads in flight
// (stride 32: a warp's lanes store neighbouring vectors, coalesced).
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

// Work items are (chunk, piece, peer), chunk-major so chunks complete in order. Each item is owned by one warp;
// after its stores the warp's leader bumps the (chunk, peer) arrival counter (acq_rel, system scope: it carries the
// warp's stores along) and the leader that completes the count raises the peer's (source = rank, chunk) flag.
__global__ void __launch_bounds__(kPutThreads) put_kernel(PutArgs a) {
  constexpr int kUnitsPerCta = kPutThreads / kWarpSize;
  constexpr size_t kPieceVecs = (size_t)kWarpSize * kWarpVecsPerLane;
  const int lane = (int)(threadIdx.x % kWarpSize);
  const size_t unit = (size_t)blockIdx.x * kUnitsPerCta + threadIdx.x / kWarpSize;
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
    copy_piece(dst, src, v0, v1, lane, kWarpSize);
    __syncwarp();
    if (lane == 0) {
      cuda::atomic_ref<unsigned long long, cuda::thread_scope_system> arrived(a.arrivals[(size_t)c * a.world + peer]);
      const unsigned long long before = arrived.fetch_add(1ull, cuda::memory_order_acq_rel);
      if ((before + 1) % a.pieces == 0)
        cuco_signal(cuco_user_flag(a.flag_peers, peer, (size_t)a.rank * kChunks + c), a.epoch);
    }
  }
}

// Spin until flags[i] >= epoch for every i in [0, n) outside [skip_begin, skip_end).
__global__ void wait_kernel(const uint64_t* flags, int n, int skip_begin, int skip_end, uint64_t epoch) {
  for (int i = threadIdx.x; i < n; i += blockDim.x)
    if (i < skip_begin || i >= skip_end) cuco_wait(flags + i, epoch);
}

// CTAs for a put launch over one chunk, capped at what can be resident with the GEMMs' ranks sharing the GPU.
int plan_grid(const cuco_ctx_t* ctx, State& s) {
  int occupancy = 0;
  CUCO_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occupancy, put_kernel, kPutThreads, 0));
  int sms = ctx->sm_count;
  if (sms <= 0) CUCO_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx->device));
  const int sharing = ctx->backend == CUCO_BACKEND_SYMM ? s.world : 1;  // ranks on this GPU
  const long long resident = std::max(1LL, (long long)sms * occupancy / sharing);
  const long long units_per_cta = kPutThreads / kWarpSize;
  const long long chunk_items = (long long)(s.world - 1) * (long long)s.put.pieces;
  s.grid_chunk = (int)std::max(1LL, std::min(resident, (chunk_items + units_per_cta - 1) / units_per_cta));
  return CUCO_OK;
}

int launch_puts(State& s, cudaStream_t stream, int c, uint64_t epoch) {
  PutArgs a = s.put;
  a.chunk_begin = c;
  a.chunk_end = c + 1;
  a.epoch = epoch;
  put_kernel<<<s.grid_chunk, kPutThreads, 0, stream>>>(a);
  return cuco_cuda_status(cudaGetLastError());
}

int launch_wait(const uint64_t* flags, int n, int skip_begin, int skip_end, uint64_t epoch, cudaStream_t stream) {
  wait_kernel<<<1, kWaitThreads, 0, stream>>>(flags, n, skip_begin, skip_end, epoch);
  return cuco_cuda_status(cudaGetLastError());
}

int schedule(cuco_ctx_t* ctx, State& s) {
  cublasHandle_t h = (cublasHandle_t)ctx->cublas;
  CUCO_CUBLAS_TRY(cublasSetStream(h, ctx->stream));
  const int own_row0 = s.rank * s.rows_per_rank;
  if (s.world == 1) return s.gemm_rows(h, s.x, own_row0, s.rows_per_rank);  // nothing to gather
  const uint64_t epoch = ctx->epoch;
  // The puts read this step's x, which the harness filled on ctx->stream: fork the side stream off it.
  CUCO_TRY(cuco_side_stream_fork(&s.side, ctx->stream));
  for (int c = 0; c < kChunks; ++c) CUCO_TRY(launch_puts(s, s.side.stream, c, epoch));
  // EXERCISE-GAP-START before_local (your code, if any: before this rank's own rows are GEMMed)
  // EXERCISE-GAP-END
  CUCO_TRY(s.gemm_rows(h, s.x, own_row0, s.rows_per_rank));  // this rank's own rows: straight from x
  for (int c = 0; c < kChunks; ++c) {
    for (int j = 0; j < s.world - 1; ++j) {
      const int src = (s.rank - 1 - j + s.world) % s.world;  // the rank whose chunk c this GEMM reads
      const int row0 = src * s.rows_per_rank + c * s.chunk_rows;
      // EXERCISE-GAP-START per_chunk (your code, if any: before the GEMM of chunk c of rank src)
      // EXERCISE-GAP-END
      CUCO_TRY(s.gemm_rows(h, s.xg + (size_t)row0 * s.K, row0, s.chunk_rows));
    }
  }
  return cuco_side_stream_join(&s.side, ctx->stream);  // rejoin the side stream
}

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
  a.pieces = (a.chunk_vecs + kPieceVecs - 1) / kPieceVecs;

  int rc = plan_grid(ctx, *s);
  if (rc == CUCO_OK) rc = cuco_alloc_zeroed(&a.arrivals, (size_t)kChunks * W);
  if (rc == CUCO_OK) rc = cuco_side_stream_create(&s->side);  // puts ahead of queued GEMM CTAs
  return cuco_state<State>::settle(ctx, rc);  // the arrival counters are zero before step 1
}

CUCO_EXPORT int cuco_step(cuco_ctx_t* ctx) {
  State* s = cuco_state<State>::get(ctx);
  return s == nullptr ? CUCO_ERR_PARAM : schedule(ctx, *s);
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) { return cuco_state<State>::close(ctx); }
