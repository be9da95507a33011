// device_lsa.cu — KV-cache transfer prefill -> decode, device-initiated baseline in NCCL-LSA form (one source,
// both backends).
// cuco: backends=nccl,symm
//
// Rank 0 is the prefill rank, ranks 1..W-1 decode ranks (each receives the whole KV); at world size 1 rank 0
// plays both roles. Sizes are workload parameters; a token row is 2*KVD bf16 = [K | V], moved as 16-byte vectors:
//
//     h          [S, D]             prefill's hidden states            (input "h", rank 0)
//     wkv        [L, D, 2*KVD]      per-layer K/V projections          (input "wkv", rank 0)
//     kv_stage   [L, S, 2*KVD]      KV_l = h @ wkv[l] in token order   (scratch window "kv_stage", kv_host.cuh)
//     page_table [S/PAGE]           logical -> physical page, owned by each decode rank   (input "page_table")
//     kv_cache   [L, S, 2*KVD]      the decode cache; paged (PAGE > 0): token t of layer l lives at row
//                                   page_table[t / PAGE] * PAGE + t % PAGE of layer l     (output "kv_cache")
//
// Instead of send/recv after each GEMM (seed_nccl.cu), the prefill rank STORES each layer's rows straight into
// every decode rank's cache through NVLink load/store access (LSA: ncclGetLsaPointer maps a peer's window into
// our address space), scattering by the decode rank's own page table, and raises epoch flags in the decode
// rank's flag region. Layer l's transfer overlaps layer l+1's GEMM:
//
//   prefill ctx->stream:  GEMM 0 ─ev─ GEMM 1 ─ev─ GEMM 2 ─ ...                    ◀── join ── (step ends)
//   prefill side stream:          └▶ put 0 ──────└▶ put 1 ──────└▶ put 2 ... ─────────┘
//        put l: chunk c of kChunkTokens rows ──16-B stores──▶ decode d's kv_cache[l] at its physical rows
//               then flag(l, c) on d (kSyncScope = kChunk) or, from the last CTA, flag(l) on d (kLayer)
//   decode ctx->stream:   wait kernel: spin until every flag of this step reached ctx->epoch
//
// Design space (the knob block; every combination compiles and is meant as a complete, correct variant):
//   kPlacement  kSequential  GEMM l then put l, both on ctx->stream: no overlap (the device-initiated twin of
//                            the seed)
//               kTwoStream   puts on a high-priority side stream, each waiting on an event recorded after its
//                            layer's GEMM; joined back to ctx->stream before cuco_step returns
//               kPull        the decode rank LOADS: the prefill rank raises flag(l) after GEMM l (a tiny signal
//                            kernel on ctx->stream) and the decode rank runs one pull kernel for all layers that
//                            waits per chunk and copies rank 0's kv_stage into its cache. At world size 1 the
//                            pull runs after the GEMMs on the same stream (a spin on a kernel of another stream
//                            of the same process has no forward-progress guarantee), so nothing overlaps there.
//   kSyncScope  kLayer       one flag per layer: the put kernel's last CTA to finish (an ever-growing per-layer
//                            counter) raises it; the decode waits L flags
//               kChunk       one flag per (layer, chunk), raised by the unit that stored the chunk; finer
//                            grained readiness, more flag traffic. Under kPull the GEMM publishes a whole layer at
//                            once, so the prefill raises all of a layer's chunk flags together
//   kIssuer     kWarp / kCta: the unit that owns one chunk (for one decode rank): resolves its rows through the
//                            page table into shared memory, copies with lane-strided 16-byte vectors, signals
//   kPutBlocks  CTAs of the put (or pull) kernel: SMs taken from the concurrent GEMM vs transfer bandwidth
//   kChunkTokens tokens per chunk: the unit of work and, with kChunk, of signalling
//   kPutThreads, kLoadBatch  put / pull CTA size; 16-byte loads each thread keeps in flight before storing them
//               (with kPutBlocks and kChunkTokens: the per-layer kernel's shape)
//
// Signalling (cuco_abi.h): ctx->epoch is 1 on the first step and +1 per step; a producer stores `epoch`
// (cuco_signal: a release store at system scope after the unit's barrier, so all the unit's stores are
// published) and the consumer waits for `>= epoch` (cuco_wait: acquire loads at system scope), so flags are
// never reset and a stale one never satisfies a wait. Flag words (past CUCO_FLAGS_RESERVED) on each decode rank:
// l * flags_per_layer + c.
// Reuse of kv_stage and of the decode cache across steps relies on the harness: every step ends with a
// synchronise and a host + device barrier, and outputs are poisoned before the barrier.
//
// Build: nvcc ... (nccl backend, links NCCL and cuBLAS) or with -DCUCO_BUILD_SYMM=1 (lsa_compat.h over the
// harness's peer tables: 2-4 ranks sharing one GPU run the same kernels). Row-major GEMM through cuBLAS's
// column-major API (KV_l^T = Wkv_l^T H^T): see seed_nccl.cu.
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cuda/atomic>

