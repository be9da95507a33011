// SPDX-License-Identifier: Apache-2.0
/*
 * nccl.h (symm) — NCCL's host API for the `symm` backend: collectives and send/recv through the ranks' shared
 * memory, stream-ordered like NCCL's. The counterpart of lsa_compat.h, which serves the device API.
 *
 * Only symm builds see this file: build.py puts runtime/symm_nccl/ first on the include path for backend symm, so
 * a host-driven candidate's `#include <nccl.h>` lands here instead of the wheel's header, and nothing links
 * libnccl. Under symm the ranks are processes sharing ONE GPU; there is no NCCL communicator. The harness binds
 * this header's communicator before cuco_setup (cuco_host_nccl_bind, in host_nccl_compat.h, found with dlsym)
 * and hands it over as ctx->nccl_comm, so the unchanged host code runs:
 *
 *     ncclComm_t comm = (ncclComm_t)ctx->nccl_comm;
 *     ncclAllReduce(x, y, n, ncclFloat, ncclSum, comm, ctx->stream);
 *
 * The rules are NCCL's: a call returns once its work is enqueued on `stream`; every rank calls the collectives in
 * the same order; the k-th send to a peer meets that peer's k-th receive from this rank; calls between
 * ncclGroupStart and ncclGroupEnd progress together (a collective inside a group runs at its call); the
 * communicator's work is serialised across streams, in call order. The data travels through a harness-owned
 * staging window per rank, in chunks of its size, so any message size works (host_nccl_compat.h says how).
 * Ranks sharing one GPU check correctness and contention, never NVLink speed.
 *
 * Served (NCCL 2.28's signatures):
 *   collectives       ncclAllReduce, ncclReduce, ncclBroadcast, ncclBcast, ncclAllGather, ncclReduceScatter,
 *                     ncclAlltoAll, ncclGather, ncclScatter (every built-in op on every data type)
 *   point to point    ncclSend, ncclRecv, inside or outside ncclGroupStart / ncclGroupEnd
 *   queries           ncclCommCount, ncclCommUserRank, ncclCommCuDevice, ncclCommGetAsyncError, ncclGetVersion,
 *                     ncclGetErrorString, ncclGetLastError
 *   memory            ncclMemAlloc, ncclMemFree (cudaMalloc / cudaFree: there is nothing to register)
 *   setup, teardown   ncclGetUniqueId, ncclCommInitRank, ncclCommInitRankConfig, ncclCommInitAll: return
 *                     ncclInvalidUsage (the harness owns the communicator); ncclCommDestroy, ncclCommFinalize,
 *                     ncclCommAbort of the harness's communicator: no-ops
 * Not declared, so a candidate using them fails to build under symm (the honest outcome): communicator splitting
 * and shrinking, custom reduction ops (ncclRedOpCreatePreMulSum), buffer and window registration,
 * ncclGroupSimulateEnd, the pncclXxx profiling names.
 *
 * Types, enums and version macros carry the exact values of the NCCL release this mirrors (2.28.9); the compile
 * tier compares them with the installed wheel's header.
 */
#ifndef NCCL_H_
#define NCCL_H_

/* The wheel's header brings these; programs rely on getting them through <nccl.h>. */
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#ifdef __cplusplus
#include <cuda_fp8.h>
#endif
#include <limits.h>
#include <stddef.h>

#define NCCL_MAJOR 2
#define NCCL_MINOR 28
#define NCCL_PATCH 9
#define NCCL_SUFFIX ""

#define NCCL_VERSION_CODE 22809
#define NCCL_VERSION(X, Y, Z) (((X) <= 2 && (Y) <= 8) ? (X) * 1000 + (Y) * 100 + (Z) : (X) * 10000 + (Y) * 100 + (Z))

/* This rank's communicator: the harness binds it (host_nccl_compat.h). */
typedef struct ncclComm* ncclComm_t;
#define NCCL_COMM_NULL NULL

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclNumResults = 8
} ncclResult_t;

#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR NULL
#define NCCL_SPLIT_NOCOLOR -1
#define NCCL_UNDEF_FLOAT -1.0f

