// SPDX-License-Identifier: Apache-2.0
/*
 * host_nccl_compat.h — how symm_nccl/nccl.h serves NCCL's host API over the ranks' shared memory. Included by
 * that header only (under nvcc); nothing here is API.
 *
 * Binding. The harness finds the exported cuco_host_nccl_bind with dlsym (it exists only in symm builds of
 * sources that include <nccl.h>), allocates a symmetric STAGING window per rank once per worker, zeroes it at
 * every load, and calls bind before cuco_setup; bind keeps every rank's window address and hands back this
 * library's one communicator (a static: the harness dlopens a private copy of the library per load, so each load
 * starts from fresh state) for ctx->nccl_comm.
 *
 * The staging window, per rank:
 *     [0, 4096)                flag words, 64-bit, counting up, never reset within a load:
 *         kCollWords + p         collective barriers rank p has reached (written by p)
 *         kReadyWords + p        chunks rank p has put into its slot for this rank (written by p)
 *         kAckWords + p          chunks of this rank's slot for p that p has consumed (written by p)
 *     [4096, 4096 + coll)      collective staging
 *     then world x slot        point to point: slot q holds this rank's chunk in flight to rank q
 * Flag stores are release, flag loads acquire, both at system scope (the peers are other processes, i.e. other
 * CUDA contexts on the same GPU), as in lsa_compat.h. Only 1-block kernels spin: ranks share the GPU under MPS,
 * and a full-grid spin could starve a peer's work. Copies and reductions run in separate, full kernels.
 *
 * A collective, per chunk of the staging's size: my data into my staging (copy kernel), barrier (announce the
 * chunk to every peer, wait until every peer announced it), the data kernel reads the peers' staging through the
 * mapped peer pointers and reduces or gathers into recvbuff, barrier again ("done reading") before the staging
 * is reused. Reductions accumulate in float (double for doubles, the type itself for integers) in rank order 0..W-1,
 * so every rank gets the same bits.
 *
 * Point to point. Sends to one peer within a group are one byte stream in call order, and so are receives from
 * one peer. A group runs in rounds: round r waits until each peer acknowledged the chunk before (one slot per
 * (sender, receiver) pair), copies every send's chunk r into its slot and raises the receiver's ready counter,
 * then waits for every receive's chunk r, copies it out of the sender's slot and acknowledges it (the
 * acknowledgement is sent with the next round's first kernel). Round r of every rank needs only round r - 1 of
 * its peers, so the rounds cannot deadlock, whatever the mix of sizes; send/receive to oneself is a direct copy.
 * Work on several streams of one group joins the first op's stream and forks back at the end, as NCCL orders it.
 *
 * Stress build (-DCUCO_STRESS=1): every flag store and every wait pauses as cuco_signal / cuco_wait do
 * (cuco_stress.h), and the library exports cuco_stress_configure, so the harness's L2 trials perturb these
 * waits too. The waits are bounded like every runtime wait (cuco_waits.h): a peer that never calls its side of
 * a collective or a send ends in a verdict naming the staging word, not in a hang.
 *
 * CUCO_SYMM_NCCL_CHUNK_BYTES (a define before <nccl.h>, tests only) caps a chunk, so small messages exercise the
 * multi-chunk paths.
 */
#ifndef CUCO_HOST_NCCL_COMPAT_H_
#define CUCO_HOST_NCCL_COMPAT_H_

#ifndef NCCL_H_
#error "include <nccl.h> (runtime/symm_nccl/nccl.h), not host_nccl_compat.h"
#endif

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda/atomic>
#include <vector>

#include "cuco_abi.h"
#include "cuco_stress.h"
#include "cuco_waits.h"

