/*
 * gin_compat.h — the subset of NCCL's GIN device API (2.28) that candidates use, for the `symm` backend.
 *
 * Included by cuco_lsa.h after lsa_compat.h when built with -DCUCO_BUILD_SYMM=1, INSTEAD of NCCL's
 * nccl_device/gin.h. GIN is NCCL's network path: one-sided puts to a peer's window, completed by a signal at the
 * peer (remote completion) and a counter at the issuer (local completion). Under symm there is no network: the
 * ranks are processes sharing one GPU, and a put is a copy through the harness's peer tables. What this header
 * checks is that a GIN candidate is CORRECT -- it waits for the signals it needs, waits for the right values and
 * does not reuse a put's source before the put completed locally -- never how fast it would be over a NIC.
 *
 * Same names and signatures as nccl_device/gin.h, so a candidate written for real GIN compiles unchanged here:
 *
 *   ncclGinSignal_t, ncclGinCounter_t                     ids relative to the devComm's own (start at 0)
 *   ncclGin_None, ncclGin_SignalInc{signal}, ncclGin_SignalAdd{signal, value}     remote actions of a put
 *   ncclGin_CounterInc{counter}                           local action of a put
 *   ncclGinDescriptorSmem, ncclGin_DescriptorSmem{ptr}    accepted and ignored (no descriptors to stage)
 *   ncclGin gin(devComm, contextIndex)                    (ncclGin_BackendMask<mask>; contexts modulo the count)
 *     gin.put(team, peer, dstWnd, dstOffset, srcWnd, srcOffset, bytes, remoteAction, localAction, coop, ...)
 *     gin.putValue(team, peer, dstWnd, dstOffset, value, remoteAction, coop, ...)
 *     gin.signal(team, peer, remoteAction, coop, ...)
 *     gin.flush(coop, order)
 *     gin.readSignal(signal, bits, order) / waitSignal(coop, signal, least, bits, order)
 *     gin.getSignalShadowPtr(signal) / increaseSignalShadow(signal, delta) / waitSignalMeetShadow(coop, ...)
 *     gin.readCounter(counter, bits, order) / waitCounter(coop, counter, least, bits, order)
 *     gin.resetSignal(signal) / resetCounter(counter)
 *   ncclTeamRankToWorld(devComm, team, rank)
 *
 * Not provided (a candidate using them fails to build under symm, which is the honest outcome): the
 * ncclSymPtr<T> overloads of put/putValue, waitSignalFollowShadow, GIN barriers (ncclGinBarrierSession, the
 * hybrid ncclBarrierSession), rail teams, and ncclGinSignalSet (NCCL 2.28 defers it too).
 *
 * Where things live. A devComm made by cuco_devcomm_create_gin (cuco_devcomm.h) takes words of the flag region's
 * runtime part after its LSA barriers, per rank and context c (C contexts, S signals, N counters):
 *     base + c*S + s                signal s of context c: peers ADD to it (system-scope atomics)
 *     base + C*S + c*N + n          counter n of context c: the issuer's own, +1 per put it completed locally
 *     base + C*S + C*N + c*S + s    the shadow of signal s (NCCL keeps one per signal for the user)
 * Like NCCL's, signals and counters only grow (the harness zeroes the region once per loaded candidate), so a
 * candidate waits for a running total: epoch-based (`epoch * puts per step`) or a total it keeps itself.
 * Signals are per context, as in NCCL: a signal raised through context 1 is not seen by a wait on context 0.
 * Values are compared as plain `>=`: 64-bit totals never wrap in a run (NCCL's rolling compare agrees there).
 *
 * Ordering, as NCCL promises it: a put's remote signal is visible only after its payload, and after the payloads
 * of this thread's earlier puts through the same context; its counter increments once its source was read. Every
 * wait here (waitSignal, waitCounter) is bounded by the harness like every runtime wait (cuco_waits.h): one that
 * is never satisfied ends in a verdict naming the GIN signal or counter, not in a killed rank.
 *
 * Stress build (-DCUCO_STRESS=1, pauses on; cuco_stress.h). A put here is normally done before it returns, which
 * would hide two bugs a NIC exposes. So, at random (the harness's seed, rate and longest pause):
 *   - the put pauses BEFORE its data and AFTER its signal, so a peer that reads without waiting for the signal
 *     (or waits for too small a value) sees old data;
 *   - the put is DEFERRED: the issuing thread records it and moves on; the copy, the signal and the counter happen
 *     later, at that thread's next flush, wait or read of a signal/counter, signal(), putValue(), when its queue of
 *     kDeferred puts is full, or when its ncclGin object is destroyed. A candidate that rewrites a put's source
 *     before flush() / the counter says it was consumed then ships the rewritten bytes, as a NIC reading late would.
 * A deferred put is copied by its issuing thread alone (the coop has moved on), so it is slow; the timed run of
 * the same stress build has the pauses off, and then every put runs at once with the whole coop.
 * Deferred puts belong to the ncclGin object that issued them; copying the object moves them to the copy (the
 * members are mutable for that), so each put still runs exactly once.
 */
