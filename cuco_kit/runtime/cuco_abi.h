// SPDX-License-Identifier: Apache-2.0
/*
 * cuco_abi.h — the candidate ABI, version 1 (frozen: any change bumps CUCO_ABI_VERSION).
 *
 * A candidate is ONE .cu file built by nvcc into a shared library. It includes this header and exports
 *
 *     CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx);     // once per load: devComm, streams, events, user state
 *     CUCO_EXPORT int cuco_step(cuco_ctx_t* ctx);      // one timed iteration, enqueued on ctx->stream
 *     CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx);  // release what setup made
 *
 * and optionally
 *
 *     CUCO_EXPORT int cuco_declare_scratch(const cuco_ctx_t* ctx, cuco_scratch_request_t* req, int max_req);
 *
 * Each returns 0 on success; anything else is an error code the harness records (cuco_declare_scratch returns
 * the number of requests it wrote). The harness — never the candidate — owns timing, inputs, verification and
 * everything collective: communicator, windows, the flag region and the scratch windows a candidate declares.
 * Those are made in the same order on every rank before cuco_setup, so a candidate can't deadlock the world by
 * registering memory in a data-dependent order.
 *
 * Why the struct is backend-neutral: the same source runs under the `nccl` backend (real NCCL device API over
 * NVLink) and under `symm` (several ranks sharing one GPU through peer pointers, see lsa_compat.h). NCCL types
 * appear here only as opaque pointers so this header compiles without nccl.h.
 *
 * Nothing a candidate prints is read. Work forked off ctx->stream must rejoin it before cuco_step returns
 * (the harness checks once with stream capture).
 */
#ifndef CUCO_ABI_H_
#define CUCO_ABI_H_

#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime_api.h>

#define CUCO_ABI_VERSION 1

#ifdef __cplusplus
#define CUCO_EXPORT extern "C" __attribute__((visibility("default")))
#else
#define CUCO_EXPORT __attribute__((visibility("default")))
#endif

/* Limits of the fixed-size tables below. Part of the ABI: changing one bumps CUCO_ABI_VERSION. */
#define CUCO_MAX_TENSORS 16
#define CUCO_MAX_PARAMS 32
#define CUCO_MAX_SCRATCH 8
#define CUCO_MAX_RANKS 64
#define CUCO_NAME_LEN 32

/* Which collective machinery sits under the context. */
typedef enum cuco_backend {
  CUCO_BACKEND_NCCL = 0, /* real NCCL communicator, windows and device API (LSA; GIN where NICs exist) */
  CUCO_BACKEND_SYMM = 1  /* ranks are processes sharing one GPU; peer pointers from torch symmetric memory */
} cuco_backend_t;

typedef enum cuco_dtype {
  CUCO_DTYPE_U8 = 0,
  CUCO_DTYPE_I32 = 1,
  CUCO_DTYPE_I64 = 2,
  CUCO_DTYPE_F16 = 3,
  CUCO_DTYPE_BF16 = 4,
  CUCO_DTYPE_F32 = 5,
  CUCO_DTYPE_FP8_E4M3 = 6
} cuco_dtype_t;

/* Role of a tensor in the workload. Inputs are refilled with fresh random data before every timed iteration;
 * outputs are poisoned (NaN pattern) before it and verified after it. */
typedef enum cuco_tensor_role {
  CUCO_ROLE_INPUT = 1,
  CUCO_ROLE_OUTPUT = 2,
  CUCO_ROLE_INOUT = 3
} cuco_tensor_role_t;

/*
 * One tensor of the workload (or one scratch window), identical in layout on every rank.
 *   local           this rank's device pointer.
 *   peers           DEVICE-resident table of world_size pointers: peers[r] is rank r's copy of this tensor,
 *                   mapped into this process (NVLink peer mapping under nccl, symmetric-memory mapping under
 *                   symm). peers[rank] == local. Kernels read it directly.
 *   peers_host      the same table in host memory, for host code (cudaMemcpyAsync from a peer).
 *   capacity_bytes  bytes allocated (identical on all ranks: windows are symmetric).
 *   valid_bytes     bytes that carry data this step (<= capacity). MoE dispatch and KV transfer are uneven:
 *                   a rank may send fewer tokens than its capacity allows.
 *   window          the ncclWindow_t registered with NCCL_WIN_COLL_SYMMETRIC; NULL when the backend has none.
 */
typedef struct cuco_tensor {
  char name[CUCO_NAME_LEN];
  int role;  /* cuco_tensor_role_t */
  int dtype; /* cuco_dtype_t */
  int ndim;
  int64_t shape[4];
  void* local;
  void* const* peers;
  void* const* peers_host;
  size_t capacity_bytes;
  size_t valid_bytes;
  void* window; /* ncclWindow_t or NULL */
} cuco_tensor_t;

/*
 * The harness-owned flag region: `count` 64-bit words per rank, zeroed once when a candidate is loaded.
 * Signalling protocol: ctx->epoch grows by one every cuco_step, so a producer stores `epoch` (release,
 * system scope) into a consumer's flag and the consumer waits for `>= epoch` (acquire). No flag ever needs a
 * reset between iterations, and a stale flag from the previous iteration can never satisfy a wait.
 */