namespace cuco_host_nccl {

constexpr int kMaxRanks = CUCO_MAX_RANKS;
constexpr size_t kHeaderBytes = 4096;
constexpr size_t kCollWords = 0, kReadyWords = kMaxRanks, kAckWords = 2 * kMaxRanks;
static_assert((kAckWords + kMaxRanks) * sizeof(uint64_t) <= kHeaderBytes, "flag words overflow the header");
constexpr size_t kAlign = 256;  // every staging offset: vector loads, and no two ranks' chunks share a line
constexpr int kMaxSegs = 64;    // segments per copy launch (kernel parameters, ~1.5 KB)
constexpr int kThreads = 256;
constexpr int kMaxBlocks = 32;  // per segment or reduction: the GPU is shared with the other ranks
constexpr size_t kBytesPerBlock = 64 << 10;
#ifdef CUCO_SYMM_NCCL_CHUNK_BYTES
constexpr size_t kChunkCap = CUCO_SYMM_NCCL_CHUNK_BYTES;
#else
constexpr size_t kChunkCap = ~(size_t)0;
#endif

/* ---- device side ------------------------------------------------------------------------------------------- */

struct Flag {
  uint64_t* word;
  uint64_t value;
};

/* One launch's flag work: raise n_signal words, then wait until n_wait words reach their values. */
struct Flags {
  int n_signal, n_wait;
  Flag signal[kMaxRanks];
  Flag wait[kMaxRanks];
};

__global__ void flags_kernel(Flags f) {
  const int t = threadIdx.x;
  if (t < f.n_signal) {
    __threadfence_system();  // the copies stream-ordered before this kernel are visible before the flag
    cuda::atomic_ref<uint64_t, cuda::thread_scope_system>(*f.signal[t].word).store(f.signal[t].value,
                                                                                   cuda::memory_order_release);
    cuco_stress_after_signal(f.signal[t].word, f.signal[t].value);
  }
  if (t < f.n_wait) {
    cuco_wait_until(f.wait[t].word, f.wait[t].value, cuda::memory_order_acquire,
                    cuco_wait_site_t{CUCO_WAIT_HOST_NCCL, -1, -1}, /*nap_ns=*/32);
    cuco_stress_before_wait_returns(f.wait[t].word, f.wait[t].value);
  }
}

struct Seg {
  const char* src;
  char* dst;
  size_t bytes;
};

struct Segs {
  int n;
  Seg seg[kMaxSegs];
};

/* blockIdx.y picks the segment; 16-byte vectors where source and destination share their alignment. Loads
 * bypass L1 (__ldcg): the source may be a peer's staging, written by another context. */
__global__ void copy_kernel(Segs s) {
  const Seg g = s.seg[blockIdx.y];
  const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
  size_t head = 0, body = 0;
  if ((((uintptr_t)g.src ^ (uintptr_t)g.dst) & 15) == 0) {
    head = (16 - ((uintptr_t)g.src & 15)) & 15;
    if (head > g.bytes) head = g.bytes;
    body = (g.bytes - head) / 16;
  }
  const uint4* src = (const uint4*)(g.src + head);
  uint4* dst = (uint4*)(g.dst + head);
  for (size_t i = tid; i < body; i += stride) dst[i] = __ldcg(src + i);
  const size_t rest = head + body * 16;
  for (size_t i = tid; i < g.bytes - rest + head; i += stride) {
    const size_t b = i < head ? i : rest + (i - head);  // the unaligned head, then the tail
    g.dst[b] = __ldcg(g.src + b);
  }
}

template <typename T>
struct Acc {
  using type = T;  // integers reduce in their own type (wrapping, as NCCL's)
};
template <> struct Acc<__half> { using type = float; };
template <> struct Acc<__nv_bfloat16> { using type = float; };
template <> struct Acc<__nv_fp8_e4m3> { using type = float; };
template <> struct Acc<__nv_fp8_e5m2> { using type = float; };

template <int N> struct Bits;
template <> struct Bits<1> { using type = uint8_t; };
template <> struct Bits<2> { using type = uint16_t; };
template <> struct Bits<4> { using type = uint32_t; };
template <> struct Bits<8> { using type = unsigned long long; };

template <typename T>
__device__ __forceinline__ typename Acc<T>::type load_acc(const char* base, size_t i) {
  using B = typename Bits<sizeof(T)>::type;
  const B raw = __ldcg((const B*)base + i);
  T v;
  memcpy(&v, &raw, sizeof(T));
  return static_cast<typename Acc<T>::type>(v);
}

template <typename A>
__device__ __forceinline__ A combine(int op, A a, A b) {
  switch (op) {
    case ncclProd: return static_cast<A>(a * b);
    case ncclMax: return b > a ? b : a;
    case ncclMin: return b < a ? b : a;
    default: return static_cast<A>(a + b);  // ncclSum, ncclAvg (divided at the end)
  }
}

struct ReduceArgs {
  const char* src[kMaxRanks];  // every rank's staged elements, in rank order
  char* dst;
  size_t n;
  int nranks;
  int op;
  int vec;  // every src and dst 16-byte aligned: the body in 16-byte vectors
};

/* ncclAvg divides the sum by the number of ranks at the end. */
template <typename A>
__device__ __forceinline__ A finish(const ReduceArgs& a, A acc) {
  return a.op == ncclAvg ? static_cast<A>(acc / static_cast<A>(a.nranks)) : acc;
}

template <typename T>
__device__ __forceinline__ typename Acc<T>::type reduce_one(const ReduceArgs& a, size_t i) {
  using A = typename Acc<T>::type;
  A acc = load_acc<T>(a.src[0], i);
#pragma unroll 1
  for (int p = 1; p < a.nranks; ++p) acc = combine<A>(a.op, acc, load_acc<T>(a.src[p], i));
  return finish<A>(a, acc);
}

template <typename T>
__global__ void reduce_kernel(ReduceArgs a) {
  using A = typename Acc<T>::type;
  constexpr int V = 16 / sizeof(T);
  const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
  const size_t nvec = a.vec ? a.n / V : 0;
  for (size_t v = tid; v < nvec; v += stride) {
    A acc[V];
#pragma unroll 1
    for (int p = 0; p < a.nranks; ++p) {
      const uint4 u = __ldcg((const uint4*)a.src[p] + v);
      const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
      for (int j = 0; j < V; ++j)
        acc[j] = p == 0 ? static_cast<A>(e[j]) : combine<A>(a.op, acc[j], static_cast<A>(e[j]));
    }
    uint4 out;
    T* o = reinterpret_cast<T*>(&out);
#pragma unroll
    for (int j = 0; j < V; ++j) o[j] = static_cast<T>(finish<A>(a, acc[j]));
    ((uint4*)a.dst)[v] = out;
  }
  for (size_t i = nvec * V + tid; i < a.n; i += stride) ((T*)a.dst)[i] = static_cast<T>(reduce_one<T>(a, i));
}

/* ---- host side: state ----------------------------------------------------------------------------------- */

struct P2p {
  bool send;
  int peer;
  char* buf;
  size_t bytes;
  cudaStream_t stream;
};

}  // namespace cuco_host_nccl

