// SPDX-License-Identifier: Apache-2.0
/*
 * cuco_waits.h — the bound on every wait of the runtime, and the record of the wait that gave up.
 *
 * Device:
 *   bool cuco_wait_until(const uint64_t* word, uint64_t target,          // spin until *word >= target; false:
 *                        cuda::memory_order order = acquire,              // it gave up (the harness's limit or
 *                        cuco_wait_site_t site = {CUCO_WAIT_FLAG, -1, -1},  // abort word), what it waited on is
 *                        uint32_t nap_ns = 0);                            // recorded, and the caller goes on
 * Host (exported; the harness finds it with dlsym, as it finds cuco_stress_configure):
 *   int cuco_waits_bind(cuco_wait_ctl_t* ctl);   // once per load, before cuco_setup; CUCO_OK or CUCO_ERR_*
 *
 * Every wait of the runtime spins here: cuco_wait (cuco_devcomm.h), the LSA barrier's wait under symm
 * (lsa_compat.h), GIN's signal and counter waits under symm (gin_compat.h) and host NCCL under symm
 * (host_nccl_compat.h). A wait nobody satisfies used to spin until the
 * harness's watchdog killed the rank processes and the warm world was started again, and all the verdict said was
 * "the step hangs". Bound, a wait that spun for ctl->limit_ns (the harness's step limit) or that sees ctl->abort
 * raised (the harness raises it when its watchdog fires) gives up instead: the first wait to give up records
 * what it waited on in *ctl, every later wait of the module gives up at its next look, and each returns false, so
 * the kernel runs to its end and the CUDA context stays healthy. The harness then fails the candidate with a
 * verdict naming the word ("user flag (peer 0, slot 3) epoch 12") and keeps its world. What the kernel computes
 * after a wait gave up is garbage, and the candidate has already failed.
 *
 * Not bounded: a spin a candidate writes itself (the harness's watchdog still ends it, and the world is started
 * again), and the real NCCL device API's own waits under the nccl backend (NCCL 2.28's LSA barrier has neither a
 * limit nor an abort word it polls). Unbound (no harness, e.g. a benchmark) a wait never gives up.
 *
 * Cost: a wait whose word is already up is the one acquire load it always was. A spinning wait looks at this
 * module's "gave up" word and the clock every kSpinsPerLook spins, and at the harness's words (host-mapped) every
 * kLookNs; nothing else. Like NCCL's bounded barrier waits, which compare a clock with a timeout and poll the
 * communicator's abort flag inside the spin.
 *
 * A small header of its own so that code which is not a candidate (a workload's shared kernel header, built
 * by a benchmark without the rest of the runtime) waits the same way.
 */
#ifndef CUCO_WAITS_H_
#define CUCO_WAITS_H_

#include <stdint.h>
#include <cuda_runtime_api.h>
#include "cuco_abi.h"
#ifdef __CUDACC__
#include <cuda/atomic>
#endif

/* The control block's layout; a change bumps it (the harness's ctypes mirror: evaluate/rank/abi.py). */
#define CUCO_WAITS_VERSION 1

/* What a wait waited on, as the record says. */
typedef enum cuco_wait_kind {
  CUCO_WAIT_FLAG = 1,        /* cuco_wait: an epoch flag (the harness names it from its address) */
  CUCO_WAIT_LSA_BARRIER = 2, /* an LSA barrier's wait (symm): `peer` never arrived at barrier `index` */
  CUCO_WAIT_HOST_NCCL = 3,   /* host NCCL under symm: a collective barrier, a chunk or its acknowledgement */
  CUCO_WAIT_GIN_SIGNAL = 4,  /* a GIN waitSignal (symm): signal `index` never reached the count */
  CUCO_WAIT_GIN_COUNTER = 5  /* a GIN waitCounter (symm): counter `index` never reached the count */
} cuco_wait_kind_t;

/* Why it gave up. */
typedef enum cuco_wait_end {
  CUCO_WAIT_LIMIT = 1, /* it spun for ctl->limit_ns */
  CUCO_WAIT_ABORT = 2  /* the harness raised ctl->abort */
} cuco_wait_end_t;

/*
 * Harness-owned, in host-mapped memory (the device reads the harness's words and writes the record through the
 * same pointer; the harness reads the record after the step). Zeroed by the harness before every bind.
 */
typedef struct cuco_wait_ctl {
  uint32_t version;     /* harness: CUCO_WAITS_VERSION */
  uint32_t struct_size; /* harness: sizeof(cuco_wait_ctl_t) */
  uint64_t limit_ns;    /* harness: longest a wait spins (0: no limit, the abort word still ends it) */
  uint32_t abort;       /* harness: non-zero = every wait gives up at its next look */
  uint32_t gave_up;     /* runtime: 1 once a wait gave up; the fields below are then its record */
  uint32_t kind;        /* cuco_wait_kind_t */
  uint32_t ended_by;    /* cuco_wait_end_t */
  uint64_t word;        /* the address it polled, as the kernel saw it */
  uint64_t target;      /* it waited for *word >= target (an epoch, a barrier epoch or a count) */
  uint64_t seen;        /* what the word held when it gave up */
  uint64_t waited_ns;   /* how long it spun */
  int32_t peer;         /* CUCO_WAIT_LSA_BARRIER: the peer that never arrived; -1 otherwise */
  int32_t index;        /* CUCO_WAIT_LSA_BARRIER: the barrier's index; CUCO_WAIT_GIN_*: the signal or counter id;
                         * -1 otherwise */
  uint32_t block[3];    /* blockIdx of the waiting thread */
  uint32_t thread;      /* its thread index within the block (x + y * blockDim.x + z * blockDim.x * blockDim.y) */
} cuco_wait_ctl_t;