#ifndef CUCO_GIN_COMPAT_H_
#define CUCO_GIN_COMPAT_H_

#include <stdint.h>
#include "lsa_compat.h"  /* ncclDevComm, ncclTeam, ncclWindow_t, the ncclCoop* types */
#include "cuco_stress.h" /* the pauses (empty without -DCUCO_STRESS=1) */
#include "cuco_waits.h"  /* bounded waits */

typedef uint32_t ncclGinSignal_t;
typedef uint32_t ncclGinCounter_t;

/* Flag words a GIN devComm occupies per rank: signals and shadows per context, counters per context. */
static inline size_t cuco_compat_gin_words(int contexts, int signals, int counters) {
  return (size_t)contexts * (2 * (size_t)signals + (size_t)counters);
}

CUCO_HOST_DEVICE_INLINE int ncclTeamRankToWorld(ncclDevComm const& comm, ncclTeam team, int rank) {
  return comm.rank + (rank - team.rank) * team.stride;
}

#ifdef __CUDACC__

/* ---- completion actions (what a put does at the peer / locally when it completes) ------------------------ */

struct ncclGin_None {};
struct ncclGin_SignalAdd {
  ncclGinSignal_t signal;
  uint64_t value;
};
/* NCCL: equivalent to SignalAdd{+1}, and not to be mixed with other operators on one signal between resets. */
struct ncclGin_SignalInc {
  ncclGinSignal_t signal;
};
struct ncclGin_CounterInc {
  ncclGinCounter_t counter;
};

/* NCCL stages a work descriptor in shared memory when given one; nothing is staged here. */
struct ncclGinDescriptorSmem {
  alignas(16) char space[64];
};
struct ncclGin_DescriptorSmem {
  ncclGinDescriptorSmem* descriptor;
};