/* This rank's communicator: one per loaded library. */
struct ncclComm {
  bool bound;
  int rank, nranks, device;
  char* base[CUCO_MAX_RANKS];  // every rank's staging window, mapped into this process (peers_host)
  size_t coll_bytes;           // collective staging per rank
  size_t slot_bytes;           // point-to-point slot per (sender, receiver) pair
  uint64_t barriers;           // collective barriers so far
  uint64_t sent[CUCO_MAX_RANKS], received[CUCO_MAX_RANKS];  // point-to-point chunks so far, per peer
  cudaStream_t last_stream;    // the stream of the last enqueued work (serialisation across streams)
  bool any_work;
  cudaEvent_t join;            // made at the first change of stream; kept (one per load): no CUDA call at dlclose
};

namespace cuco_host_nccl {

static ncclComm comm_;
static char last_error_[512];
static int group_depth_;
static ncclResult_t group_error_;
static std::vector<P2p> pending_;

static ncclResult_t fail(ncclResult_t r, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error_, sizeof(last_error_), fmt, ap);
  va_end(ap);
  return r;
}

static ncclResult_t cuda_failed(const char* what, cudaError_t e) {
  return fail(ncclUnhandledCudaError, "%s: %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e));
}

#define CUCO_HNCCL_CUDA(what, call)                                    \
  do {                                                                 \
    const cudaError_t e_ = (call);                                     \
    if (e_ != cudaSuccess) return cuco_host_nccl::cuda_failed(what, e_); \
  } while (0)

#define CUCO_HNCCL_TRY(call)                 \
  do {                                       \
    const ncclResult_t r_ = (call);          \
    if (r_ != ncclSuccess) return r_;        \
  } while (0)

static ncclResult_t check_comm(const char* fn, const ncclComm* c) {
  if (c == &comm_ && c->bound) return ncclSuccess;
  return fail(ncclInvalidArgument, "%s: comm is not this rank's communicator; under the symm backend use "
              "(ncclComm_t)ctx->nccl_comm, which the harness binds before cuco_setup", fn);
}

static size_t type_bytes(int t) {
  switch (t) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
  }
}

static uint64_t* words(int rank) { return (uint64_t*)comm_.base[rank]; }
static char* coll_area(int rank) { return comm_.base[rank] + kHeaderBytes; }
/* `from`'s slot for chunks in flight to `to`, in `from`'s window */
static char* slot(int from, int to) {
  return comm_.base[from] + kHeaderBytes + comm_.coll_bytes + to * comm_.slot_bytes;
}

/* Which capture sequence `s` belongs to: 0 when none, ~0 when it cannot be told (an invalidated capture). */
static unsigned long long capture_of(cudaStream_t s) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  if (cudaStreamGetCaptureInfo(s, &st, &id) != cudaSuccess) return ~0ull;
  return st == cudaStreamCaptureStatusNone ? 0 : st == cudaStreamCaptureStatusActive ? id : ~0ull;
}

/* `to` waits for everything enqueued on `from` so far. Only within one capture sequence (or none): an event may
 * not cross a capture boundary, and the harness synchronises between steps anyway. */
static ncclResult_t join_streams(cudaStream_t from, cudaStream_t to) {
  if (from == to) return ncclSuccess;
  const unsigned long long cf = capture_of(from), ct = capture_of(to);
  if (cf != ct || cf == ~0ull) return ncclSuccess;
  if (comm_.join == nullptr)
    CUCO_HNCCL_CUDA("cudaEventCreateWithFlags", cudaEventCreateWithFlags(&comm_.join, cudaEventDisableTiming));
  CUCO_HNCCL_CUDA("cudaEventRecord", cudaEventRecord(comm_.join, from));
  CUCO_HNCCL_CUDA("cudaStreamWaitEvent", cudaStreamWaitEvent(to, comm_.join, 0));
  return ncclSuccess;
}

/* The communicator's work is serialised in call order, across streams too (as NCCL's): the collective staging
 * and the flag counters assume it. */
static ncclResult_t begin_on(cudaStream_t s) {
  if (comm_.any_work) CUCO_HNCCL_TRY(join_streams(comm_.last_stream, s));
  comm_.last_stream = s;
  comm_.any_work = true;
  return ncclSuccess;
}

/* ---- host side: launches --------------------------------------------------------------------------------- */

static unsigned blocks_for(size_t bytes) {
  const size_t b = (bytes + kBytesPerBlock - 1) / kBytesPerBlock;
  return (unsigned)(b < 1 ? 1 : b > (size_t)kMaxBlocks ? kMaxBlocks : b);
}

