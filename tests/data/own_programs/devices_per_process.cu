// A host-driven program written for cuco-kit's importer tests (not a sample): MPI ranks that each drive several
// GPUs. Every rank makes one communicator per local device in a group (NCCL rank = rank * devices + device),
// then every iteration reduce-scatters each device's gradient block (all devices' calls in one group) and
// applies a momentum update to the device's shard.
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#define CUDA_CALL(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { fprintf(stderr, "cuda: %s\n", cudaGetErrorString(e_)); MPI_Abort(MPI_COMM_WORLD, 1); } } while (0)
#define NCCL_CALL(x) do { ncclResult_t r_ = (x); if (r_ != ncclSuccess) { fprintf(stderr, "nccl: %s\n", ncclGetErrorString(r_)); MPI_Abort(MPI_COMM_WORLD, 1); } } while (0)

constexpr int kDevicesPerRank = 2;
constexpr size_t kShard = 1 << 20;  // floats each device keeps after the reduce-scatter

__global__ void momentum(float* velocity, float* weights, const float* grad, size_t n, float beta, float lr) {
  const size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= n) return;
  velocity[i] = beta * velocity[i] + grad[i];
  weights[i] -= lr * velocity[i];
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, nranks;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  const int ndev = kDevicesPerRank;
  ncclUniqueId id;
  if (rank == 0) NCCL_CALL(ncclGetUniqueId(&id));
  MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);

  ncclComm_t comms[kDevicesPerRank];
  cudaStream_t streams[kDevicesPerRank];
  float *grads[kDevicesPerRank], *grad_shard[kDevicesPerRank], *velocity[kDevicesPerRank],
      *weights[kDevicesPerRank];
  NCCL_CALL(ncclGroupStart());
  for (int d = 0; d < ndev; ++d) {
    CUDA_CALL(cudaSetDevice(rank * ndev + d));
    NCCL_CALL(ncclCommInitRank(comms + d, nranks * ndev, id, rank * ndev + d));
  }
  NCCL_CALL(ncclGroupEnd());
  for (int d = 0; d < ndev; ++d) {
    CUDA_CALL(cudaSetDevice(rank * ndev + d));
    CUDA_CALL(cudaStreamCreate(&streams[d]));
    CUDA_CALL(cudaMalloc(&grads[d], kShard * nranks * ndev * sizeof(float)));
    CUDA_CALL(cudaMalloc(&grad_shard[d], kShard * sizeof(float)));
    CUDA_CALL(cudaMalloc(&velocity[d], kShard * sizeof(float)));
    CUDA_CALL(cudaMalloc(&weights[d], kShard * sizeof(float)));
    CUDA_CALL(cudaMemset(velocity[d], 0, kShard * sizeof(float)));
    CUDA_CALL(cudaMemset(weights[d], 0, kShard * sizeof(float)));
  }

  const double t0 = MPI_Wtime();
  for (int step = 0; step < 20; ++step) {
    NCCL_CALL(ncclGroupStart());
    for (int d = 0; d < ndev; ++d)
      NCCL_CALL(ncclReduceScatter(grads[d], grad_shard[d], kShard, ncclFloat, ncclSum, comms[d], streams[d]));
    NCCL_CALL(ncclGroupEnd());
    for (int d = 0; d < ndev; ++d) {
      CUDA_CALL(cudaSetDevice(rank * ndev + d));
      momentum<<<(unsigned)((kShard + 255) / 256), 256, 0, streams[d]>>>(velocity[d], weights[d], grad_shard[d],
                                                                         kShard, 0.9f, 1e-3f);
    }
  }
  for (int d = 0; d < ndev; ++d) CUDA_CALL(cudaStreamSynchronize(streams[d]));
  if (rank == 0) printf("20 steps in %.3f s\n", MPI_Wtime() - t0);
  for (int d = 0; d < ndev; ++d) NCCL_CALL(ncclCommDestroy(comms[d]));
  MPI_Finalize();
  return 0;
}
