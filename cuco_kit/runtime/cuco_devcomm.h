// SPDX-License-Identifier: Apache-2.0
/*
 * cuco_devcomm.h — runtime helpers shared by both backends; included by cuco_lsa.h after the NCCL device API
 * (real or compat) so ncclDevComm and ncclWindow_t are known.
 *
 * Host (call from cuco_setup / cuco_teardown; return CUCO_OK or a CUCO_ERR_* code):
 *   int cuco_devcomm_create(cuco_ctx_t* ctx, int lsaBarrierCount, ncclDevComm* out);
 *   int cuco_devcomm_create_lsa_world(cuco_ctx_t* ctx, int lsaBarrierCount, ncclDevComm* out);
 *                                                             // and require LSA team == world (push kernels)
 *   int cuco_devcomm_create_gin(cuco_ctx_t* ctx, int lsaBarrierCount, int ginContextCount, int ginSignalCount,
 *                               int ginCounterCount, ncclDevComm* out);   // with GIN contexts, signals, counters
 *   int cuco_devcomm_destroy(cuco_ctx_t* ctx, ncclDevComm* dc);
 *   ncclWindow_t cuco_window(const cuco_tensor_t* t);        // a tensor's window, for ncclGetLsaPointer
 *   ncclWindow_t cuco_flags_window(const cuco_ctx_t* ctx);   // the flag region's window
 * Device:
 *   void cuco_signal(uint64_t* remote_flag, uint64_t epoch);  // release store, system scope
 *   bool cuco_wait(const uint64_t* flag, uint64_t epoch);     // acquire loads, system scope, until >= epoch;
 *                                                             // false: it gave up (cuco_waits.h), recorded
 *   uint64_t* cuco_user_flag(uint64_t* const* peers, int rank, size_t i);  // rank's i-th candidate word
 * (In the stress build, -DCUCO_STRESS=1, cuco_signal and cuco_wait pause at random: cuco_stress.h. Bound by the
 * harness, cuco_wait gives up after the step limit or when the harness aborts: cuco_waits.h.)
 *
 * Why a helper and not ncclDevCommCreate directly: NCCL 2.28 and 2.29 take different requirement structs,
 * the communicator may be non-blocking, 2.28 leaves a stale CUDA error behind, and under symm there is no
 * NCCL at all. Nothing collective happens inside a candidate beyond this call, made once per rank in setup
 * in the same order everywhere (windows themselves come from the harness).
 */
#ifndef CUCO_DEVCOMM_H_
#define CUCO_DEVCOMM_H_

#include <stdio.h>
#include <string.h>
#include <cuda_runtime_api.h>
#include "cuco_abi.h"
#include "cuco_errors.h"
#define CUCO_STRESS_LSA_BARRIER 1  /* the device API is known here: cuco_stress.h may wrap the LSA barrier */
#include "cuco_stress.h"  /* -DCUCO_STRESS=1: random pauses in the primitives below (race amplification) */
#include "cuco_waits.h"   /* the bound on every runtime wait, and the record of the one that gave up */
#ifdef __CUDACC__
#include <cuda/atomic>
#endif

#ifndef CUCO_FLAGS_RESERVED
#error "include cuco_lsa.h, not cuco_devcomm.h directly"
#endif

/* ---- host: devComm ------------------------------------------------------------------------------------- */

#if !CUCO_LSA_COMPAT

/* GIN needs requirements of its own (contexts, signals, counters); ginForceEnable asks NCCL to set GIN up even
 * where it would not by itself, so a missing network fails here, in setup, and not in a kernel. */