static ncclResult_t launch_flags(const Flags& f, cudaStream_t s) {
  if (f.n_signal == 0 && f.n_wait == 0) return ncclSuccess;
  flags_kernel<<<1, 64, 0, s>>>(f);
  CUCO_HNCCL_CUDA("flag kernel launch", cudaGetLastError());
  return ncclSuccess;
}

static ncclResult_t launch_copies(const std::vector<Seg>& segs, cudaStream_t s) {
  for (size_t first = 0; first < segs.size(); first += kMaxSegs) {
    Segs batch;
    batch.n = 0;
    size_t largest = 0;
    for (size_t i = first; i < segs.size() && batch.n < kMaxSegs; ++i) {
      batch.seg[batch.n++] = segs[i];
      if (segs[i].bytes > largest) largest = segs[i].bytes;
    }
    copy_kernel<<<dim3(blocks_for(largest), (unsigned)batch.n), kThreads, 0, s>>>(batch);
    CUCO_HNCCL_CUDA("copy kernel launch", cudaGetLastError());
  }
  return ncclSuccess;
}

template <typename T>
static ncclResult_t launch_reduce_as(const ReduceArgs& a, cudaStream_t s) {
  reduce_kernel<T><<<blocks_for(a.n * sizeof(T)), kThreads, 0, s>>>(a);
  CUCO_HNCCL_CUDA("reduction kernel launch", cudaGetLastError());
  return ncclSuccess;
}

static ncclResult_t launch_reduce(int type, const ReduceArgs& a, cudaStream_t s) {
  switch (type) {
    case ncclInt8: return launch_reduce_as<int8_t>(a, s);
    case ncclUint8: return launch_reduce_as<uint8_t>(a, s);
    case ncclInt32: return launch_reduce_as<int32_t>(a, s);
    case ncclUint32: return launch_reduce_as<uint32_t>(a, s);
    case ncclInt64: return launch_reduce_as<int64_t>(a, s);
    case ncclUint64: return launch_reduce_as<uint64_t>(a, s);
    case ncclFloat16: return launch_reduce_as<__half>(a, s);
    case ncclFloat32: return launch_reduce_as<float>(a, s);
    case ncclFloat64: return launch_reduce_as<double>(a, s);
    case ncclBfloat16: return launch_reduce_as<__nv_bfloat16>(a, s);
    case ncclFloat8e4m3: return launch_reduce_as<__nv_fp8_e4m3>(a, s);
    case ncclFloat8e5m2: return launch_reduce_as<__nv_fp8_e5m2>(a, s);
    default: return fail(ncclInvalidArgument, "data type %d has no reduction", type);
  }
}

/* Every rank announces the next barrier to every peer and waits until every peer has announced it. */
static ncclResult_t barrier(cudaStream_t s) {
  if (comm_.nranks == 1) return ncclSuccess;
  const uint64_t seq = ++comm_.barriers;
  Flags f;
  f.n_signal = f.n_wait = 0;
  for (int p = 0; p < comm_.nranks; ++p) {
    if (p == comm_.rank) continue;
    f.signal[f.n_signal++] = Flag{words(p) + kCollWords + comm_.rank, seq};
    f.wait[f.n_wait++] = Flag{words(comm_.rank) + kCollWords + p, seq};
  }
  return launch_flags(f, s);
}

/* ---- collectives ------------------------------------------------------------------------------------------- */

enum class Coll { kAllReduce, kReduce, kBroadcast, kAllGather, kGather, kReduceScatter, kAlltoAll, kScatter };

struct CollCall {
  const char* name;
  Coll kind;
  const char* send;
  char* recv;
  size_t count;  // elements per rank (all-gather: sent; reduce-scatter: received; all-to-all: per peer)
  int type;
  int op;
  int root;
  ncclComm* comm;
  cudaStream_t stream;
};

static bool rooted(Coll k) {
  return k == Coll::kReduce || k == Coll::kBroadcast || k == Coll::kGather || k == Coll::kScatter;
}
static bool reduces(Coll k) { return k == Coll::kAllReduce || k == Coll::kReduce || k == Coll::kReduceScatter; }
/* Staged as one block per peer (rank q's block holds what goes to q). */
static bool per_peer(Coll k) { return k == Coll::kReduceScatter || k == Coll::kAlltoAll || k == Coll::kScatter; }

static ncclResult_t check_collective(const CollCall& k) {
  const ncclComm* c = k.comm;
  CUCO_HNCCL_TRY(check_comm(k.name, c));
  if (type_bytes(k.type) == 0)
    return fail(ncclInvalidArgument, "%s: data type %d is not an ncclDataType_t", k.name, k.type);
  if (reduces(k.kind) && (k.op < 0 || k.op >= ncclNumOps))
    return fail(ncclInvalidArgument, "%s: reduction op %d is not a built-in one (sum, prod, max, min, avg); custom "
                "ops are not served under symm", k.name, k.op);
  if (rooted(k.kind) && (k.root < 0 || k.root >= c->nranks))
    return fail(ncclInvalidArgument, "%s: root %d is not a rank of this %d-rank communicator", k.name, k.root,
                c->nranks);
  const bool sends = !(k.kind == Coll::kBroadcast || k.kind == Coll::kScatter) || c->rank == k.root;
  const bool receives = !(k.kind == Coll::kReduce || k.kind == Coll::kGather) || c->rank == k.root;
  if (k.count > 0 && ((sends && k.send == nullptr) || (receives && k.recv == nullptr)))
    return fail(ncclInvalidArgument, "%s: a NULL %s buffer with count %zu", k.name,
                sends && k.send == nullptr ? "send" : "receive", k.count);
  return ncclSuccess;
}

