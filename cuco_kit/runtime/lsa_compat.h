// SPDX-License-Identifier: Apache-2.0
/*
 * lsa_compat.h — the subset of NCCL's device API (2.28) that the samples use, for the `symm` backend.
 *
 * Included by cuco_lsa.h when built with -DCUCO_BUILD_SYMM=1, INSTEAD of <nccl.h>/<nccl_device.h>. Under symm
 * the ranks are separate processes sharing one GPU; the harness hands each a device-resident table of peer
 * pointers per tensor (cuco_tensor_t::peers) and a flag region (cuco_flags_t). This header gives the same
 * names and semantics as NCCL so an NCCL-LSA kernel compiles and runs unchanged:
 *
 *   ncclDevComm            rank, nRanks, lsaRank, lsaSize (lsa team == world: every rank is on this GPU)
 *   ncclTeam, ncclTeamLsa(devComm), ncclTeamWorld(devComm), ncclTeamTagLsa, ncclTeamTagWorld
 *   ncclWindow_t           a compat window IS the tensor's device peer table: (ncclWindow_t)tensor->peers
 *   ncclGetLsaPointer(w, off, peer), ncclGetPeerPointer(w, off, peer), ncclGetLocalPointer(w, off)
 *   ncclCoopCta, ncclCoopThread, ncclCoopWarp, ncclCoopTile<N>   (thread_rank, size, num_threads, sync)
 *   ncclLsaBarrierSession<Coop>(coop, devComm, ncclTeamTagLsa{}, index)  arrive / wait / sync(coop, order)
 *
 * GIN (puts, signals, counters, flush) is gin_compat.h's, over the same devComm.
 * Not provided (a candidate using them fails to build under symm, which is the honest outcome): multimem,
 * resource buffers, LL all-to-all, handle-based barrier sessions.
 *
 * Barriers live in the runtime-reserved words of the flag region. Words [0, CUCO_COMPAT_HEADER_WORDS) are
 * left to the harness / future bookkeeping; each devComm then takes the next B*(1+W) words (B LSA barriers,
 * W ranks), starting at devComm.barrierBase:
 *     base + i                 epoch of barrier i (this rank's own session state)
 *     base + B + i*W + p       inbox: highest epoch rank p announced for barrier i
 * Everything counts up with 64-bit values and is never reset: the harness zeroes the region once per loaded
 * candidate, and a stale value can never satisfy a later wait. Stores and loads are system scope because the
 * peers are other processes (other CUDA contexts) on the same device.
 */
#ifndef CUCO_LSA_COMPAT_H_
#define CUCO_LSA_COMPAT_H_

#include <stdint.h>
#include <cuda_runtime_api.h>
#include "cuco_abi.h"
#include "cuco_waits.h" /* the barrier's waits are bounded like every runtime wait */
#ifdef __CUDACC__
#include <cuda/atomic>
#endif

#define CUCO_COMPAT_HEADER_WORDS 64

#ifdef __CUDACC__
#define CUCO_DEVICE_INLINE __device__ __forceinline__
#define CUCO_HOST_DEVICE_INLINE __host__ __device__ __forceinline__
#else
#define CUCO_DEVICE_INLINE inline
#define CUCO_HOST_DEVICE_INLINE inline
#endif

/* ---- communicator, teams, windows ------------------------------------------------------------------- */

/* Opaque: a compat window handle is the device-resident peer table of one tensor (void* const*). */
struct cuco_compat_window;
typedef struct cuco_compat_window* ncclWindow_t;

struct ncclTeam {
  int nRanks, rank, stride;
};
typedef struct ncclTeam ncclTeam_t;

struct ncclTeamTagWorld {};
struct ncclTeamTagLsa {};

struct ncclDevComm {
  int rank, nRanks;
  int lsaRank, lsaSize;
  /* compat only: the flag region's device peer table, where this devComm's barrier words start in it (several
   * devComms get disjoint words) and how many LSA barriers it has */
  uint64_t* const* flagPeers;
  size_t barrierBase;
  int lsaBarrierCount;
  /* GIN (gin_compat.h), NCCL's names: contexts, signals and counters per context (0 when made without GIN), and
   * compat only: where this devComm's GIN words start in the flag region */
  int ginContextCount;
  int ginSignalCount;
  int ginCounterCount;
  size_t ginBase;
};
typedef struct ncclDevComm ncclDevComm_t;

