// SPDX-License-Identifier: Apache-2.0
/*
 * cuco_stress.h — race amplification for verification: the stress build of the signalling primitives.
 *
 * Built with -DCUCO_STRESS=1 (the harness builds a candidate a second time this way for its L2 trials at two
 * ranks and more), the runtime's epoch flags and the LSA barrier pause for a random time
 *   - right after a signal (cuco_signal, a barrier's arrive): what the signalling thread does next, typically
 *     stores the flag was meant to cover, lands late, so a flag raised before its stores shows;
 *   - right before a wait returns (cuco_wait, a barrier's wait): the waiting unit starts late, so work that
 *     some other unit assumed it had covered (a missing wait, a barrier member left out) shows;
 *   - right before a GIN put moves its payload (gin_compat.h, which also holds puts back at random): data lands
 *     late, so a missing signal wait or a source reused before its flush shows.
 * Delays are seeded per (trial, rank) by the harness through cuco_stress_configure, and differ per call site,
 * block, thread and epoch, so each verification trial explores another interleaving. Without CUCO_STRESS the
 * hooks are empty inline functions and the barrier is the plain one. The harness times the SAME stress build after
 * its L2 trials, with the pauses off (cuco_stress_configure(0, 0, 0)): a disabled hook is one load and a branch.
 *
 * The barrier wrapper wraps the real NCCL session under the nccl backend and the compat one under symm: after
 * this header, `ncclLsaBarrierSession` names the wrapper, which forwards every constructor and call and adds
 * the pauses. Raw atomics a candidate writes itself are not seen here: only the runtime's primitives pause.
 *
 * Included by cuco_devcomm.h, after the NCCL device API (real or compat), before the epoch flag helpers, and by
 * host_nccl_compat.h (host NCCL under symm), whose flag waits pause through the same hooks.
 */
#ifndef CUCO_STRESS_H_
#define CUCO_STRESS_H_

#include <stdint.h>
#include <cuda_runtime_api.h>
#include "cuco_waits.h" /* the clock the waits use */

#if defined(CUCO_STRESS) && CUCO_STRESS

#ifdef __CUDACC__
/* One copy per candidate module (this header sits in the candidate's one translation unit). */
static __device__ uint64_t cuco_stress_seed_ = 0;
static __device__ uint32_t cuco_stress_max_ns_ = 0;     /* 0: no pauses */
static __device__ uint32_t cuco_stress_permille_ = 0;   /* chance of a pause per call, in 1/1000 */