#include "cuco_lsa.h"
#include "kv_host.cuh"  // the workload's shared host code: frozen, on the include path (build.for_workload)

namespace {

using namespace kv_transfer;  // parameters, tensors, the prefill GEMM: shared by all three sources

enum class Placement { kSequential, kTwoStream, kPull };
enum class SyncScope { kLayer, kChunk };
enum class Issuer { kWarp, kCta };

// EVOLVE-BLOCK-START knobs
constexpr Placement kPlacement = Placement::kTwoStream;  // knob: {Placement::kSequential, Placement::kTwoStream, Placement::kPull}
constexpr SyncScope kSyncScope = SyncScope::kChunk;  // knob: {SyncScope::kLayer, SyncScope::kChunk}
constexpr Issuer kIssuer = Issuer::kWarp;  // knob: {Issuer::kWarp, Issuer::kCta}
constexpr int kPutBlocks = 32;  // knob: range 4..64 step 4
constexpr int kChunkTokens = 32;  // knob: {8, 16, 32, 64, 128, 256, 512}
// Threads per put / pull CTA, whole warps (a kWarp unit never straddles two CTAs), and the 16-byte loads each
// thread keeps in flight before storing them.
constexpr int kPutThreads = 512;  // knob: range 128..1024 step 128
constexpr int kLoadBatch = 4;  // knob: pow2 1..16
// (Each unit's row map, kChunkTokens ints with kPutThreads / 32 units in a kWarp CTA, is static shared memory of
// the put and pull kernels: at most 64 KiB here, within the 227 KiB a CTA may have on sm_90, so no rule is needed.)
// EVOLVE-BLOCK-END

// EVOLVE-BLOCK-START tuning
constexpr int kWaitThreads = 256;    // threads of the decode rank's wait kernel (one flag each, strided)
constexpr int kSignalThreads = 256;  // threads of the pull-mode signal kernel
// EVOLVE-BLOCK-END

constexpr int kWarpSize = 32;
// No kernel here uses an LSA barrier; one keeps the devComm request identical across variants.
constexpr int kLsaBarriers = 1;

// What the kernels assume of the tunable values (whole warps per CTA: a warp unit never straddles CTAs).
static_assert(kPutThreads % kWarpSize == 0 && kPutThreads <= 1024, "kPutThreads: whole warps, at most 1024");
static_assert(kChunkTokens > 0 && kPutBlocks > 0 && kLoadBatch > 0, "chunk, grid and batch must be positive");
static_assert(kWaitThreads > 0 && kSignalThreads > 0, "wait / signal kernels need threads");

// Shape of the transfer, passed by value to every kernel.
struct Geometry {
  int L, S;
  int page;             // tokens per page, kContiguous (0) for the contiguous cache
  int row_vecs;         // 16-byte vectors per token row (2*KVD bf16)
  int n_chunks;         // ceil(S / kChunkTokens)
  int flags_per_layer;  // n_chunks (kChunk) or 1 (kLayer)
  size_t layer_bytes;   // S rows: the distance between layers in kv_stage and in kv_cache (both layouts)
};

// Push (prefill side): one launch per layer.
struct PutArgs {
  const uint4* stage;             // local kv_stage, all layers
  ncclWindow_t cache;             // kv_cache window: ncclGetLsaPointer(cache, off, d) is decode d's cache + off
  ncclWindow_t table;             // page_table window: decode d's own table
  uint64_t* const* flag_peers;    // device table: every rank's flag words
  unsigned long long* done_ctas;  // local, per layer: CTAs finished so far, ever growing (kLayer)
  Geometry g;
  int first_decode, n_decode;     // decode ranks [first_decode, first_decode + n_decode)
  int layer;
  uint64_t epoch;
};

// Pull (decode side): one launch for all layers.
struct PullArgs {
  ncclWindow_t stage;             // kv_stage window: rank 0's copy is read
  uint4* cache;                   // local kv_cache
  const int* table;               // local page table
  const uint64_t* my_flags;       // this rank's first candidate flag word
  Geometry g;
  uint64_t epoch;
};

struct State {
  int L, rank, world;
  bool prefill, decode;
  int first_decode, n_decode;
  Projection proj;                // the prefill GEMMs (h, wkv -> local kv_stage)
  uint64_t* const* flag_peers;
  const uint64_t* my_flags;       // local, past the runtime's reserved words
  Geometry g;
  PutArgs put;                    // layer and epoch are set per launch
  PullArgs pull;                  // epoch is set per launch
  ncclDevComm dc;
  bool dc_made;
  cuco_side_stream_t side;        // kTwoStream: the puts' stream, forked after each GEMM