#ifdef __CUDACC__

/* Where a wait is, for the record. */
struct cuco_wait_site_t {
  uint32_t kind; /* cuco_wait_kind_t */
  int32_t peer;
  int32_t index;
};

namespace cuco_waits {
constexpr uint32_t kSpinsPerLook = 64;  /* spins between looks at the "gave up" word and the clock */
constexpr uint64_t kLookNs = 100000;    /* between looks at the harness's words (host memory: ~1 us a read) */

/* One copy per candidate module (this header sits in the candidate's one translation unit); a module is loaded
 * fresh for every candidate, so "gave up" never outlives one. */
static __device__ cuco_wait_ctl_t* ctl_ = nullptr;
static __device__ uint32_t gave_up_ = 0;

__device__ __forceinline__ uint64_t now_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ bool another_gave_up() {
  return cuda::atomic_ref<uint32_t, cuda::thread_scope_device>(gave_up_).load(cuda::memory_order_relaxed) != 0;
}

/* The first wait to give up writes the record; the others only end. The record is complete before `gave_up`
 * reads 1, though the harness reads it only after the step anyway. */
__device__ __forceinline__ void give_up(cuco_wait_ctl_t* ctl, const uint64_t* word, uint64_t target, uint64_t seen,
                                        uint64_t waited_ns, uint32_t ended_by, cuco_wait_site_t site) {
  uint32_t none = 0;
  if (!cuda::atomic_ref<uint32_t, cuda::thread_scope_device>(gave_up_).compare_exchange_strong(
          none, 1u, cuda::memory_order_relaxed))
    return;
  volatile cuco_wait_ctl_t* r = ctl;
  r->kind = site.kind;
  r->ended_by = ended_by;
  r->word = (uint64_t)(uintptr_t)word;
  r->target = target;
  r->seen = seen;
  r->waited_ns = waited_ns;
  r->peer = site.peer;
  r->index = site.index;
  r->block[0] = blockIdx.x;
  r->block[1] = blockIdx.y;
  r->block[2] = blockIdx.z;
  r->thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  __threadfence_system();
  cuda::atomic_ref<uint32_t, cuda::thread_scope_system>(ctl->gave_up).store(1u, cuda::memory_order_relaxed);
}

/* The spinning part of a wait, out of line: the kernels that wait keep their registers for their own work. */
static __device__ __noinline__ bool spin(const uint64_t* word, uint64_t target, cuda::memory_order order,
                                         cuco_wait_site_t site, uint32_t nap_ns) {
  cuda::atomic_ref<const uint64_t, cuda::thread_scope_system> w(*word);
  cuco_wait_ctl_t* const ctl = ctl_;
  const uint64_t start = now_ns();
  uint64_t next_look = start + kLookNs;
#pragma unroll 1
  for (uint32_t spins = 1;; ++spins) {
    if (nap_ns) __nanosleep(nap_ns);
    const uint64_t seen = w.load(order);
    if (seen >= target) return true;
    if (ctl == nullptr || spins % kSpinsPerLook != 0) continue;
    if (another_gave_up()) return false;
    const uint64_t now = now_ns();
    if (now < next_look) continue;
    next_look = now + kLookNs;
    const bool abort =
        cuda::atomic_ref<uint32_t, cuda::thread_scope_system>(ctl->abort).load(cuda::memory_order_relaxed) != 0;
    const uint64_t limit =
        cuda::atomic_ref<uint64_t, cuda::thread_scope_system>(ctl->limit_ns).load(cuda::memory_order_relaxed);
    if (abort || (limit != 0 && now - start >= limit)) {
      give_up(ctl, word, target, seen, now - start, abort ? CUCO_WAIT_ABORT : CUCO_WAIT_LIMIT, site);
      return false;
    }
  }
}
}  // namespace cuco_waits

/* Spin until *word >= target (loads with `order`, system scope: the writer is another process or another GPU).
 * true: reached. false: the wait gave up (limit or abort) and is recorded; the caller goes on regardless, so the
 * kernel ends. nap_ns > 0 sleeps between loads (spinners that share the GPU with their peers' work). */
__device__ __forceinline__ bool cuco_wait_until(const uint64_t* word, uint64_t target,
                                                cuda::memory_order order = cuda::memory_order_acquire,
                                                cuco_wait_site_t site = cuco_wait_site_t{CUCO_WAIT_FLAG, -1, -1},
                                                uint32_t nap_ns = 0) {
  if (cuda::atomic_ref<const uint64_t, cuda::thread_scope_system>(*word).load(order) >= target) return true;
  return cuco_waits::spin(word, target, order, site, nap_ns);
}

/* Host: point this module's waits at the harness's control block (host-mapped; its device address is its host
 * address under unified addressing). Found by the harness with dlsym; every build that includes this header
 * exports it. CUCO_ERR_ABI for a block of another layout, CUCO_ERR_CUDA when the copy fails. */
extern "C" __attribute__((visibility("default"))) int cuco_waits_bind(cuco_wait_ctl_t* ctl) {
  if (ctl == NULL || ctl->version != CUCO_WAITS_VERSION || ctl->struct_size != sizeof(cuco_wait_ctl_t))
    return CUCO_ERR_ABI;
  return cudaMemcpyToSymbol(cuco_waits::ctl_, &ctl, sizeof(ctl)) == cudaSuccess ? CUCO_OK : CUCO_ERR_CUDA;
}

#endif /* __CUDACC__ */

#endif /* CUCO_WAITS_H_ */