namespace cuco_stress {
__device__ __forceinline__ uint64_t mix(uint64_t z) {  /* splitmix64's finaliser */
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Pause for a pseudo-random time drawn from (seed, site, a, b); a and b tell call sites apart. */
__device__ __forceinline__ void pause(uint32_t site, uint64_t a, uint64_t b) {
  const uint32_t max_ns = cuco_stress_max_ns_;
  if (max_ns == 0) return;
  const uint64_t r = mix(cuco_stress_seed_ ^ mix(a ^ ((uint64_t)site << 56)) ^ mix(b + 0x632be59bd9b4e019ull));
  if ((uint32_t)(r % 1000u) >= cuco_stress_permille_) return;
  const uint64_t ns = (r >> 20) % max_ns;
  const uint64_t start = cuco_waits::now_ns();
  while (cuco_waits::now_ns() - start < ns) __nanosleep(256);
}

__device__ __forceinline__ uint64_t unit_id() {
  return ((uint64_t)blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
}
}  // namespace cuco_stress

__device__ __forceinline__ void cuco_stress_after_signal(const void* flag, uint64_t epoch) {
  cuco_stress::pause(1, (uint64_t)(uintptr_t)flag ^ (cuco_stress::unit_id() << 20), epoch * 1024 + threadIdx.x);
}

__device__ __forceinline__ void cuco_stress_before_wait_returns(const void* flag, uint64_t epoch) {
  cuco_stress::pause(2, (uint64_t)(uintptr_t)flag ^ (cuco_stress::unit_id() << 20), epoch * 1024 + threadIdx.x);
}

/* Before a one-sided put moves its payload (gin_compat.h): the bytes land late, so a reader that did not wait
 * for the put's signal sees the old ones. */
__device__ __forceinline__ void cuco_stress_before_data(const void* dst, uint64_t bytes) {
  cuco_stress::pause(5, (uint64_t)(uintptr_t)dst ^ (cuco_stress::unit_id() << 20), bytes * 1024 + threadIdx.x);
}

#endif /* __CUDACC__ */

/* Host: set this trial's seed, the longest pause (ns, 0 = none) and the chance of a pause per call (1/1000).
 * Found by the harness with dlsym; only the stress build exports it. Returns a cudaError_t value. */
extern "C" __attribute__((visibility("default"))) int cuco_stress_configure(uint64_t seed, uint32_t max_ns,
                                                                           uint32_t permille) {
#ifdef __CUDACC__
  cudaError_t e = cudaMemcpyToSymbol(cuco_stress_seed_, &seed, sizeof(seed));
  if (e == cudaSuccess) e = cudaMemcpyToSymbol(cuco_stress_max_ns_, &max_ns, sizeof(max_ns));
  if (e == cudaSuccess) e = cudaMemcpyToSymbol(cuco_stress_permille_, &permille, sizeof(permille));
  return (int)e;
#else
  (void)seed;
  (void)max_ns;
  (void)permille;
  return 0;
#endif
}

#else /* not the stress build: the hooks vanish */

#ifdef __CUDACC__
__device__ __forceinline__ void cuco_stress_after_signal(const void*, uint64_t) {}
__device__ __forceinline__ void cuco_stress_before_wait_returns(const void*, uint64_t) {}
__device__ __forceinline__ void cuco_stress_before_data(const void*, uint64_t) {}
#endif

#endif /* CUCO_STRESS */

#endif /* CUCO_STRESS_H_ */

/* The LSA barrier with pauses needs the NCCL device API (real or compat): cuco_devcomm.h, included after that API,
 * asks for it with CUCO_STRESS_LSA_BARRIER. Host NCCL under symm (symm_nccl/nccl.h) includes this header for the
 * hooks alone, perhaps before cuco_lsa.h: hence a guard of its own. */
#if defined(CUCO_STRESS_LSA_BARRIER) && !defined(CUCO_STRESS_LSA_BARRIER_H_)
#define CUCO_STRESS_LSA_BARRIER_H_
#if defined(CUCO_STRESS) && CUCO_STRESS && defined(__CUDACC__)
/* The LSA barrier with pauses: after arrive (the whole coop pauses alike, so the unit's next stores are late)
 * and before wait returns. Forwards every constructor and call to the session it wraps. */
template <typename Coop>
struct cuco_stress_lsa_barrier {
  ncclLsaBarrierSession<Coop> inner;
  uint32_t index;
  uint64_t calls;

  /* Arguments by value (the devComm by reference, as the session keeps it): a forwarding reference to
   * cuda::memory_order_* would odr-use a host constant in device code. */
  template <typename... Args>
  __device__ __forceinline__ cuco_stress_lsa_barrier(Coop c, ncclDevComm const& dc, Args... args)
      : inner(c, dc, args...), index(index_of(args...)), calls(0) {}

  cuco_stress_lsa_barrier(cuco_stress_lsa_barrier const&) = delete;

  template <typename... Args>
  __device__ __forceinline__ void arrive(Args... args) {
    inner.arrive(args...);
    cuco_stress::pause(3, cuco_stress::unit_id() * 65536 + index, ++calls);
  }

  template <typename... Args>
  __device__ __forceinline__ void wait(Args... args) {
    inner.wait(args...);
    cuco_stress::pause(4, cuco_stress::unit_id() * 65536 + index, ++calls);
  }

  template <typename... Args>
  __device__ __forceinline__ void sync(Args... args) {
    arrive(args...);
    wait(args...);
  }

 private:
  /* The barrier index when the constructor reads (tag, index, ...); 0 for the other forms. */
  template <typename Tag, typename... Rest>
  __device__ __forceinline__ static uint32_t index_of(Tag, uint32_t i, Rest...) {
    return i;
  }
  template <typename... Rest>
  __device__ __forceinline__ static uint32_t index_of(Rest...) {
    return 0;
  }
};

#define ncclLsaBarrierSession cuco_stress_lsa_barrier
#endif /* CUCO_STRESS && __CUDACC__ */
#endif /* CUCO_STRESS_LSA_BARRIER */