static ncclResult_t run_collective(const CollCall& k) {
  CUCO_HNCCL_TRY(check_collective(k));
  if (k.count == 0) return ncclSuccess;
  const int me = comm_.rank, W = comm_.nranks;
  const size_t es = type_bytes(k.type), N = k.count;
  const size_t block = per_peer(k.kind) ? comm_.coll_bytes / W / kAlign * kAlign : comm_.coll_bytes;
  const size_t cap = block / es;  // elements per chunk (per peer block when staged per peer)
  const bool my_data = !(k.kind == Coll::kBroadcast || k.kind == Coll::kScatter) || me == k.root;
  cudaStream_t s = k.stream;
  CUCO_HNCCL_TRY(begin_on(s));
  std::vector<Seg> segs;
  for (size_t off = 0; off < N; off += cap) {
    const size_t n = N - off < cap ? N - off : cap, bytes = n * es;
    // 1. my data into my staging
    segs.clear();
    if (my_data) {
      if (per_peer(k.kind))
        for (int q = 0; q < W; ++q)
          segs.push_back(Seg{k.send + ((size_t)q * N + off) * es, coll_area(me) + q * block, bytes});
      else
        segs.push_back(Seg{k.send + off * es, coll_area(me), bytes});
    }
    CUCO_HNCCL_TRY(launch_copies(segs, s));
    // 2. every rank's chunk is staged
    CUCO_HNCCL_TRY(barrier(s));
    // 3. read the peers' staging
    char* out = k.recv + off * es;
    if (reduces(k.kind)) {
      if (k.kind != Coll::kReduce || me == k.root) {
        ReduceArgs a;
        const size_t from = k.kind == Coll::kReduceScatter ? me * block : 0;
        bool aligned = ((uintptr_t)out & 15) == 0;
        for (int p = 0; p < W; ++p) {
          a.src[p] = coll_area(p) + from;
          aligned = aligned && ((uintptr_t)a.src[p] & 15) == 0;
        }
        a.dst = out;
        a.n = n;
        a.nranks = W;
        a.op = k.op;
        a.vec = aligned ? 1 : 0;
        CUCO_HNCCL_TRY(launch_reduce(k.type, a, s));
      }
    } else {
      segs.clear();
      switch (k.kind) {
        case Coll::kAllGather:
        case Coll::kGather:
          if (k.kind == Coll::kAllGather || me == k.root)
            for (int p = 0; p < W; ++p) segs.push_back(Seg{coll_area(p), k.recv + ((size_t)p * N + off) * es, bytes});
          break;
        case Coll::kAlltoAll:
          for (int p = 0; p < W; ++p)
            segs.push_back(Seg{coll_area(p) + me * block, k.recv + ((size_t)p * N + off) * es, bytes});
          break;
        case Coll::kBroadcast:
          if (me != k.root || k.send != k.recv) segs.push_back(Seg{coll_area(k.root), out, bytes});
          break;
        default:  // kScatter
          segs.push_back(Seg{coll_area(k.root) + me * block, out, bytes});
          break;
      }
      CUCO_HNCCL_TRY(launch_copies(segs, s));
    }
    // 4. every rank is done reading: the staging may be reused
    CUCO_HNCCL_TRY(barrier(s));
  }
  return ncclSuccess;
}

/* ---- point to point ---------------------------------------------------------------------------------------- */

/* The segments that move bytes [lo, hi) of the byte stream `ops` (buffers in call order) out of or into
 * `area`: out of the buffers into the area for sends, out of the area into the buffers for receives. */
static void stream_segments(const std::vector<const P2p*>& ops, size_t lo, size_t hi, char* area,
                            std::vector<Seg>& segs) {
  size_t start = 0;
  for (const P2p* op : ops) {
    const size_t end = start + op->bytes;
    const size_t a = lo > start ? lo : start, b = hi < end ? hi : end;
    if (a < b) {
      char* buf = op->buf + (a - start);
      char* at = area + (a - lo);
      segs.push_back(op->send ? Seg{buf, at, b - a} : Seg{at, buf, b - a});
    }
    start = end;
  }
}