static inline int cuco_devcomm_create_gin(cuco_ctx_t* ctx, int lsaBarrierCount, int ginContextCount,
                                          int ginSignalCount, int ginCounterCount, ncclDevComm* out) {
  if (ctx->backend != CUCO_BACKEND_NCCL || ctx->nccl_comm == NULL) {
    fprintf(stderr, "cuco_devcomm_create: built for nccl but ctx->backend=%d nccl_comm=%p\n", ctx->backend,
            ctx->nccl_comm);
    return CUCO_ERR_BACKEND;
  }
  if (lsaBarrierCount < 0 || ginContextCount < 0 || ginSignalCount < 0 || ginCounterCount < 0) return CUCO_ERR_PARAM;
  ncclComm_t comm = (ncclComm_t)ctx->nccl_comm;
#if NCCL_VERSION_CODE >= 22900
  /* 2.29 grew the struct and gave it an initializer with non-zero defaults. */
  ncclDevCommRequirements reqs = NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER;
#else
  ncclDevCommRequirements reqs;
  memset(&reqs, 0, sizeof(reqs));
#endif
  reqs.lsaBarrierCount = lsaBarrierCount;
  if (ginContextCount > 0) {
    reqs.ginForceEnable = true;
    reqs.ginContextCount = ginContextCount;
    reqs.ginSignalCount = ginSignalCount;
    reqs.ginCounterCount = ginCounterCount;
  }
  memset(out, 0, sizeof(*out));
  ncclResult_t r = cuco_nccl_settle(comm, ncclDevCommCreate(comm, &reqs, out));
  /* 2.28 leaves a stale, non-sticky CUDA error behind even on success; clear it so the candidate's next
   * cudaGetLastError() reports its own launches only. */
  (void)cudaGetLastError();
  if (r != ncclSuccess) {
    /* For the human reading the rank log; the harness never parses candidate output. */
    fprintf(stderr, "cuco_devcomm_create: ncclDevCommCreate failed: %s\n", ncclGetErrorString(r));
    return CUCO_ERR_NCCL;
  }
  if (out->lsaSize < 1)
    fprintf(stderr, "cuco_devcomm_create: devComm has rank %d nRanks %d lsaRank %d lsaSize %d\n", out->rank,
            out->nRanks, out->lsaRank, out->lsaSize);
  return CUCO_OK;
}

static inline int cuco_devcomm_create(cuco_ctx_t* ctx, int lsaBarrierCount, ncclDevComm* out) {
  return cuco_devcomm_create_gin(ctx, lsaBarrierCount, 0, 0, 0, out);
}

static inline int cuco_devcomm_destroy(cuco_ctx_t* ctx, ncclDevComm* dc) {
  if (ctx->backend != CUCO_BACKEND_NCCL || ctx->nccl_comm == NULL) return CUCO_ERR_BACKEND;
  ncclComm_t comm = (ncclComm_t)ctx->nccl_comm;
  ncclResult_t r = cuco_nccl_settle(comm, ncclDevCommDestroy(comm, dc));
  return r == ncclSuccess ? CUCO_OK : CUCO_ERR_NCCL;
}

static inline ncclWindow_t cuco_window(const cuco_tensor_t* t) { return (ncclWindow_t)t->window; }
static inline ncclWindow_t cuco_flags_window(const cuco_ctx_t* ctx) { return (ncclWindow_t)ctx->flags.window; }

#else /* symm: compat devComm over the harness flag region */

/* Next free runtime word per rank for compat barriers, and how many devComms hold words. One copy per
 * candidate (this header is compiled into exactly one translation unit); words are handed out again once
 * every devComm is destroyed, since the harness zeroes the region for each loaded candidate. */
static size_t cuco_compat_next_word_ = CUCO_COMPAT_HEADER_WORDS;
static int cuco_compat_live_devcomms_ = 0;

/* Barrier words first, then the GIN words (gin_compat.h has their layout), from the runtime's part of the region. */
static inline int cuco_devcomm_create_gin(cuco_ctx_t* ctx, int lsaBarrierCount, int ginContextCount,
                                          int ginSignalCount, int ginCounterCount, ncclDevComm* out) {
  if (ctx->backend != CUCO_BACKEND_SYMM) return CUCO_ERR_BACKEND;
  if (lsaBarrierCount < 0 || ctx->world_size < 1 || ctx->world_size > CUCO_MAX_RANKS) return CUCO_ERR_PARAM;
  if (ginContextCount < 0 || ginContextCount > 4 || ginSignalCount < 0 || ginCounterCount < 0) return CUCO_ERR_PARAM;
  if (ctx->flags.peers == NULL || ctx->flags.count < CUCO_FLAGS_RESERVED) return CUCO_ERR_PARAM;
  const size_t barrier_words = cuco_compat_barrier_words(lsaBarrierCount, ctx->world_size);
  const size_t gin_words = ginContextCount > 0 ? cuco_compat_gin_words(ginContextCount, ginSignalCount,
                                                                       ginCounterCount) : 0;
  if (cuco_compat_next_word_ + barrier_words + gin_words > CUCO_FLAGS_RESERVED) return CUCO_ERR_PARAM;
  memset(out, 0, sizeof(*out));
  out->rank = out->lsaRank = ctx->rank;
  out->nRanks = out->lsaSize = ctx->world_size;
  out->flagPeers = ctx->flags.peers;
  out->barrierBase = cuco_compat_next_word_;
  out->lsaBarrierCount = lsaBarrierCount;
  if (ginContextCount > 0) {
    out->ginContextCount = ginContextCount;
    out->ginSignalCount = ginSignalCount;
    out->ginCounterCount = ginCounterCount;
    out->ginBase = cuco_compat_next_word_ + barrier_words;
  }
#ifdef __CUDACC__
  int rank = ctx->rank;
  if (cudaMemcpyToSymbol(cuco_compat_rank_, &rank, sizeof(rank)) != cudaSuccess) return CUCO_ERR_CUDA;
#endif
  cuco_compat_next_word_ += barrier_words + gin_words;
  cuco_compat_live_devcomms_ += 1;
  return CUCO_OK;
}

