// A host-driven program written for cuco-kit's importer tests (not a sample): ONE process drives every GPU of
// the machine (ncclCommInitAll). Each GPU holds a shard of the rows of a score matrix; every iteration the
// shards are all-gathered on every GPU (one ncclAllGather per device, in a group) and a row-wise softmax runs on
// the gathered matrix. Arrays indexed by the device hold the communicators, buffers and streams.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#include <nccl.h>

#define CUDACHECK(cmd)                                                                  \
  do {                                                                                  \
    cudaError_t e = cmd;                                                                \
    if (e != cudaSuccess) {                                                             \
      printf("Failed: Cuda error %s:%d '%s'\n", __FILE__, __LINE__, cudaGetErrorString(e)); \
      exit(EXIT_FAILURE);                                                               \
    }                                                                                   \
  } while (0)
#define NCCLCHECK(cmd)                                                                  \
  do {                                                                                  \
    ncclResult_t r = cmd;                                                               \
    if (r != ncclSuccess) {                                                             \
      printf("Failed, NCCL error %s:%d '%s'\n", __FILE__, __LINE__, ncclGetErrorString(r)); \
      exit(EXIT_FAILURE);                                                               \
    }                                                                                   \
  } while (0)

static const int kMaxDevices = 8;
static const int kRowsPerDevice = 128;
static const int kCols = 2048;
static const int kIters = 10;

// out[r, :] = softmax(in[r, :]); one block per row
__global__ void softmax_rows(const float* in, float* out, int rows, int cols) {
  __shared__ float red[256];
  const int r = blockIdx.x;
  if (r >= rows) return;
  const float* x = in + (size_t)r * cols;
  float m = -INFINITY;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, x[c]);
  red[threadIdx.x] = m;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + s]);
    __syncthreads();
  }
  m = red[0];
  __syncthreads();
  float sum = 0.f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) sum += expf(x[c] - m);
  red[threadIdx.x] = sum;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) red[threadIdx.x] += red[threadIdx.x + s];
    __syncthreads();
  }
  for (int c = threadIdx.x; c < cols; c += blockDim.x) out[(size_t)r * cols + c] = expf(x[c] - m) / red[0];
}

__global__ void fill_scores(float* p, size_t n, int device) {
  const size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n) p[i] = sinf(0.001f * (float)i + device);
}

int main(int argc, char* argv[]) {
  int ndev = 0;
  CUDACHECK(cudaGetDeviceCount(&ndev));
  if (ndev > kMaxDevices) ndev = kMaxDevices;
  int devs[kMaxDevices];
  for (int d = 0; d < ndev; ++d) devs[d] = d;
  ncclComm_t comms[kMaxDevices];
  NCCLCHECK(ncclCommInitAll(comms, ndev, devs));

  const size_t shard_elems = (size_t)kRowsPerDevice * kCols;
  float* shard[kMaxDevices];
  float* scores[kMaxDevices];
  float* probs[kMaxDevices];
  cudaStream_t streams[kMaxDevices];
  for (int d = 0; d < ndev; ++d) {
    CUDACHECK(cudaSetDevice(d));
    CUDACHECK(cudaMalloc(&shard[d], shard_elems * sizeof(float)));
    CUDACHECK(cudaMalloc(&scores[d], shard_elems * ndev * sizeof(float)));
    CUDACHECK(cudaMalloc(&probs[d], shard_elems * ndev * sizeof(float)));
    CUDACHECK(cudaStreamCreate(&streams[d]));
    fill_scores<<<(unsigned)((shard_elems + 255) / 256), 256, 0, streams[d]>>>(shard[d], shard_elems, d);
  }

  for (int it = 0; it < kIters; ++it) {
    NCCLCHECK(ncclGroupStart());
    for (int d = 0; d < ndev; ++d)
      NCCLCHECK(ncclAllGather(shard[d], scores[d], shard_elems, ncclFloat, comms[d], streams[d]));
    NCCLCHECK(ncclGroupEnd());
    for (int d = 0; d < ndev; ++d) {
      CUDACHECK(cudaSetDevice(d));
      softmax_rows<<<kRowsPerDevice * ndev, 256, 0, streams[d]>>>(scores[d], probs[d], kRowsPerDevice * ndev, kCols);
    }
  }
  for (int d = 0; d < ndev; ++d) {
    CUDACHECK(cudaSetDevice(d));
    CUDACHECK(cudaStreamSynchronize(streams[d]));
  }
  printf("softmax over %d gathered shards: done\n", ndev);

  for (int d = 0; d < ndev; ++d) {
    CUDACHECK(cudaSetDevice(d));
    CUDACHECK(cudaFree(shard[d]));
    CUDACHECK(cudaFree(scores[d]));
    CUDACHECK(cudaFree(probs[d]));
    ncclCommDestroy(comms[d]);
  }
  return 0;
}