typedef struct cuco_flags {
  uint64_t* local;           /* this rank's words */
  uint64_t* const* peers;    /* DEVICE table of world_size pointers to every rank's words */
  uint64_t* const* peers_host;
  size_t count;              /* words per rank */
  void* window;              /* ncclWindow_t or NULL */
} cuco_flags_t;

/* What a candidate asks for in cuco_declare_scratch: a symmetric window of `bytes` on every rank, made by the
 * harness in declaration order before cuco_setup and handed back in ctx->scratch[i]. */
typedef struct cuco_scratch_request {
  char name[CUCO_NAME_LEN];
  size_t bytes;
} cuco_scratch_request_t;

/*
 * The context handed to every entry point. Everything is owned by the harness except `user`.
 *   abi_version, struct_size   checked by the candidate's cuco_setup via CUCO_CHECK_ABI (see below).
 *   rank, world_size           position in the world communicator (or in the symm group).
 *   local_rank                 rank within the host; with symm every rank shares device `device`.
 *   backend                    cuco_backend_t.
 *   nccl_comm                  ncclComm_t; under symm NULL, or for a host-NCCL build the communicator of
 *                              runtime/symm_nccl/nccl.h (bound through its optional cuco_host_nccl_bind).
 *   stream                     the harness stream: all step work is enqueued here or joins back to it.
 *   cublas                     a cublasHandle_t made once per worker (set its stream before use).
 *   params/param_names         the workload's integer parameters (M, N, K, chunking seeds, ...);
 *                              look one up with cuco_param(ctx, "M").
 *   user                       the candidate's own state; set in setup, freed in teardown.
 *   tensors                    the workload's I/O tensors, in the order the workload lists them.
 *   flags                      the harness flag region (see cuco_flags_t).
 *   scratch                    declared scratch windows, in declaration order.
 *   epoch                      1 on the first step after setup, +1 every step (see cuco_flags_t).
 *   sm_count                   multiprocessors of the device, for persistent grids.
 */
typedef struct cuco_ctx {
  uint32_t abi_version;
  uint32_t struct_size;
  int rank;
  int world_size;
  int local_rank;
  int backend;
  int device;
  int sm_count;
  void* nccl_comm;
  cudaStream_t stream;
  void* cublas;
  int n_params;
  char param_names[CUCO_MAX_PARAMS][CUCO_NAME_LEN];
  int64_t params[CUCO_MAX_PARAMS];
  void* user;
  int n_tensors;
  cuco_tensor_t tensors[CUCO_MAX_TENSORS];
  cuco_flags_t flags;
  int n_scratch;
  cuco_tensor_t scratch[CUCO_MAX_SCRATCH];
  uint64_t epoch;
} cuco_ctx_t;

/* Error codes a candidate may return (any non-zero value is an error; these have names in the logs). */
#define CUCO_OK 0
#define CUCO_ERR_ABI 1      /* header/harness version mismatch */
#define CUCO_ERR_CUDA 2     /* a CUDA runtime call failed */
#define CUCO_ERR_NCCL 3     /* an NCCL call failed */
#define CUCO_ERR_CUBLAS 4   /* a cuBLAS call failed */
#define CUCO_ERR_PARAM 5    /* a parameter or tensor the candidate needs is missing or unsupported */
#define CUCO_ERR_BACKEND 6  /* the candidate does not support this backend */

#ifdef __cplusplus
#include <string.h>
/* Host-side lookups by name; -1 / NULL when absent so a candidate can fail with CUCO_ERR_PARAM. */
static inline int64_t cuco_param(const cuco_ctx_t* ctx, const char* name) {
  for (int i = 0; i < ctx->n_params; ++i)
    if (strncmp(ctx->param_names[i], name, CUCO_NAME_LEN) == 0) return ctx->params[i];
  return -1;
}
static inline cuco_tensor_t* cuco_tensor(cuco_ctx_t* ctx, const char* name) {
  for (int i = 0; i < ctx->n_tensors; ++i)
    if (strncmp(ctx->tensors[i].name, name, CUCO_NAME_LEN) == 0) return &ctx->tensors[i];
  return NULL;
}
static inline cuco_tensor_t* cuco_scratch(cuco_ctx_t* ctx, const char* name) {
  for (int i = 0; i < ctx->n_scratch; ++i)
    if (strncmp(ctx->scratch[i].name, name, CUCO_NAME_LEN) == 0) return &ctx->scratch[i];
  return NULL;
}
#endif

/* First line of every cuco_setup: refuse a context from another ABI version instead of misreading it. */
#define CUCO_CHECK_ABI(ctx)                                                                   \
  do {                                                                                        \
    if ((ctx)->abi_version != CUCO_ABI_VERSION || (ctx)->struct_size != sizeof(cuco_ctx_t)) \
      return CUCO_ERR_ABI;                                                                    \
  } while (0)

/* Return CUCO_ERR_CUDA from the enclosing entry point when a CUDA runtime call fails. */
#define CUCO_CUDA_TRY(call)                        \
  do {                                             \
    if ((call) != cudaSuccess) return CUCO_ERR_CUDA; \
  } while (0)

#endif /* CUCO_ABI_H_ */