  // Free everything setup made (also after a failed setup); cuco_state<State>::close calls it.
  int release(cuco_ctx_t* ctx) {
    cuco_side_stream_destroy(&side);
    if (put.done_ctas) cudaFree(put.done_ctas);
    return dc_made ? cuco_devcomm_destroy(ctx, &dc) : CUCO_OK;
  }
};

template <Issuer I>
__host__ __device__ constexpr int unit_threads() {
  return I == Issuer::kWarp ? kWarpSize : kPutThreads;
}

// EVOLVE-BLOCK-START kernels
// Order the whole unit's work before its leader acts on it (a signal, or reuse of the row map).
template <Issuer I>
__device__ __forceinline__ void unit_sync() {
  if constexpr (I == Issuer::kWarp) __syncwarp();
  if constexpr (I == Issuer::kCta) __syncthreads();
}

// Where token t lives in a cache paged by `table` (tokens per page `page`; kContiguous: row t).
__device__ __forceinline__ int physical_row(const int* table, int t, int page) {
  return page == kContiguous ? t : table[t / page] * page + t % page;
}

// One unit moves rows [t0, t0 + rows) of a layer from `src` (token order) to `dst` (physical rows of `table`).
// The page table is read once per row into shared memory (`rowmap`), then every lane walks 16-byte vectors
// strided by the unit's width, kLoadBatch loads in flight before the stores. Plain loads, not __ldg: under
// kPull `src` is a peer's memory written during this very kernel's lifetime.
template <Issuer I>
__device__ __forceinline__ void copy_chunk(uint4* dst, const uint4* src, const int* table, int* rowmap, int t0,
                                           int rows, const Geometry& g, int lane) {
  constexpr int kStride = unit_threads<I>();
  for (int r = lane; r < rows; r += kStride) rowmap[r] = physical_row(table, t0 + r, g.page);
  unit_sync<I>();
  const int n = rows * g.row_vecs;
  for (int base = lane; base < n; base += kStride * kLoadBatch) {
    uint4 buf[kLoadBatch];
#pragma unroll
    for (int k = 0; k < kLoadBatch; ++k) {
      const int i = base + k * kStride;
      if (i < n) {
        const int r = i / g.row_vecs;
        buf[k] = src[(size_t)(t0 + r) * g.row_vecs + (i - r * g.row_vecs)];
      }
    }
#pragma unroll
    for (int k = 0; k < kLoadBatch; ++k) {
      const int i = base + k * kStride;
      if (i < n) {
        const int r = i / g.row_vecs;
        dst[(size_t)rowmap[r] * g.row_vecs + (i - r * g.row_vecs)] = buf[k];
      }
    }
  }
  unit_sync<I>();  // every store of the unit precedes its leader's signal; rowmap is free again
}

// Push one layer: work items are (chunk, decode rank), chunk-major so chunks land in order, decode rank fastest
// so every decode rank receives chunk c at about the same time. Each item belongs to one unit.
template <Issuer I, SyncScope Y>
__global__ void __launch_bounds__(kPutThreads) put_layer(PutArgs a) {
  constexpr int kUnitThreads = unit_threads<I>();
  constexpr int kUnitsPerCta = kPutThreads / kUnitThreads;
  __shared__ int rowmap[kUnitsPerCta][kChunkTokens];
  const Geometry& g = a.g;
  const int lane = (int)threadIdx.x % kUnitThreads;
  const int unit_in_cta = (int)threadIdx.x / kUnitThreads;
  const int n_units = (int)gridDim.x * kUnitsPerCta;
  const size_t layer_off = (size_t)a.layer * g.layer_bytes;
  const uint4* src = a.stage + layer_off / kVecBytes;
  const int items = g.n_chunks * a.n_decode;
  for (int item = (int)blockIdx.x * kUnitsPerCta + unit_in_cta; item < items; item += n_units) {
    const int c = item / a.n_decode;
    const int d = a.first_decode + item % a.n_decode;
    const int t0 = c * kChunkTokens;
    const int rows = min(kChunkTokens, g.S - t0);
    uint4* dst = (uint4*)ncclGetLsaPointer(a.cache, layer_off, d);
    const int* table = (const int*)ncclGetLsaPointer(a.table, 0, d);
    copy_chunk<I>(dst, src, table, rowmap[unit_in_cta], t0, rows, g, lane);
    if constexpr (Y == SyncScope::kChunk) {
      if (lane == 0)
        cuco_signal(cuco_user_flag(a.flag_peers, d, (size_t)a.layer * g.flags_per_layer + c), a.epoch);
    }
  }
  if constexpr (Y == SyncScope::kLayer) {
    // The CTA's stores, then one acq_rel count at system scope; whoever completes a multiple of the grid is the
    // last CTA of this launch, has acquired every other CTA's stores, and publishes them with the flag.
    __syncthreads();
    if (threadIdx.x == 0) {
      cuda::atomic_ref<unsigned long long, cuda::thread_scope_system> done(a.done_ctas[a.layer]);
      const unsigned long long before = done.fetch_add(1ull, cuda::memory_order_acq_rel);
      if ((before + 1) % gridDim.x == 0)
        for (int k = 0; k < a.n_decode; ++k)
          cuco_signal(cuco_user_flag(a.flag_peers, a.first_decode + k, (size_t)a.layer * g.flags_per_layer),
                      a.epoch);
    }
  }
}

// Pull every layer: items are (layer, chunk), layer-major so units follow the prefill's GEMM order. Each unit's
// leader waits for its flag, the unit's barrier carries the acquire to the other lanes, then the unit copies the
// chunk from rank 0's kv_stage into this rank's cache.
template <Issuer I, SyncScope Y>
__global__ void __launch_bounds__(kPutThreads) pull_all(PullArgs a) {
  constexpr int kUnitThreads = unit_threads<I>();
  constexpr int kUnitsPerCta = kPutThreads / kUnitThreads;
  __shared__ int rowmap[kUnitsPerCta][kChunkTokens];
  const Geometry& g = a.g;
  const int lane = (int)threadIdx.x % kUnitThreads;
  const int unit_in_cta = (int)threadIdx.x / kUnitThreads;
  const int n_units = (int)gridDim.x * kUnitsPerCta;
  const int items = g.L * g.n_chunks;
  for (int item = (int)blockIdx.x * kUnitsPerCta + unit_in_cta; item < items; item += n_units) {
    const int l = item / g.n_chunks;
    const int c = item % g.n_chunks;
    const int flag = Y == SyncScope::kChunk ? c : 0;
    if (lane == 0) cuco_wait(a.my_flags + (size_t)l * g.flags_per_layer + flag, a.epoch);
    unit_sync<I>();
    const size_t layer_off = (size_t)l * g.layer_bytes;
    const uint4* src = (const uint4*)ncclGetLsaPointer(a.stage, layer_off, kPrefillRank);
    const int t0 = c * kChunkTokens;
    copy_chunk<I>(a.cache + layer_off / kVecBytes, src, a.table, rowmap[unit_in_cta], t0,
                  min(kChunkTokens, g.S - t0), g, lane);
  }
}

// kPull, prefill side, stream-ordered after GEMM l: raise flags [flag0, flag0 + n_flags) on every decode rank.
// The GEMM finished before this kernel started; the fence publishes its writes system-wide before the flags.
__global__ void signal_staged(uint64_t* const* flag_peers, int first_decode, int n_decode, size_t flag0,
                              int n_flags, uint64_t epoch) {
  __threadfence_system();
  for (int i = threadIdx.x; i < n_decode * n_flags; i += blockDim.x)
    cuco_signal(cuco_user_flag(flag_peers, first_decode + i / n_flags, flag0 + i % n_flags), epoch);
}

// Push modes, decode side: hold ctx->stream until every flag of this step has reached the epoch.
__global__ void wait_flags(const uint64_t* flags, int n, uint64_t epoch) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) cuco_wait(flags + i, epoch);
}
// EVOLVE-BLOCK-END

