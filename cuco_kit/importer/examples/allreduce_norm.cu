// A host-driven test program (written for cuco-kit's importer tests, not a sample): every rank holds a partial
// sum of activations; an all-reduce adds them up and an RMS normalisation with a learned scale follows.
// Built the usual way: mpicxx + nvcc, one process per GPU.
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#define CUDACHECK(cmd)                                                        \
  do {                                                                        \
    cudaError_t e = (cmd);                                                    \
    if (e != cudaSuccess) {                                                   \
      fprintf(stderr, "CUDA error %s:%d %s\n", __FILE__, __LINE__,            \
              cudaGetErrorString(e));                                         \
      exit(1);                                                                \
    }                                                                         \
  } while (0)
#define NCCLCHECK(cmd)                                                        \
  do {                                                                        \
    ncclResult_t r = (cmd);                                                   \
    if (r != ncclSuccess) {                                                   \
      fprintf(stderr, "NCCL error %s:%d %s\n", __FILE__, __LINE__,            \
              ncclGetErrorString(r));                                         \
      exit(1);                                                                \
    }                                                                         \
  } while (0)

constexpr int kRows = 512;
constexpr int kCols = 1024;
constexpr int kSteps = 10;

// y[r, :] = x[r, :] / rms(x[r, :]) * gamma; one block per row.
__global__ void rms_norm(const float* x, const float* gamma, float* y, int rows, int cols, float eps) {
  __shared__ float partial[256];
  const int row = blockIdx.x;
  if (row >= rows) return;
  float acc = 0.f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    const float v = x[(size_t)row * cols + c];
    acc += v * v;
  }
  partial[threadIdx.x] = acc;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  const float inv = rsqrtf(partial[0] / cols + eps);
  for (int c = threadIdx.x; c < cols; c += blockDim.x)
    y[(size_t)row * cols + c] = x[(size_t)row * cols + c] * inv * gamma[c];
}

__global__ void fill(float* p, size_t n, float scale) {
  const size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n) p[i] = scale * (float)((i * 2654435761u) % 1000) / 1000.f;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, nranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  ncclUniqueId id;
  if (rank == 0) NCCLCHECK(ncclGetUniqueId(&id));
  MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
  CUDACHECK(cudaSetDevice(rank));
  ncclComm_t comm;
  NCCLCHECK(ncclCommInitRank(&comm, nranks, id, rank));
  cudaStream_t stream;
  CUDACHECK(cudaStreamCreate(&stream));

  const size_t n = (size_t)kRows * kCols;
  const float eps = 1e-6f;
  float* partial_sums;
  float* summed;
  float* gamma;
  float* normed;
  CUDACHECK(cudaMalloc(&partial_sums, n * sizeof(float)));
  CUDACHECK(cudaMalloc(&summed, n * sizeof(float)));
  CUDACHECK(cudaMalloc(&gamma, kCols * sizeof(float)));
  CUDACHECK(cudaMalloc(&normed, n * sizeof(float)));
  fill<<<(n + 255) / 256, 256, 0, stream>>>(partial_sums, n, 1.0f + rank);
  fill<<<(kCols + 255) / 256, 256, 0, stream>>>(gamma, kCols, 1.0f);

  for (int step = 0; step < kSteps; ++step) {
    NCCLCHECK(ncclAllReduce(partial_sums, summed, n, ncclFloat, ncclSum, comm, stream));
    rms_norm<<<kRows, 256, 0, stream>>>(summed, gamma, normed, kRows, kCols, eps);
  }
  CUDACHECK(cudaStreamSynchronize(stream));
  if (rank == 0) printf("done\n");

  CUDACHECK(cudaFree(partial_sums));
  CUDACHECK(cudaFree(summed));
  CUDACHECK(cudaFree(gamma));
  CUDACHECK(cudaFree(normed));
  ncclCommDestroy(comm);
  MPI_Finalize();
  return 0;
}