/* Sends to oneself into receives from oneself, both byte streams in call order (equal totals). */
static void self_segments(const std::vector<const P2p*>& sends, const std::vector<const P2p*>& recvs,
                          std::vector<Seg>& segs) {
  size_t i = 0, j = 0, at_send = 0, at_recv = 0;
  while (i < sends.size() && j < recvs.size()) {
    const size_t left_send = sends[i]->bytes - at_send, left_recv = recvs[j]->bytes - at_recv;
    const size_t n = left_send < left_recv ? left_send : left_recv;
    segs.push_back(Seg{sends[i]->buf + at_send, recvs[j]->buf + at_recv, n});
    at_send += n;
    at_recv += n;
    if (at_send == sends[i]->bytes) ++i, at_send = 0;
    if (at_recv == recvs[j]->bytes) ++j, at_recv = 0;
  }
}

static size_t total(const std::vector<const P2p*>& ops) {
  size_t t = 0;
  for (const P2p* op : ops) t += op->bytes;
  return t;
}

static ncclResult_t run_group() {
  std::vector<P2p> ops;
  ops.swap(pending_);
  ncclResult_t err = group_error_;
  group_error_ = ncclSuccess;
  if (err != ncclSuccess || ops.empty()) return err;
  const int me = comm_.rank, W = comm_.nranks;
  std::vector<std::vector<const P2p*>> sends(W), recvs(W);
  for (const P2p& op : ops) (op.send ? sends : recvs)[op.peer].push_back(&op);
  const size_t self_sent = total(sends[me]), self_received = total(recvs[me]);
  if (self_sent != self_received)
    return fail(ncclInvalidUsage, "ncclGroupEnd: this rank sends %zu bytes to itself but receives %zu from itself in "
                "one group; the k-th send to a peer must match that peer's k-th receive", self_sent, self_received);

  // one stream for the group: the first op's; the others join it here and fork back at the end
  cudaStream_t s = ops[0].stream;
  CUCO_HNCCL_TRY(begin_on(s));
  std::vector<cudaStream_t> others;
  for (const P2p& op : ops) {
    bool seen = op.stream == s;
    for (cudaStream_t o : others) seen = seen || o == op.stream;
    if (!seen) {
      others.push_back(op.stream);
      CUCO_HNCCL_TRY(join_streams(op.stream, s));
    }
  }

  std::vector<Seg> segs;
  // to oneself: the send stream straight into the receive stream
  self_segments(sends[me], recvs[me], segs);
  CUCO_HNCCL_TRY(launch_copies(segs, s));

  const size_t chunk = comm_.slot_bytes;
  std::vector<size_t> out_bytes(W), in_bytes(W);
  size_t rounds = 0;
  for (int q = 0; q < W; ++q) {
    if (q == me) continue;
    out_bytes[q] = total(sends[q]);
    in_bytes[q] = total(recvs[q]);
    const size_t r = ((out_bytes[q] > in_bytes[q] ? out_bytes[q] : in_bytes[q]) + chunk - 1) / chunk;
    if (r > rounds) rounds = r;
  }
  Flags acks;  // acknowledgements owed for the chunks received in the round before
  acks.n_signal = acks.n_wait = 0;
  for (size_t r = 0; r < rounds; ++r) {
    const size_t lo = r * chunk;
    // the slots are free: each receiver consumed the chunk before
    Flags f = acks;
    for (int q = 0; q < W; ++q)
      if (q != me && lo < out_bytes[q]) f.wait[f.n_wait++] = Flag{words(me) + kAckWords + q, comm_.sent[q]};
    CUCO_HNCCL_TRY(launch_flags(f, s));
    segs.clear();
    for (int q = 0; q < W; ++q)
      if (q != me && lo < out_bytes[q]) stream_segments(sends[q], lo, lo + chunk, slot(me, q), segs);
    CUCO_HNCCL_TRY(launch_copies(segs, s));
    // chunk r is in every receiver's slot; wait for the chunks addressed to this rank
    f.n_signal = f.n_wait = 0;
    for (int q = 0; q < W; ++q) {
      if (q == me) continue;
      if (lo < out_bytes[q]) f.signal[f.n_signal++] = Flag{words(q) + kReadyWords + me, ++comm_.sent[q]};
      if (lo < in_bytes[q]) f.wait[f.n_wait++] = Flag{words(me) + kReadyWords + q, ++comm_.received[q]};
    }
    CUCO_HNCCL_TRY(launch_flags(f, s));
    segs.clear();
    acks.n_signal = 0;
    for (int q = 0; q < W; ++q) {
      if (q == me || lo >= in_bytes[q]) continue;
      stream_segments(recvs[q], lo, lo + chunk, slot(q, me), segs);
      acks.signal[acks.n_signal++] = Flag{words(q) + kAckWords + me, comm_.received[q]};
    }
    CUCO_HNCCL_TRY(launch_copies(segs, s));
  }
  CUCO_HNCCL_TRY(launch_flags(acks, s));
  for (cudaStream_t o : others) CUCO_HNCCL_TRY(join_streams(s, o));
  return ncclSuccess;
}

