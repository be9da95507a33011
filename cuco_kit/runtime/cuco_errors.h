// SPDX-License-Identifier: Apache-2.0
/*
 * cuco_errors.h — error propagation for a candidate's host code: a failed CUDA, cuBLAS or NCCL call becomes the
 * matching CUCO_ERR_* code of cuco_abi.h and is returned from the enclosing function (an entry point, or a helper
 * that itself returns a CUCO_* code).
 *
 *   CUCO_TRY(expr)               return expr's CUCO_* code unless it is CUCO_OK (calls of such helpers)
 *   CUCO_CUDA_TRY(call)          return CUCO_ERR_CUDA when a CUDA runtime call fails (defined in cuco_abi.h)
 *   int cuco_cuda_status(e)      CUCO_OK or CUCO_ERR_CUDA for a cudaError_t, where the code is kept, not returned
 *                                (`rc = cuco_cuda_status(...)` chains in setup, a helper's last call)
 *   CUCO_CUBLAS_TRY(call)        return CUCO_ERR_CUBLAS when a cuBLAS call fails
 * and, once <nccl.h> has been included (see below):
 *   ncclResult_t cuco_nccl_settle(comm, r)   the final result of a call on a possibly non-blocking communicator
 *   int cuco_nccl_status(comm, r)            CUCO_OK or CUCO_ERR_NCCL for that final result
 *   CUCO_NCCL_TRY(comm, call)               return CUCO_ERR_NCCL when the call fails
 *
 * cuco_lsa.h includes this header (a device-initiated candidate has it with its one include); a copy-engine or
 * host-NCCL seed includes it itself, after <nccl.h> and <cublas_v2.h>. The macros name cuBLAS and NCCL
 * symbols only where they are used, so this header needs neither library; the NCCL functions need its types and
 * appear when <nccl.h> came first (NCCL_MAJOR is defined), also on a later include of this header. Under the
 * `symm` backend there is no <nccl.h>, and no host NCCL call to check.
 */
#ifndef CUCO_ERRORS_H_
#define CUCO_ERRORS_H_

#include <cuda_runtime_api.h>
#include "cuco_abi.h"

#define CUCO_TRY(expr)                                \
  do {                                                \
    const int cuco_try_rc_ = (expr);                  \
    if (cuco_try_rc_ != CUCO_OK) return cuco_try_rc_; \
  } while (0)

#define CUCO_CUBLAS_TRY(call)                                    \
  do {                                                           \
    if ((call) != CUBLAS_STATUS_SUCCESS) return CUCO_ERR_CUBLAS; \
  } while (0)

#define CUCO_NCCL_TRY(comm, call)                                              \
  do {                                                                         \
    if (cuco_nccl_settle((comm), (call)) != ncclSuccess) return CUCO_ERR_NCCL; \
  } while (0)

static inline int cuco_cuda_status(cudaError_t e) { return e == cudaSuccess ? CUCO_OK : CUCO_ERR_CUDA; }

#endif /* CUCO_ERRORS_H_ */

#if defined(NCCL_MAJOR) && !defined(CUCO_ERRORS_NCCL_)
#define CUCO_ERRORS_NCCL_
#include <sched.h>

/* A non-blocking communicator may answer ncclInProgress, for an enqueued collective or for ncclDevCommCreate;
 * poll its async error until the call settles (a failing poll is the answer). */
static inline ncclResult_t cuco_nccl_settle(ncclComm_t comm, ncclResult_t r) {
  while (r == ncclInProgress) {
    const ncclResult_t q = ncclCommGetAsyncError(comm, &r);
    if (q != ncclSuccess) return q;
    if (r == ncclInProgress) sched_yield();
  }
  return r;
}

static inline int cuco_nccl_status(ncclComm_t comm, ncclResult_t r) {
  return cuco_nccl_settle(comm, r) == ncclSuccess ? CUCO_OK : CUCO_ERR_NCCL;
}
#endif /* NCCL_MAJOR */