namespace cuco_gin {
/* A remote action as (signal id, amount); no signal: id -1. */
struct Remote {
  int signal;
  uint64_t add;
};
CUCO_DEVICE_INLINE Remote remote_of(ncclGin_None) { return Remote{-1, 0}; }
CUCO_DEVICE_INLINE Remote remote_of(ncclGin_SignalInc a) { return Remote{(int)a.signal, 1}; }
CUCO_DEVICE_INLINE Remote remote_of(ncclGin_SignalAdd a) { return Remote{(int)a.signal, a.value}; }
CUCO_DEVICE_INLINE int counter_of(ncclGin_None) { return -1; }
CUCO_DEVICE_INLINE int counter_of(ncclGin_CounterInc a) { return (int)a.counter; }

#if defined(CUCO_STRESS) && CUCO_STRESS
constexpr int kDeferred = 16; /* puts one thread may hold back before it must run them (more than a staging
                                * ring's slots, so a ring rewritten without a flush is caught) */
#endif

/* Whether any thread of the coop says yes; also a barrier of the coop (the coop types lsa_compat.h has). */
template <int N>
CUCO_DEVICE_INLINE bool coop_any(ncclCoopTile<N> c, bool p) {
  return N == 1 ? p : __any_sync(c.laneMask(), p) != 0;
}
CUCO_DEVICE_INLINE bool coop_any(ncclCoopCta, bool p) { return __syncthreads_or(p) != 0; }

/* One put as the thread that runs it sees it: pointers already resolved in this process. */
struct Op {
  const void* src;
  void* dst;
  size_t bytes;
  uint64_t* signal; /* the peer's signal word, or null */
  uint64_t add;
  uint64_t* counter; /* this rank's counter word, or null */
};

/* Copy by the calling thread's share of a group of `n` threads: 16-byte vectors when both ends allow it. */
CUCO_DEVICE_INLINE void copy(void* dst, const void* src, size_t bytes, int rank, int n) {
  if ((((uintptr_t)dst | (uintptr_t)src | bytes) & 15u) == 0) {
    uint4* d = (uint4*)dst;
    const uint4* s = (const uint4*)src;
    for (size_t i = rank; i < bytes / 16; i += n) d[i] = s[i];
  } else {
    char* d = (char*)dst;
    const char* s = (const char*)src;
    for (size_t i = rank; i < bytes; i += n) d[i] = s[i];
  }
}

/* The completion of a put whose payload is stored: publish it with the signal, then count the source as read.
 * The system-scope fence is cumulative, so after the coop's barrier it also releases the other threads' stores. */
CUCO_DEVICE_INLINE void complete(const Op& op) {
  __threadfence_system();
  if (op.signal != nullptr) {
    cuda::atomic_ref<uint64_t, cuda::thread_scope_system>(*op.signal).fetch_add(op.add, cuda::memory_order_release);
    cuco_stress_after_signal(op.signal, op.add);
  }
  if (op.counter != nullptr)
    cuda::atomic_ref<uint64_t, cuda::thread_scope_system>(*op.counter).fetch_add(1, cuda::memory_order_release);
}

#if defined(CUCO_STRESS) && CUCO_STRESS
/* Whether this put is held back: only with the pauses on (the timed run of the stress build has them off). */
CUCO_DEVICE_INLINE bool defer(const void* dst, uint64_t n) {
  if (cuco_stress_max_ns_ == 0) return false;
  const uint64_t r = cuco_stress::mix(cuco_stress_seed_ ^ cuco_stress::mix((uint64_t)(uintptr_t)dst ^ (7ull << 56)) ^
                                      cuco_stress::mix(n * 1024 + threadIdx.x + (cuco_stress::unit_id() << 32)));
  return (uint32_t)(r % 1000u) < cuco_stress_permille_;
}
#endif
}  // namespace cuco_gin

/* ---- the GIN context ------------------------------------------------------------------------------------------ */

template <unsigned backendMask>
struct ncclGin_BackendMask {
  ncclDevComm const& comm;
  uint32_t nContexts : 8, contextId : 8, _ginBackend : 8;

  /* Contexts are taken modulo the devComm's count, as NCCL does. */
  CUCO_DEVICE_INLINE ncclGin_BackendMask(ncclDevComm const& dc, int contextIndex) : comm(dc) {
    if (dc.ginContextCount < 1) __trap(); /* the devComm was made without GIN: use cuco_devcomm_create_gin */
    nContexts = (uint32_t)dc.ginContextCount;
    contextId = (uint32_t)contextIndex % (uint32_t)dc.ginContextCount;
    _ginBackend = 0;
  }

#if defined(CUCO_STRESS) && CUCO_STRESS
  /* A copy takes the deferred puts with it (see the header): they run once, wherever the last holder is. */
  CUCO_DEVICE_INLINE ncclGin_BackendMask(ncclGin_BackendMask const& o)
      : comm(o.comm), nContexts(o.nContexts), contextId(o.contextId), _ginBackend(o._ginBackend), nHeld_(o.nHeld_),
        issued_(o.issued_) {
    for (int i = 0; i < nHeld_; ++i) held_[i] = o.held_[i];
    o.nHeld_ = 0;
  }
  CUCO_DEVICE_INLINE ~ncclGin_BackendMask() { progress(); }
#endif