static ncclResult_t add_p2p(const char* fn, bool send, void* buf, size_t count, int type, int peer, ncclComm* c,
                            cudaStream_t stream) {
  ncclResult_t r = check_comm(fn, c);
  if (r == ncclSuccess && type_bytes(type) == 0)
    r = fail(ncclInvalidArgument, "%s: data type %d is not an ncclDataType_t", fn, type);
  if (r == ncclSuccess && (peer < 0 || peer >= c->nranks))
    r = fail(ncclInvalidArgument, "%s: peer %d is not a rank of this %d-rank communicator", fn, peer, c->nranks);
  if (r == ncclSuccess && count > 0 && buf == nullptr)
    r = fail(ncclInvalidArgument, "%s: a NULL buffer with count %zu", fn, count);
  if (r != ncclSuccess) {
    if (group_depth_ > 0) group_error_ = r;  // NCCL reports it again at ncclGroupEnd
    return r;
  }
  if (count > 0) pending_.push_back(P2p{send, peer, (char*)buf, count * type_bytes(type), stream});
  return group_depth_ > 0 ? ncclSuccess : run_group();
}

}  // namespace cuco_host_nccl

/* ---- the API ------------------------------------------------------------------------------------------------ */

/* Called by the harness (dlsym) before cuco_setup under symm: `staging` is this rank's window (every rank's
 * mapped through peers_host), zeroed. Returns CUCO_OK and this rank's communicator in *comm_out. */
CUCO_EXPORT int cuco_host_nccl_bind(cuco_ctx_t* ctx, const cuco_tensor_t* staging, void** comm_out) {
  using namespace cuco_host_nccl;
  if (ctx == nullptr || staging == nullptr || comm_out == nullptr || staging->peers_host == nullptr)
    return CUCO_ERR_PARAM;
  const int W = ctx->world_size;
  if (W < 1 || W > kMaxRanks || ctx->rank < 0 || ctx->rank >= W || staging->capacity_bytes <= kHeaderBytes)
    return CUCO_ERR_PARAM;
  const size_t data = staging->capacity_bytes - kHeaderBytes;
  size_t coll = data / 2 / kAlign * kAlign;
  if (coll > kChunkCap) coll = kChunkCap / kAlign * kAlign;
  size_t slot_bytes = (data - coll) / W / kAlign * kAlign;
  if (slot_bytes > kChunkCap) slot_bytes = kChunkCap / kAlign * kAlign;
  if (coll / W < kAlign || slot_bytes < kAlign) return CUCO_ERR_PARAM;  // too small to stage a chunk per peer
  comm_ = ncclComm{};
  comm_.rank = ctx->rank;
  comm_.nranks = W;
  comm_.device = ctx->device;
  for (int p = 0; p < W; ++p) comm_.base[p] = (char*)staging->peers_host[p];
  comm_.coll_bytes = coll;
  comm_.slot_bytes = slot_bytes;
  comm_.bound = true;
  group_depth_ = 0;
  group_error_ = ncclSuccess;
  pending_.clear();
  last_error_[0] = '\0';
  *comm_out = &comm_;
  return CUCO_OK;
}

static inline ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return cuco_host_nccl::fail(ncclInvalidArgument, "ncclGetVersion: version is NULL");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

static inline const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (ncclGetLastError says which)";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument (ncclGetLastError says which)";
    case ncclInvalidUsage: return "invalid usage (ncclGetLastError says which)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

static inline const char* ncclGetLastError(ncclComm_t) { return cuco_host_nccl::last_error_; }

/* Everything is enqueued by the time a call returns: nothing is ever in progress. */
static inline ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  CUCO_HNCCL_TRY(cuco_host_nccl::check_comm("ncclCommGetAsyncError", comm));
  if (asyncError == nullptr)
    return cuco_host_nccl::fail(ncclInvalidArgument, "ncclCommGetAsyncError: asyncError is NULL");
  *asyncError = ncclSuccess;
  return ncclSuccess;
}

static inline ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  CUCO_HNCCL_TRY(cuco_host_nccl::check_comm("ncclCommCount", comm));
  if (count == nullptr) return cuco_host_nccl::fail(ncclInvalidArgument, "ncclCommCount: count is NULL");
  *count = comm->nranks;
  return ncclSuccess;
}

static inline ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  CUCO_HNCCL_TRY(cuco_host_nccl::check_comm("ncclCommCuDevice", comm));
  if (device == nullptr) return cuco_host_nccl::fail(ncclInvalidArgument, "ncclCommCuDevice: device is NULL");
  *device = comm->device;
  return ncclSuccess;
}

static inline ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  CUCO_HNCCL_TRY(cuco_host_nccl::check_comm("ncclCommUserRank", comm));
  if (rank == nullptr) return cuco_host_nccl::fail(ncclInvalidArgument, "ncclCommUserRank: rank is NULL");
  *rank = comm->rank;
  return ncclSuccess;
}

static inline ncclResult_t ncclMemAlloc(void** ptr, size_t size) {
  if (ptr == nullptr) return cuco_host_nccl::fail(ncclInvalidArgument, "ncclMemAlloc: ptr is NULL");
  CUCO_HNCCL_CUDA("ncclMemAlloc: cudaMalloc", cudaMalloc(ptr, size));
  return ncclSuccess;
}

static inline ncclResult_t ncclMemFree(void* ptr) {
  CUCO_HNCCL_CUDA("ncclMemFree: cudaFree", cudaFree(ptr));
  return ncclSuccess;
}