static inline int cuco_devcomm_create(cuco_ctx_t* ctx, int lsaBarrierCount, ncclDevComm* out) {
  return cuco_devcomm_create_gin(ctx, lsaBarrierCount, 0, 0, 0, out);
}

static inline int cuco_devcomm_destroy(cuco_ctx_t* ctx, ncclDevComm* dc) {
  if (ctx->backend != CUCO_BACKEND_SYMM) return CUCO_ERR_BACKEND;
  memset(dc, 0, sizeof(*dc));
  if (cuco_compat_live_devcomms_ > 0 && --cuco_compat_live_devcomms_ == 0)
    cuco_compat_next_word_ = CUCO_COMPAT_HEADER_WORDS;
  return CUCO_OK;
}

/* The compat window is the tensor's device peer table, so ncclGetLsaPointer(w, off, p) = peers[p] + off. */
static inline ncclWindow_t cuco_window(const cuco_tensor_t* t) { return (ncclWindow_t)t->peers; }
static inline ncclWindow_t cuco_flags_window(const cuco_ctx_t* ctx) { return (ncclWindow_t)ctx->flags.peers; }

#endif /* CUCO_LSA_COMPAT */

/* ---- host: a devComm whose LSA team is the world ---------------------------------------------------------- */

/* cuco_devcomm_create for kernels that reach every rank by load/store (push or pull through ncclGetLsaPointer):
 * the LSA team must span the world (one NVLink domain, or every symm rank on one GPU), and world rank r must be
 * LSA rank r so a world rank can index a window directly. Otherwise CUCO_ERR_BACKEND, the devComm destroyed
 * again: *out is only live after CUCO_OK. */
static inline int cuco_devcomm_create_lsa_world(cuco_ctx_t* ctx, int lsaBarrierCount, ncclDevComm* out) {
  const int rc = cuco_devcomm_create(ctx, lsaBarrierCount, out);
  if (rc != CUCO_OK) return rc;
  if (out->lsaSize == ctx->world_size && out->lsaRank == ctx->rank) return CUCO_OK;
  /* For the human reading the rank log; the harness never parses candidate output. */
  fprintf(stderr, "cuco_devcomm_create_lsa_world: LSA team %d/%d does not span the world %d/%d\n", out->lsaRank,
          out->lsaSize, ctx->rank, ctx->world_size);
  cuco_devcomm_destroy(ctx, out);
  return CUCO_ERR_BACKEND;
}

/* ---- device: epoch flags (both backends) ------------------------------------------------------------- */

#ifdef __CUDACC__
/* System scope on both sides of every flag: the reader is another process under symm (another CUDA context on
 * the same GPU) and another GPU under nccl, so a narrower scope would not order the producer's data writes for
 * it. Same cuda::atomic_ref idiom as NCCL's device API and lsa_compat.h. */

/* Publish `epoch` to a (usually remote) flag. Release: every write this thread made before, and every write
 * ordered before it by a preceding __syncthreads, becomes visible to whoever acquires the flag. */
__device__ __forceinline__ void cuco_signal(uint64_t* remote_flag, uint64_t epoch) {
  cuda::atomic_ref<uint64_t, cuda::thread_scope_system>(*remote_flag).store(epoch, cuda::memory_order_release);
  cuco_stress_after_signal(remote_flag, epoch);
}

/* Spin until `flag` reaches `epoch`; the acquire makes the producer's earlier writes visible after it. false: the
 * wait gave up (the harness's step limit or abort word, cuco_waits.h) and the harness will fail the step, naming
 * this flag; the caller may simply go on, so its kernel ends. */
__device__ __forceinline__ bool cuco_wait(const uint64_t* flag, uint64_t epoch) {
  const bool reached = cuco_wait_until(flag, epoch);
  cuco_stress_before_wait_returns(flag, epoch);
  return reached;
}

/* Rank `rank`'s i-th candidate-owned flag word (past the runtime's reserved words). */
__device__ __forceinline__ uint64_t* cuco_user_flag(uint64_t* const* peers, int rank, size_t i) {
  return peers[rank] + CUCO_FLAGS_RESERVED + i;
}
#endif /* __CUDACC__ */

#endif /* CUCO_DEVCOMM_H_ */
