// A host-driven program written for cuco-kit's importer tests (not a sample): a tensor-parallel MLP block, one
// process per GPU. Rank r holds a column slice of W1 and the matching row slice of W2, so
//   h = gelu(x W1_r),  y = sum over ranks of (h W2_r)  (an all-reduce),  out = y + x.
// The step lives in helper functions: main()'s loop calls forward(), which calls mlp_partial() (two kernels)
// and reduce_output() (the all-reduce, in place). Timing with CUDA events and a printf surround the loop.
// Built the usual way: mpicxx + nvcc, one process per GPU.
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#define CUDA_TRY(call)                                                                 \
  do {                                                                                 \
    cudaError_t err_ = (call);                                                         \
    if (err_ != cudaSuccess) {                                                         \
      fprintf(stderr, "%s:%d CUDA: %s\n", __FILE__, __LINE__, cudaGetErrorString(err_)); \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                    \
    }                                                                                  \
  } while (0)
#define NCCL_TRY(call)                                                                 \
  do {                                                                                 \
    ncclResult_t res_ = (call);                                                        \
    if (res_ != ncclSuccess) {                                                         \
      fprintf(stderr, "%s:%d NCCL: %s\n", __FILE__, __LINE__, ncclGetErrorString(res_)); \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                    \
    }                                                                                  \
  } while (0)

constexpr int kTokens = 256;
constexpr int kHidden = 1024;
constexpr int kFfn = 4096;  // the full FFN width: every rank holds kFfn / world of it

// h[m, n] = gelu(sum_k x[m, k] w[k, n])
__global__ void matmul_gelu(const float* x, const float* w, float* h, int m, int n, int k) {
  const int row = blockIdx.y * blockDim.y + threadIdx.y;
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= m || col >= n) return;
  float acc = 0.f;
  for (int i = 0; i < k; ++i) acc += x[(size_t)row * k + i] * w[(size_t)i * n + col];
  h[(size_t)row * n + col] = 0.5f * acc * (1.f + tanhf(0.7978845608f * (acc + 0.044715f * acc * acc * acc)));
}

// y[m, n] = sum_k h[m, k] w[k, n]
__global__ void matmul(const float* h, const float* w, float* y, int m, int n, int k) {
  const int row = blockIdx.y * blockDim.y + threadIdx.y;
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= m || col >= n) return;
  float acc = 0.f;
  for (int i = 0; i < k; ++i) acc += h[(size_t)row * k + i] * w[(size_t)i * n + col];
  y[(size_t)row * n + col] = acc;
}

__global__ void add_residual(const float* y, const float* x, float* out, size_t n) {
  const size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n) out[i] = y[i] + x[i];
}

// This rank's partial output: y_partial = gelu(x W1_r) W2_r.
static void mlp_partial(const float* x, const float* w1, const float* w2, float* h, float* y_partial,
                        int ffn_local, cudaStream_t stream) {
  const dim3 block(16, 16);
  const dim3 grid_up((ffn_local + 15) / 16, (kTokens + 15) / 16);
  matmul_gelu<<<grid_up, block, 0, stream>>>(x, w1, h, kTokens, ffn_local, kHidden);
  const dim3 grid_down((kHidden + 15) / 16, (kTokens + 15) / 16);
  matmul<<<grid_down, block, 0, stream>>>(h, w2, y_partial, kTokens, kHidden, ffn_local);
}

static void reduce_output(float* partial, size_t count, ncclComm_t comm, cudaStream_t stream) {
  NCCL_TRY(ncclAllReduce(partial, partial, count, ncclFloat, ncclSum, comm, stream));
}

static void forward(const float* x, const float* w1, const float* w2, float* h, float* y, float* out,
                    int ffn_local, ncclComm_t comm, cudaStream_t stream) {
  mlp_partial(x, w1, w2, h, y, ffn_local, stream);
  const size_t n = (size_t)kTokens * kHidden;
  reduce_output(y, n, comm, stream);
  add_residual<<<(n + 255) / 256, 256, 0, stream>>>(y, x, out, n);
}

// Deterministic host data, different per rank, copied to the device (set-up only).
static void fill_from_host(float* device, size_t count, int rank, float scale) {
  std::vector<float> host(count);
  for (size_t i = 0; i < count; ++i) host[i] = scale * (float)(((i + 7 * rank) * 2654435761u) % 997) / 997.f;
  CUDA_TRY(cudaMemcpy(device, host.data(), count * sizeof(float), cudaMemcpyHostToDevice));
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  int devices = 0;
  CUDA_TRY(cudaGetDeviceCount(&devices));
  CUDA_TRY(cudaSetDevice(rank % devices));
  ncclUniqueId id;
  if (rank == 0) NCCL_TRY(ncclGetUniqueId(&id));
  MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t comm;
  NCCL_TRY(ncclCommInitRank(&comm, world, id, rank));
  cudaStream_t stream;
  CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  const int ffn_local = kFfn / world;
  float *x, *w1, *w2, *h, *y, *out;
  CUDA_TRY(cudaMalloc(&x, (size_t)kTokens * kHidden * sizeof(float)));
  CUDA_TRY(cudaMalloc(&w1, (size_t)kHidden * ffn_local * sizeof(float)));
  CUDA_TRY(cudaMalloc(&w2, (size_t)ffn_local * kHidden * sizeof(float)));
  CUDA_TRY(cudaMalloc(&h, (size_t)kTokens * ffn_local * sizeof(float)));
  CUDA_TRY(cudaMalloc(&y, (size_t)kTokens * kHidden * sizeof(float)));
  CUDA_TRY(cudaMalloc(&out, (size_t)kTokens * kHidden * sizeof(float)));
  fill_from_host(x, (size_t)kTokens * kHidden, 0, 1.f);
  fill_from_host(w1, (size_t)kHidden * ffn_local, rank, 0.05f);
  fill_from_host(w2, (size_t)ffn_local * kHidden, rank, 0.05f);

  cudaEvent_t start, stop;
  CUDA_TRY(cudaEventCreate(&start));
  CUDA_TRY(cudaEventCreate(&stop));
  const int iters = 50;
  CUDA_TRY(cudaEventRecord(start, stream));
  for (int it = 0; it < iters; ++it) {
    forward(x, w1, w2, h, y, out, ffn_local, comm, stream);
  }
  CUDA_TRY(cudaEventRecord(stop, stream));
  CUDA_TRY(cudaEventSynchronize(stop));
  float ms = 0.f;
  CUDA_TRY(cudaEventElapsedTime(&ms, start, stop));
  if (rank == 0) printf("tensor-parallel MLP: %.3f ms per step on %d ranks\n", ms / iters, world);

  CUDA_TRY(cudaEventDestroy(start));
  CUDA_TRY(cudaEventDestroy(stop));
  CUDA_TRY(cudaFree(x));
  CUDA_TRY(cudaFree(w1));
  CUDA_TRY(cudaFree(w2));
  CUDA_TRY(cudaFree(h));
  CUDA_TRY(cudaFree(y));
  CUDA_TRY(cudaFree(out));
  NCCL_TRY(ncclCommDestroy(comm));
  MPI_Finalize();
  return 0;
}