/* Setup and teardown belong to the harness under symm: making a communicator is refused with a reason, releasing
 * the harness's is a no-op (the harness releases it). */
static inline ncclResult_t ncclGetUniqueId(ncclUniqueId*) {
  return cuco_host_nccl::fail(ncclInvalidUsage, "ncclGetUniqueId: under the symm backend the harness owns the "
                              "communicator; use (ncclComm_t)ctx->nccl_comm");
}

static inline ncclResult_t ncclCommInitRank(ncclComm_t*, int, ncclUniqueId, int) {
  return cuco_host_nccl::fail(ncclInvalidUsage, "ncclCommInitRank: under the symm backend the harness owns the "
                              "communicator; use (ncclComm_t)ctx->nccl_comm");
}

static inline ncclResult_t ncclCommInitRankConfig(ncclComm_t*, int, ncclUniqueId, int, ncclConfig_t*) {
  return cuco_host_nccl::fail(ncclInvalidUsage, "ncclCommInitRankConfig: under the symm backend the harness owns "
                              "the communicator; use (ncclComm_t)ctx->nccl_comm");
}

static inline ncclResult_t ncclCommInitAll(ncclComm_t*, int, const int*) {
  return cuco_host_nccl::fail(ncclInvalidUsage, "ncclCommInitAll: under the symm backend the harness owns the "
                              "communicator; use (ncclComm_t)ctx->nccl_comm");
}

static inline ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  return cuco_host_nccl::check_comm("ncclCommFinalize", comm);
}

static inline ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  return cuco_host_nccl::check_comm("ncclCommDestroy", comm);
}

static inline ncclResult_t ncclCommAbort(ncclComm_t comm) { return cuco_host_nccl::check_comm("ncclCommAbort", comm); }

static inline ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                      ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  using namespace cuco_host_nccl;
  return run_collective(CollCall{"ncclReduce", Coll::kReduce, (const char*)sendbuff, (char*)recvbuff, count,
                                 datatype, op, root, comm, stream});
}

static inline ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                         int root, ncclComm_t comm, cudaStream_t stream) {
  using namespace cuco_host_nccl;
  return run_collective(CollCall{"ncclBroadcast", Coll::kBroadcast, (const char*)sendbuff, (char*)recvbuff, count,
                                 datatype, 0, root, comm, stream});
}

static inline ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                                     cudaStream_t stream) {
  return ncclBroadcast(buff, buff, count, datatype, root, comm, stream);
}

static inline ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                         ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  using namespace cuco_host_nccl;
  return run_collective(CollCall{"ncclAllReduce", Coll::kAllReduce, (const char*)sendbuff, (char*)recvbuff, count,
                                 datatype, op, 0, comm, stream});
}

static inline ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                             ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                             cudaStream_t stream) {
  using namespace cuco_host_nccl;
  return run_collective(CollCall{"ncclReduceScatter", Coll::kReduceScatter, (const char*)sendbuff, (char*)recvbuff,
                                 recvcount, datatype, op, 0, comm, stream});
}

static inline ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                         ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  using namespace cuco_host_nccl;
  return run_collective(CollCall{"ncclAllGather", Coll::kAllGather, (const char*)sendbuff, (char*)recvbuff,
                                 sendcount, datatype, 0, 0, comm, stream});
}

static inline ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                        ncclComm_t comm, cudaStream_t stream) {
  using namespace cuco_host_nccl;
  return run_collective(CollCall{"ncclAlltoAll", Coll::kAlltoAll, (const char*)sendbuff, (char*)recvbuff, count,
                                 datatype, 0, 0, comm, stream});
}

static inline ncclResult_t ncclGather(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                      int root, ncclComm_t comm, cudaStream_t stream) {
  using namespace cuco_host_nccl;
  return run_collective(CollCall{"ncclGather", Coll::kGather, (const char*)sendbuff, (char*)recvbuff, count,
                                 datatype, 0, root, comm, stream});
}

static inline ncclResult_t ncclScatter(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                       int root, ncclComm_t comm, cudaStream_t stream) {
  using namespace cuco_host_nccl;
  return run_collective(CollCall{"ncclScatter", Coll::kScatter, (const char*)sendbuff, (char*)recvbuff, count,
                                 datatype, 0, root, comm, stream});
}

static inline ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                                    ncclComm_t comm, cudaStream_t stream) {
  return cuco_host_nccl::add_p2p("ncclSend", true, (void*)sendbuff, count, datatype, peer, comm, stream);
}

static inline ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                                    ncclComm_t comm, cudaStream_t stream) {
  return cuco_host_nccl::add_p2p("ncclRecv", false, recvbuff, count, datatype, peer, comm, stream);
}

static inline ncclResult_t ncclGroupStart() {
  ++cuco_host_nccl::group_depth_;
  return ncclSuccess;
}

static inline ncclResult_t ncclGroupEnd() {
  using namespace cuco_host_nccl;
  if (group_depth_ == 0) return fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  return --group_depth_ > 0 ? ncclSuccess : run_group();
}

#undef CUCO_HNCCL_CUDA
#undef CUCO_HNCCL_TRY

#endif /* CUCO_HOST_NCCL_COMPAT_H_ */