/* Communicator configuration (ncclConfig_v22800), for programs whose setup still fills one in. */
typedef struct ncclConfig_v22800 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
  int cgaClusterSize;
  int minCTAs;
  int maxCTAs;
  const char* netName;
  int splitShare;
  int trafficClass;
  const char* commName;
  int collnetEnable;
  int CTAPolicy;
  int shrinkShare;
  int nvlsCTAs;
  int nChannelsPerNetPeer;
  int nvlinkCentricSched;
} ncclConfig_t;

#define NCCL_CONFIG_INITIALIZER                                                                              \
  {                                                                                                          \
    sizeof(ncclConfig_t), 0xcafebeef, NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), NCCL_CONFIG_UNDEF_INT, \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_PTR,          \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_PTR, NCCL_CONFIG_UNDEF_INT,          \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,          \
        NCCL_CONFIG_UNDEF_INT,                                                                               \
  }

typedef enum { ncclNumOps_dummy = 5 } ncclRedOp_dummy_t;
typedef enum {
  ncclSum = 0,
  ncclProd = 1,
  ncclMax = 2,
  ncclMin = 3,
  ncclAvg = 4,
  ncclNumOps = 5,
  ncclMaxRedOp = 0x7fffffff >> (32 - 8 * sizeof(ncclRedOp_dummy_t))
} ncclRedOp_t;

typedef enum {
  ncclInt8 = 0,
  ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclHalf = 6,
  ncclFloat32 = 7,
  ncclFloat = 7,
  ncclFloat64 = 8,
  ncclDouble = 8,
  ncclBfloat16 = 9,
  ncclFloat8e4m3 = 10,
  ncclFloat8e5m2 = 11,
  ncclNumTypes = 12
} ncclDataType_t;

/* ---- the API ------------------------------------------------------------------------------------------------
 * Under nvcc: static inline, defined by host_nccl_compat.h in the candidate's one translation unit. A host-only
 * C/C++ file sees NCCL's plain declarations, which only the candidate's nvcc-built code defines. */
#if defined(__CUDACC__)
#define CUCO_NCCL_API static inline
#elif defined(__cplusplus)
#define CUCO_NCCL_API extern "C"
#else
#define CUCO_NCCL_API extern
#endif

CUCO_NCCL_API ncclResult_t ncclGetVersion(int* version);
CUCO_NCCL_API const char* ncclGetErrorString(ncclResult_t result);
CUCO_NCCL_API const char* ncclGetLastError(ncclComm_t comm);
CUCO_NCCL_API ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError);
CUCO_NCCL_API ncclResult_t ncclCommCount(const ncclComm_t comm, int* count);
CUCO_NCCL_API ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device);
CUCO_NCCL_API ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank);

CUCO_NCCL_API ncclResult_t ncclMemAlloc(void** ptr, size_t size);
CUCO_NCCL_API ncclResult_t ncclMemFree(void* ptr);

CUCO_NCCL_API ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId);
CUCO_NCCL_API ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank);
CUCO_NCCL_API ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                                  ncclConfig_t* config);
CUCO_NCCL_API ncclResult_t ncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist);
CUCO_NCCL_API ncclResult_t ncclCommFinalize(ncclComm_t comm);
CUCO_NCCL_API ncclResult_t ncclCommDestroy(ncclComm_t comm);
CUCO_NCCL_API ncclResult_t ncclCommAbort(ncclComm_t comm);

CUCO_NCCL_API ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                      ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream);
CUCO_NCCL_API ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                                     cudaStream_t stream);
CUCO_NCCL_API ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                         int root, ncclComm_t comm, cudaStream_t stream);
CUCO_NCCL_API ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                         ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
CUCO_NCCL_API ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                             ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                             cudaStream_t stream);
CUCO_NCCL_API ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                         ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
CUCO_NCCL_API ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                        ncclComm_t comm, cudaStream_t stream);
CUCO_NCCL_API ncclResult_t ncclGather(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                      int root, ncclComm_t comm, cudaStream_t stream);
CUCO_NCCL_API ncclResult_t ncclScatter(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                       int root, ncclComm_t comm, cudaStream_t stream);

CUCO_NCCL_API ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                                    ncclComm_t comm, cudaStream_t stream);
CUCO_NCCL_API ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                                    cudaStream_t stream);

CUCO_NCCL_API ncclResult_t ncclGroupStart(void);
CUCO_NCCL_API ncclResult_t ncclGroupEnd(void);

#ifdef __CUDACC__
#include "host_nccl_compat.h" /* the definitions: they launch kernels */
#endif

#endif /* NCCL_H_ */