CUCO_HOST_DEVICE_INLINE ncclTeam ncclTeamWorld(ncclDevComm const& comm) {
  ncclTeam t;
  t.nRanks = comm.nRanks;
  t.rank = comm.rank;
  t.stride = 1;
  return t;
}

CUCO_HOST_DEVICE_INLINE ncclTeam ncclTeamLsa(ncclDevComm const& comm) {
  ncclTeam t;
  t.nRanks = comm.lsaSize;
  t.rank = comm.lsaRank;
  t.stride = 1;
  return t;
}

#ifdef __CUDACC__
/* The rank of this process, for ncclGetLocalPointer (the real window knows its own rank; a bare peer table
 * does not). Set by cuco_devcomm_create; -1 until then, and ncclGetLocalPointer traps on it rather than
 * silently returning rank 0's memory. One copy per loaded candidate module, i.e. per rank process. */
static __device__ int cuco_compat_rank_ = -1;

CUCO_DEVICE_INLINE void* ncclGetLsaPointer(ncclWindow_t w, size_t offset, int peer) {
  return (char*)((void* const*)w)[peer] + offset;
}

/* World rank == LSA rank here: all ranks share the device. */
CUCO_DEVICE_INLINE void* ncclGetPeerPointer(ncclWindow_t w, size_t offset, int peer) {
  return ncclGetLsaPointer(w, offset, peer);
}

CUCO_DEVICE_INLINE void* ncclGetPeerPointer(ncclWindow_t w, size_t offset, ncclTeam tm, int peer) {
  return ncclGetLsaPointer(w, offset, peer * tm.stride);
}

CUCO_DEVICE_INLINE void* ncclGetLocalPointer(ncclWindow_t w, size_t offset) {
  int me = cuco_compat_rank_;
  if (me < 0) __trap(); /* cuco_devcomm_create was never called in this candidate */
  return ncclGetLsaPointer(w, offset, me);
}
#endif /* __CUDACC__ */

/* ---- cooperative groups (NCCL's ncclCoop* subset) ---------------------------------------------------- */

#ifdef __CUDACC__
namespace cuco_compat {
CUCO_DEVICE_INLINE int lane() {
  int l;
  asm("mov.u32 %0, %%laneid;" : "=r"(l));
  return l;
}
}  // namespace cuco_compat

template <int nThreadsPow2>
struct ncclCoopTile {
  static_assert(nThreadsPow2 > 0 && nThreadsPow2 <= 32 && (nThreadsPow2 & (nThreadsPow2 - 1)) == 0,
                "ncclCoopTile: a power of two up to 32 threads");
  CUCO_DEVICE_INLINE int thread_rank() const { return cuco_compat::lane() % nThreadsPow2; }
  CUCO_DEVICE_INLINE constexpr int size() const { return nThreadsPow2; }
  CUCO_DEVICE_INLINE constexpr int num_threads() const { return nThreadsPow2; }
  CUCO_DEVICE_INLINE uint32_t laneMask() const {
    return (~0u >> (32 - nThreadsPow2)) << (cuco_compat::lane() & -nThreadsPow2);
  }
  CUCO_DEVICE_INLINE void sync() {
    if (nThreadsPow2 > 1) __syncwarp(laneMask());
  }
};
typedef ncclCoopTile<1> ncclCoopThread;
typedef ncclCoopTile<32> ncclCoopWarp;

struct ncclCoopCta {
  CUCO_DEVICE_INLINE int thread_rank() const { return threadIdx.x; }
  CUCO_DEVICE_INLINE int size() const { return blockDim.x; }
  CUCO_DEVICE_INLINE int num_threads() const { return blockDim.x; }
  CUCO_DEVICE_INLINE void sync() { __syncthreads(); }
};

/* ---- LSA barrier ---------------------------------------------------------------------------------------- */