  /* One-sided put of `bytes` from this rank's srcWnd at srcOffset to peer's dstWnd at dstOffset, by the whole
   * coop. RemoteAction raises a signal at the peer once the payload (and this thread's earlier puts' payloads)
   * landed; LocalAction counts the source as read. The last three arguments are NCCL's release hints: every
   * put here releases at system scope anyway. */
  template <typename RemoteAction = ncclGin_None, typename LocalAction = ncclGin_None,
            typename Coop = ncclCoopThread, typename DescriptorSmem = ncclGin_None>
  CUCO_DEVICE_INLINE void put(ncclTeam team, int peer, ncclWindow_t dstWnd, size_t dstOffset, ncclWindow_t srcWnd,
                              size_t srcOffset, size_t bytes, RemoteAction remoteAction = ncclGin_None{},
                              LocalAction localAction = ncclGin_None{}, Coop coop = ncclCoopThread{},
                              DescriptorSmem descriptor = ncclGin_None{},
                              cuda::thread_scope alreadyReleased = cuda::thread_scope_thread,
                              cuda::thread_scope expected_scope = cuda::thread_scope_device) const {
    (void)descriptor;
    (void)alreadyReleased;
    (void)expected_scope;
    const int world = ncclTeamRankToWorld(comm, team, peer);
    cuco_gin::Op op;
    op.src = (const char*)((void* const*)srcWnd)[comm.rank] + srcOffset;
    op.dst = (char*)((void* const*)dstWnd)[world] + dstOffset;
    op.bytes = bytes;
    const cuco_gin::Remote r = cuco_gin::remote_of(remoteAction);
    op.signal = r.signal >= 0 ? signalWord(world, (ncclGinSignal_t)r.signal) : nullptr;
    op.add = r.add;
    const int c = cuco_gin::counter_of(localAction);
    op.counter = c >= 0 ? counterWord((ncclGinCounter_t)c) : nullptr;
    issue(op, coop);
  }

  /* Put one value of at most 8 bytes (NCCL takes it from the caller, not from a window). */
  template <typename T, typename RemoteAction = ncclGin_None, typename Coop = ncclCoopThread,
            typename DescriptorSmem = ncclGin_None>
  CUCO_DEVICE_INLINE void putValue(ncclTeam team, int peer, ncclWindow_t dstWnd, size_t dstOffset, T value,
                                   RemoteAction remoteAction = ncclGin_None{}, Coop coop = ncclCoopThread{},
                                   DescriptorSmem descriptor = ncclGin_None{},
                                   cuda::thread_scope alreadyReleased = cuda::thread_scope_thread,
                                   cuda::thread_scope expected_scope = cuda::thread_scope_device) const {
    static_assert(sizeof(T) <= 8, "Required: sizeof(T) <= 8");
    (void)descriptor;
    (void)alreadyReleased;
    (void)expected_scope;
    coop.sync();
    if (coop.thread_rank() == 0) {
      progress(); /* the value goes out after this thread's earlier puts */
      const int world = ncclTeamRankToWorld(comm, team, peer);
      *(T*)((char*)((void* const*)dstWnd)[world] + dstOffset) = value;
      const cuco_gin::Remote r = cuco_gin::remote_of(remoteAction);
      cuco_gin::Op op{nullptr, nullptr, 0, r.signal >= 0 ? signalWord(world, (ncclGinSignal_t)r.signal) : nullptr,
                      r.add, nullptr};
      cuco_gin::complete(op);
    }
    coop.sync();
  }

  /* A signal with no payload; visible after the payloads of this thread's earlier puts through this context. */
  template <typename RemoteAction, typename Coop = ncclCoopThread, typename DescriptorSmem = ncclGin_None>
  CUCO_DEVICE_INLINE void signal(ncclTeam team, int peer, RemoteAction remoteAction, Coop coop = ncclCoopThread(),
                                 DescriptorSmem descriptor = ncclGin_None{},
                                 cuda::thread_scope alreadyReleased = cuda::thread_scope_thread,
                                 cuda::thread_scope expected_scope = cuda::thread_scope_device) const {
    (void)descriptor;
    (void)alreadyReleased;
    (void)expected_scope;
    coop.sync();
    if (coop.thread_rank() == 0) {
      progress();
      const cuco_gin::Remote r = cuco_gin::remote_of(remoteAction);
      const int world = ncclTeamRankToWorld(comm, team, peer);
      cuco_gin::Op op{nullptr, nullptr, 0, r.signal >= 0 ? signalWord(world, (ncclGinSignal_t)r.signal) : nullptr,
                      r.add, nullptr};
      cuco_gin::complete(op);
    }
    coop.sync();
  }