// EVOLVE-BLOCK-START schedule
int launch_put(State& s, int layer, uint64_t epoch, cudaStream_t stream) {
  PutArgs a = s.put;
  a.layer = layer;
  a.epoch = epoch;
  put_layer<kIssuer, kSyncScope><<<kPutBlocks, kPutThreads, 0, stream>>>(a);
  return cuco_cuda_status(cudaGetLastError());
}

int launch_signal(const State& s, int layer, uint64_t epoch, cudaStream_t stream) {
  signal_staged<<<1, kSignalThreads, 0, stream>>>(s.flag_peers, s.first_decode, s.n_decode,
                                                  (size_t)layer * s.g.flags_per_layer, s.g.flags_per_layer,
                                                  epoch);
  return cuco_cuda_status(cudaGetLastError());
}

int launch_pull(const State& s, uint64_t epoch, cudaStream_t stream) {
  PullArgs a = s.pull;
  a.epoch = epoch;
  pull_all<kIssuer, kSyncScope><<<kPutBlocks, kPutThreads, 0, stream>>>(a);
  return cuco_cuda_status(cudaGetLastError());
}

int launch_wait(const State& s, uint64_t epoch, cudaStream_t stream) {
  wait_flags<<<1, kWaitThreads, 0, stream>>>(s.my_flags, s.L * s.g.flags_per_layer, epoch);
  return cuco_cuda_status(cudaGetLastError());
}

