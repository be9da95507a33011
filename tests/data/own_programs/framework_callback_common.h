// The small framework framework_callback.cu runs under (written for cuco-kit's importer tests): error checks
// and the entry a launcher calls once per rank. The launcher itself (MPI or threads) lives in another file.
#ifndef FRAMEWORK_CALLBACK_COMMON_H_
#define FRAMEWORK_CALLBACK_COMMON_H_
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#include <nccl.h>

#define CHECK_CUDA(cmd)                                                                 \
  do {                                                                                  \
    cudaError_t e_ = (cmd);                                                             \
    if (e_ != cudaSuccess) {                                                            \
      fprintf(stderr, "CUDA failure %s:%d '%s'\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
      exit(EXIT_FAILURE);                                                               \
    }                                                                                   \
  } while (0)
#define CHECK_NCCL(cmd)                                                                 \
  do {                                                                                  \
    ncclResult_t r_ = (cmd);                                                            \
    if (r_ != ncclSuccess) {                                                            \
      fprintf(stderr, "NCCL failure %s:%d '%s'\n", __FILE__, __LINE__, ncclGetErrorString(r_)); \
      exit(EXIT_FAILURE);                                                               \
    }                                                                                   \
  } while (0)

// Rank 0's unique id, handed to every rank (over MPI or shared memory, by the launcher).
int share_id(int rank, ncclUniqueId* id);
// Runs `body(rank, nranks, device)` once per rank and returns the process's exit code.
int launch_ranks(int argc, char** argv, void* (*body)(int rank, int nranks, int device));
#endif