  /* Every put issued by a thread of this coop has read its source: the sources may be reused. Like NCCL's, it
   * says nothing about the data having landed at the peer (that is what the peer's signal is for). */
  template <typename Coop>
  CUCO_DEVICE_INLINE void flush(Coop coop, cuda::memory_order ord = cuda::memory_order_acquire) const {
    (void)ord;
    coop.sync();
    progress();
    coop.sync();
  }

  /* ---- signals (this rank's, raised by peers) ---- */

  CUCO_DEVICE_INLINE uint64_t readSignal(ncclGinSignal_t signal, int bits = 64,
                                         cuda::memory_order ord = cuda::memory_order_acquire) const {
    progress();
    const uint64_t mask = uint64_t(-1) >> (64 - bits);
    return mask & cuda::atomic_ref<uint64_t, cuda::thread_scope_system>(*signalWord(comm.rank, signal)).load(ord);
  }

  /* Until the signal reaches `least` (its payloads then visible to the whole coop). The waiting thread first runs
   * its own deferred puts, so two ranks waiting on each other's signals never hold each other's data back. */
  template <typename Coop>
  CUCO_DEVICE_INLINE void waitSignal(Coop coop, ncclGinSignal_t signal, uint64_t least, int bits = 64,
                                     cuda::memory_order ord = cuda::memory_order_acquire) const {
    (void)bits;
    coop.sync();
    progress();
    if (coop.thread_rank() == 0) {
      uint64_t* w = signalWord(comm.rank, signal);
      cuco_wait_until(w, least, ord, cuco_wait_site_t{CUCO_WAIT_GIN_SIGNAL, -1, (int32_t)signal});
      cuco_stress_before_wait_returns(w, least);
    }
    coop.sync();
  }

  CUCO_DEVICE_INLINE uint64_t* getSignalShadowPtr(ncclGinSignal_t signal) const { return shadowWord(signal); }

  CUCO_DEVICE_INLINE void increaseSignalShadow(ncclGinSignal_t signal, uint64_t delta) const {
    cuda::atomic_ref<uint64_t, cuda::thread_scope_device>(*shadowWord(signal))
        .fetch_add(delta, cuda::memory_order_relaxed);
  }

  template <typename Coop>
  CUCO_DEVICE_INLINE void waitSignalMeetShadow(Coop coop, ncclGinSignal_t signal, int bits = 64,
                                               cuda::memory_order ord = cuda::memory_order_acquire) const {
    coop.sync();
    const uint64_t least = *shadowWord(signal);
    waitSignal(coop, signal, least, bits, ord);
  }

  /* ---- counters (this rank's, raised by its own puts' local completion) ---- */

  CUCO_DEVICE_INLINE uint64_t readCounter(ncclGinCounter_t counter, int bits = 56,
                                          cuda::memory_order ord = cuda::memory_order_acquire) const {
    progress();
    const uint64_t mask = uint64_t(-1) >> (64 - bits);
    return mask & cuda::atomic_ref<uint64_t, cuda::thread_scope_system>(*counterWord(counter)).load(ord);
  }

  template <typename Coop>
  CUCO_DEVICE_INLINE void waitCounter(Coop coop, ncclGinCounter_t counter, uint64_t least, int bits = 56,
                                      cuda::memory_order ord = cuda::memory_order_acquire) const {
    (void)bits;
    coop.sync();
    progress();
    if (coop.thread_rank() == 0)
      cuco_wait_until(counterWord(counter), least, ord, cuco_wait_site_t{CUCO_WAIT_GIN_COUNTER, -1, (int32_t)counter});
    coop.sync();
  }