namespace cuco_compat {
/* The release half / acquire half of an order, as NCCL's nccl::utility::{release,acquire}OrderOf. */
CUCO_DEVICE_INLINE cuda::memory_order release_of(cuda::memory_order o) {
  return o == cuda::memory_order_acquire ? cuda::memory_order_relaxed
         : o == cuda::memory_order_acq_rel ? cuda::memory_order_release
                                           : o;
}
CUCO_DEVICE_INLINE cuda::memory_order acquire_of(cuda::memory_order o) {
  return o == cuda::memory_order_release ? cuda::memory_order_relaxed
         : o == cuda::memory_order_acq_rel ? cuda::memory_order_acquire
                                           : o;
}
}  // namespace cuco_compat

/* Same contract as NCCL's: every member of the team constructs a session for the same `index` (typically
 * blockIdx.x, so each block pairs with the same block on every peer), arrive() announces this rank reached the
 * barrier (publishing its earlier writes when `order` has a release half), wait() returns once every peer has
 * arrived (acquiring their writes when `order` has an acquire half). The session's epoch is read from flag
 * memory in the constructor and written back in the destructor, so it persists across kernel launches. Bound by
 * the harness (cuco_waits.h), wait() gives up on a peer that never arrives, and the record names the barrier
 * and the peer. */
template <typename Coop>
struct ncclLsaBarrierSession {
  Coop coop;
  ncclDevComm const& comm;
  int index;
  uint64_t epoch;

  CUCO_DEVICE_INLINE ncclLsaBarrierSession(Coop c, ncclDevComm const& dc, ncclTeamTagLsa, uint32_t idx,
                                           bool multimem = false)
      : coop(c), comm(dc), index((int)idx), epoch(0) {
    if (multimem || index >= comm.lsaBarrierCount) __trap(); /* compat has no multimem; index out of range */
    epoch = *state();
  }

  CUCO_DEVICE_INLINE ~ncclLsaBarrierSession() {
    if (coop.thread_rank() == 0) *state() = epoch;
    coop.sync();
  }

  ncclLsaBarrierSession(ncclLsaBarrierSession const&) = delete;

  CUCO_DEVICE_INLINE void arrive(Coop, cuda::memory_order order) {
    coop.sync();
    const cuda::memory_order o = cuco_compat::release_of(order);
#pragma unroll 1
    for (int i = coop.thread_rank(); i < comm.lsaSize - 1; i += coop.size()) {
      int peer = i + (comm.lsaRank <= i ? 1 : 0);
      cuda::atomic_ref<uint64_t, cuda::thread_scope_system> slot(*inbox(peer, comm.lsaRank));
      slot.store(epoch + 1, o);
    }
  }

  CUCO_DEVICE_INLINE void wait(Coop, cuda::memory_order order) {
    const cuda::memory_order o = cuco_compat::acquire_of(order);
#pragma unroll 1
    for (int i = coop.thread_rank(); i < comm.lsaSize - 1; i += coop.size()) {
      int peer = i + (comm.lsaRank <= i ? 1 : 0);
      cuco_wait_until(inbox(comm.lsaRank, peer), epoch + 1, o, cuco_wait_site_t{CUCO_WAIT_LSA_BARRIER, peer, index});
    }
    epoch += 1;
    coop.sync();
  }

  CUCO_DEVICE_INLINE void sync(Coop c, cuda::memory_order order) {
    arrive(c, order);
    wait(c, order);
  }

 private:
  CUCO_DEVICE_INLINE uint64_t* state() const {
    return comm.flagPeers[comm.lsaRank] + comm.barrierBase + index;
  }
  /* owner's word announcing how far `from` got on this barrier */
  CUCO_DEVICE_INLINE uint64_t* inbox(int owner, int from) const {
    return comm.flagPeers[owner] + comm.barrierBase + comm.lsaBarrierCount + (size_t)index * comm.lsaSize + from;
  }
};
#endif /* __CUDACC__ */

/* Flag words the compat barriers of one devComm occupy per rank. */
static inline size_t cuco_compat_barrier_words(int lsaBarrierCount, int world) {
  return (size_t)lsaBarrierCount * (size_t)(1 + world);
}

#endif /* CUCO_LSA_COMPAT_H_ */