int schedule(cuco_ctx_t* ctx, State& s) {
  cublasHandle_t handle = (cublasHandle_t)ctx->cublas;
  CUCO_CUBLAS_TRY(cublasSetStream(handle, ctx->stream));
  const uint64_t epoch = ctx->epoch;

  if (s.prefill) {
    for (int l = 0; l < s.L; ++l) {
      CUCO_TRY(s.proj.gemm_layer(handle, l));
      if constexpr (kPlacement == Placement::kPull) {
        CUCO_TRY(launch_signal(s, l, epoch, ctx->stream));
      } else if constexpr (kPlacement == Placement::kSequential) {
        CUCO_TRY(launch_put(s, l, epoch, ctx->stream));
      } else {
        // The put of layer l waits for GEMM l only; GEMM l+1 goes on without waiting for the put.
        CUCO_TRY(cuco_side_stream_fork(&s.side, ctx->stream));
        CUCO_TRY(launch_put(s, l, epoch, s.side.stream));
      }
    }
    if constexpr (kPlacement == Placement::kTwoStream) {
      CUCO_TRY(cuco_side_stream_join(&s.side, ctx->stream));
    }
  }

  if (s.decode) {
    // Pull: at world size 1 the flags were raised above on this very stream, so the pull never spins.
    if constexpr (kPlacement == Placement::kPull) {
      CUCO_TRY(launch_pull(s, epoch, ctx->stream));
    } else {
      CUCO_TRY(launch_wait(s, epoch, ctx->stream));
    }
  }
  return CUCO_OK;
}
// EVOLVE-BLOCK-END

}  // namespace