  /* Zero a counter / a signal and its shadow. NCCL: must not race with puts that modify them. */
  CUCO_DEVICE_INLINE void resetCounter(ncclGinCounter_t counter) const {
    progress();
    cuda::atomic_ref<uint64_t, cuda::thread_scope_system>(*counterWord(counter)).store(0, cuda::memory_order_relaxed);
  }
  CUCO_DEVICE_INLINE void resetSignal(ncclGinSignal_t signal) const {
    progress();
    cuda::atomic_ref<uint64_t, cuda::thread_scope_system>(*signalWord(comm.rank, signal))
        .store(0, cuda::memory_order_relaxed);
    *shadowWord(signal) = 0;
  }

 private:
  /* Words of this devComm in rank r's flag region (see the header for the layout). */
  CUCO_DEVICE_INLINE uint64_t* signalWord(int r, ncclGinSignal_t s) const {
    if ((int)s >= comm.ginSignalCount) __trap(); /* a signal the devComm was not made with */
    return comm.flagPeers[r] + comm.ginBase + (size_t)contextId * comm.ginSignalCount + s;
  }
  CUCO_DEVICE_INLINE uint64_t* counterWord(ncclGinCounter_t n) const {
    if ((int)n >= comm.ginCounterCount) __trap(); /* a counter the devComm was not made with */
    return comm.flagPeers[comm.rank] + comm.ginBase + (size_t)comm.ginContextCount * comm.ginSignalCount +
           (size_t)contextId * comm.ginCounterCount + n;
  }
  CUCO_DEVICE_INLINE uint64_t* shadowWord(ncclGinSignal_t s) const {
    if ((int)s >= comm.ginSignalCount) __trap();
    return comm.flagPeers[comm.rank] + comm.ginBase +
           (size_t)comm.ginContextCount * (comm.ginSignalCount + comm.ginCounterCount) +
           (size_t)contextId * comm.ginSignalCount + s;
  }

  /* Run one put now with the whole coop: [pause] payload, barrier, signal [pause], counter. */
  template <typename Coop>
  CUCO_DEVICE_INLINE void run(const cuco_gin::Op& op, Coop coop) const {
    if (coop.thread_rank() == 0) cuco_stress_before_data(op.dst, op.bytes); /* a reader that skipped the wait
                                                                               * sees the old bytes */
    coop.sync();
    cuco_gin::copy(op.dst, op.src, op.bytes, coop.thread_rank(), coop.size());
    coop.sync();
    if (coop.thread_rank() == 0) cuco_gin::complete(op);
    coop.sync();
  }

#if defined(CUCO_STRESS) && CUCO_STRESS
  mutable cuco_gin::Op held_[cuco_gin::kDeferred];
  mutable int nHeld_ = 0;
  mutable uint64_t issued_ = 0;

  template <typename Coop>
  CUCO_DEVICE_INLINE void issue(const cuco_gin::Op& op, Coop coop) const {
    /* Held back when this thread already holds puts (they keep their order), or at random. Only the coop's first
     * thread ever holds puts; the rest of the coop learns its decision through the coop's own vote. */
    bool hold = false;
    if (coop.thread_rank() == 0) {
      hold = nHeld_ > 0 || cuco_gin::defer(op.dst, ++issued_);
      if (hold) {
        if (nHeld_ == cuco_gin::kDeferred) progress();
        held_[nHeld_++] = op;
      }
    }
    if (!cuco_gin::coop_any(coop, hold)) run(op, coop);
  }

  /* Run this thread's held puts, oldest first: [pause] payload, signal [pause], counter, each by this thread. */
  CUCO_DEVICE_INLINE void progress() const {
    for (int i = 0; i < nHeld_; ++i) {
      const cuco_gin::Op& op = held_[i];
      cuco_stress_before_data(op.dst, op.bytes);
      cuco_gin::copy(op.dst, op.src, op.bytes, 0, 1);
      cuco_gin::complete(op);
    }
    nHeld_ = 0;
  }
#else
  template <typename Coop>
  CUCO_DEVICE_INLINE void issue(const cuco_gin::Op& op, Coop coop) const {
    coop.sync();
    run(op, coop);
  }
  CUCO_DEVICE_INLINE void progress() const {}
#endif
};

/* NCCL's default: every backend this build can reach (proxy and GDAKI there; one copy engine here). */
using ncclGin = ncclGin_BackendMask<3u>;

#endif /* __CUDACC__ */

#endif /* CUCO_GIN_COMPAT_H_ */
