// A host-driven program written for cuco-kit's importer tests (not a sample), in the shape of NCCL's "one device
// per process" usage: MPI starts the processes, each picks a GPU by its rank on the node (ranks on one host are
// counted from a hash of the host name), and ONE all-reduce runs between creating the communicator and
// synchronising before teardown; there is no loop. The result is checked on the host and printed.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <unistd.h>
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#define MPI_CHECK(cmd)                                                            \
  do {                                                                            \
    int e_ = (cmd);                                                               \
    if (e_ != MPI_SUCCESS) {                                                      \
      printf("Failed: MPI error %s:%d '%d'\n", __FILE__, __LINE__, e_);           \
      exit(EXIT_FAILURE);                                                         \
    }                                                                             \
  } while (0)
#define CUDA_CHECK(cmd)                                                           \
  do {                                                                            \
    cudaError_t e_ = (cmd);                                                       \
    if (e_ != cudaSuccess) {                                                      \
      printf("Failed: CUDA error %s:%d '%s'\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
      exit(EXIT_FAILURE);                                                         \
    }                                                                             \
  } while (0)
#define NCCL_CHECK(cmd)                                                           \
  do {                                                                            \
    ncclResult_t r_ = (cmd);                                                      \
    if (r_ != ncclSuccess) {                                                      \
      printf("Failed: NCCL error %s:%d '%s'\n", __FILE__, __LINE__, ncclGetErrorString(r_)); \
      exit(EXIT_FAILURE);                                                         \
    }                                                                             \
  } while (0)

// FNV-1a over the host name: equal on the ranks of one node.
static uint64_t host_hash(const char* name) {
  uint64_t h = 1469598103934665603ull;
  for (const char* c = name; *c; ++c) h = (h ^ (unsigned char)*c) * 1099511628211ull;
  return h;
}

// This rank's index among the ranks of its node: which GPU it drives.
static int node_local_rank(int rank, int nranks) {
  char name[256];
  gethostname(name, sizeof(name));
  name[sizeof(name) - 1] = '\0';
  std::vector<uint64_t> hashes(nranks);
  hashes[rank] = host_hash(name);
  MPI_CHECK(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, hashes.data(), sizeof(uint64_t), MPI_BYTE,
                          MPI_COMM_WORLD));
  int local = 0;
  for (int p = 0; p < rank; ++p) local += hashes[p] == hashes[rank];
  return local;
}

int main(int argc, char* argv[]) {
  size_t count = 4 * 1024 * 1024;  // floats per rank
  int my_rank = 0, n_ranks = 1;
  MPI_CHECK(MPI_Init(&argc, &argv));
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &my_rank));
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &n_ranks));
  const int local_rank = node_local_rank(my_rank, n_ranks);

  ncclUniqueId id;
  ncclComm_t comm;
  float *send_buf, *recv_buf;
  cudaStream_t s;
  if (my_rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
  MPI_CHECK(MPI_Bcast((void*)&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD));

  CUDA_CHECK(cudaSetDevice(local_rank));
  CUDA_CHECK(cudaMalloc(&send_buf, count * sizeof(float)));
  CUDA_CHECK(cudaMalloc(&recv_buf, count * sizeof(float)));
  CUDA_CHECK(cudaStreamCreate(&s));
  NCCL_CHECK(ncclCommInitRank(&comm, n_ranks, id, my_rank));

  std::vector<float> host(count, 1.0f + my_rank);
  CUDA_CHECK(cudaMemcpy(send_buf, host.data(), count * sizeof(float), cudaMemcpyHostToDevice));

  NCCL_CHECK(ncclAllReduce((const void*)send_buf, (void*)recv_buf, count, ncclFloat, ncclSum, comm, s));

  // the all-reduce has finished once the stream has
  CUDA_CHECK(cudaStreamSynchronize(s));

  CUDA_CHECK(cudaMemcpy(host.data(), recv_buf, count * sizeof(float), cudaMemcpyDeviceToHost));
  const float want = n_ranks * (n_ranks + 1) / 2.0f;
  size_t wrong = 0;
  for (size_t i = 0; i < count; ++i) wrong += host[i] != want;

  CUDA_CHECK(cudaFree(send_buf));
  CUDA_CHECK(cudaFree(recv_buf));
  ncclCommDestroy(comm);
  MPI_CHECK(MPI_Finalize());
  printf("[MPI rank %d] %s (%zu of %zu elements wrong)\n", my_rank, wrong ? "FAILED" : "Success", wrong, count);
  return wrong ? 1 : 0;
}