CUCO_EXPORT int cuco_declare_scratch(const cuco_ctx_t* ctx, cuco_scratch_request_t* req, int max_req) {
  return declare_stage(ctx, req, max_req);
}

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  CUCO_CHECK_ABI(ctx);
  if (ctx->backend != cuco_build_backend) return CUCO_ERR_BACKEND;  // built for the other backend
  Problem pb;
  Tensors t;
  CUCO_TRY(open_problem(ctx, &pb, &t));
  const int W = pb.world;
  const int64_t n_chunks = (pb.S + kChunkTokens - 1) / kChunkTokens;
  const int64_t flags_per_layer = kSyncScope == SyncScope::kChunk ? n_chunks : 1;
  // Kernels index rows and vectors of one layer with int.
  if ((int64_t)pb.S * (int64_t)pb.row_vecs >= (int64_t)1 << 31) return CUCO_ERR_PARAM;
  if (ctx->flags.local == nullptr || ctx->flags.peers == nullptr ||
      ctx->flags.count < CUCO_FLAGS_RESERVED + (size_t)(pb.L * flags_per_layer))
    return CUCO_ERR_PARAM;  // not enough candidate flag words for one per (layer, chunk)
  // Push stores into the decode ranks' cache windows and reads their page tables; pull reads rank 0's kv_stage.
  if (cuco_window(t.cache) == nullptr || cuco_window(t.page_table) == nullptr || cuco_window(t.stage) == nullptr)
    return CUCO_ERR_BACKEND;

  State* s = cuco_state<State>::open(ctx);
  s->L = pb.L;
  s->rank = pb.rank;
  s->world = W;
  s->prefill = pb.rank == kPrefillRank;
  s->decode = W == 1 || pb.rank != kPrefillRank;
  s->first_decode = W == 1 ? kPrefillRank : kPrefillRank + 1;
  s->n_decode = W == 1 ? 1 : W - 1;
  s->proj = projection(pb, t);
  s->flag_peers = ctx->flags.peers;
  s->my_flags = ctx->flags.local + CUCO_FLAGS_RESERVED;

  Geometry& g = s->g;
  g.L = pb.L;
  g.S = pb.S;
  g.page = pb.page;
  g.row_vecs = (int)pb.row_vecs;
  g.n_chunks = (int)n_chunks;
  g.flags_per_layer = (int)flags_per_layer;
  g.layer_bytes = pb.layer_elems * kBf16Bytes;

  PutArgs& p = s->put;
  p.stage = (const uint4*)t.stage->local;
  p.cache = cuco_window(t.cache);
  p.table = cuco_window(t.page_table);
  p.flag_peers = ctx->flags.peers;
  p.g = g;
  p.first_decode = s->first_decode;
  p.n_decode = s->n_decode;

  PullArgs& q = s->pull;
  q.stage = cuco_window(t.stage);
  q.cache = (uint4*)t.cache->local;
  q.table = (const int*)t.page_table->local;
  q.my_flags = s->my_flags;
  q.g = g;

  int rc = cuco_devcomm_create_lsa_world(ctx, kLsaBarriers, &s->dc);  // every decode rank's cache reachable
  s->dc_made = rc == CUCO_OK;
  if (rc == CUCO_OK) rc = cuco_alloc_zeroed(&p.done_ctas, (size_t)pb.L);
  if (rc == CUCO_OK) rc = cuco_side_stream_create(&s->side);  // puts ahead of queued GEMM CTAs
  return cuco_state<State>::settle(ctx, rc);  // the CTA counters are zero before step 1
}

CUCO_EXPORT int cuco_step(cuco_ctx_t* ctx) {
  State* s = cuco_state<State>::get(ctx);
  return s == nullptr ? CUCO_ERR_PARAM : schedule(ctx, *s);
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) { return cuco_state<State>::close(ctx); }
