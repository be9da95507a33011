// A host-driven program written for cuco-kit's importer tests (not a sample): one step of sharded SGD, as in
// ZeRO stage 1. The gradients are reduce-scattered so that each rank owns one shard of them, the rank updates
// its shard of the fp32 master parameters, and the updated shards are all-gathered into the full parameters.
// The step is a helper, run by a warm-up loop and then by a timed loop; the sizes come from the command line
// and the environment; per-step host timings are reduced over the ranks with MPI and printed by rank 0.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#define CUDA_OK(x)                                                                        \
  do {                                                                                    \
    cudaError_t e_ = (x);                                                                 \
    if (e_ != cudaSuccess) {                                                              \
      fprintf(stderr, "cuda error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(1);                                                                       \
    }                                                                                     \
  } while (0)
#define NCCL_OK(x)                                                                        \
  do {                                                                                    \
    ncclResult_t r_ = (x);                                                                \
    if (r_ != ncclSuccess) {                                                              \
      fprintf(stderr, "nccl error %s at %s:%d\n", ncclGetErrorString(r_), __FILE__, __LINE__); \
      std::exit(1);                                                                       \
    }                                                                                     \
  } while (0)

// param_shard -= lr * grad_shard / world (the reduce-scatter summed the ranks' gradients)
__global__ void sgd_update(float* param_shard, const float* grad_shard, float lr, float inv_world, size_t n) {
  const size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n) param_shard[i] -= lr * grad_shard[i] * inv_world;
}

__global__ void init_values(float* p, size_t n, float base, float step) {
  const size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n) p[i] = base + step * (float)(i % 1024);
}

static void train_step(const float* grads, float* grad_shard, float* param_shard, float* params, size_t shard,
                       float lr, int world, ncclComm_t comm, cudaStream_t stream) {
  NCCL_OK(ncclReduceScatter(grads, grad_shard, shard, ncclFloat, ncclSum, comm, stream));
  const int threads = 512;
  sgd_update<<<(unsigned)((shard + threads - 1) / threads), threads, 0, stream>>>(param_shard, grad_shard, lr,
                                                                                   1.0f / world, shard);
  NCCL_OK(ncclAllGather(param_shard, params, shard, ncclFloat, comm, stream));
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, world;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);

  // sizes: the parameter count from argv[1] (default 2^24), iterations from argv[2], warm-up from $WARMUP
  const size_t n_params = argc > 1 ? strtoull(argv[1], nullptr, 10) : (size_t)1 << 24;
  const int iters = argc > 2 ? atoi(argv[2]) : 20;
  const char* warm_env = getenv("WARMUP");
  const int warmup = warm_env ? atoi(warm_env) : 5;
  if (n_params % world != 0) {
    if (rank == 0) fprintf(stderr, "the parameter count must be a multiple of the world size\n");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  const size_t shard = n_params / world;
  const float lr = 1e-3f;

  CUDA_OK(cudaSetDevice(rank));
  ncclUniqueId uid;
  if (rank == 0) NCCL_OK(ncclGetUniqueId(&uid));
  MPI_Bcast(&uid, sizeof(uid), MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, world, uid, rank));
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));

  float *grads, *grad_shard, *param_shard, *params;
  CUDA_OK(cudaMalloc(&grads, n_params * sizeof(float)));
  CUDA_OK(cudaMalloc(&grad_shard, shard * sizeof(float)));
  CUDA_OK(cudaMalloc(&param_shard, shard * sizeof(float)));
  CUDA_OK(cudaMalloc(&params, n_params * sizeof(float)));
  init_values<<<(unsigned)((n_params + 255) / 256), 256, 0, stream>>>(grads, n_params, 0.01f * (rank + 1), 1e-4f);
  init_values<<<(unsigned)((shard + 255) / 256), 256, 0, stream>>>(param_shard, shard, 1.0f, 0.f);
  CUDA_OK(cudaStreamSynchronize(stream));

  for (int i = 0; i < warmup; ++i) train_step(grads, grad_shard, param_shard, params, shard, lr, world, comm, stream);
  CUDA_OK(cudaStreamSynchronize(stream));
  MPI_Barrier(MPI_COMM_WORLD);

  std::vector<double> step_ms(iters);
  for (int i = 0; i < iters; ++i) {
    const double t0 = MPI_Wtime();
    train_step(grads, grad_shard, param_shard, params, shard, lr, world, comm, stream);
    CUDA_OK(cudaStreamSynchronize(stream));
    step_ms[i] = 1e3 * (MPI_Wtime() - t0);
  }
  std::sort(step_ms.begin(), step_ms.end());
  double median = step_ms[iters / 2], worst = 0;
  MPI_Reduce(&median, &worst, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  if (rank == 0) printf("sharded SGD step: %.3f ms (median, slowest rank), %zu parameters, %d ranks\n", worst,
                        n_params, world);

  CUDA_OK(cudaFree(grads));
  CUDA_OK(cudaFree(grad_shard));
  CUDA_OK(cudaFree(param_shard));
  CUDA_OK(cudaFree(params));
  NCCL_OK(ncclCommDestroy(comm));
  MPI_Finalize();
  return 0;
}
