// Produce -> AllGather -> consume on one stream, plus names that must not count:
// ncclAllReduce(a, b, n, ncclFloat, ncclSum, comm, stream) in a line comment.
/* ncclBroadcast(x, y, n, ncclFloat, 0, comm, s);
   scale<<<1, 1>>>(x, 2); in a block comment */
#include <cuda_runtime.h>
#include <nccl.h>

#define NCCLCHECK(cmd) do { ncclResult_t r_ = (cmd); if (r_ != ncclSuccess) return 3; } while (0)
#define CUDA_CHECK(cmd) do { if ((cmd) != cudaSuccess) return 2; } while (0)
#define HIDDEN_ALLREDUCE(b) ncclAllReduce(b, b, 1, ncclFloat, ncclSum, comm, s)

__global__ void produce(float* __restrict__ out, const float* __restrict__ in, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = 2.0f * in[i];
}

__global__ void consume(const float* gathered, float* result, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  float* dst = result + i;
  if (i < n) *dst = gathered[i] + 1.0f;
}

int run(ncclComm_t comm, int nranks, int n) {
  const char* banner = "ncclAllGather(send, recv, n, ncclFloat, comm, s) is only text";
  float *input, *send, *recv, *result;
  cudaStream_t s;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CUDA_CHECK(cudaMalloc(&input, n * sizeof(float)));
  CUDA_CHECK(cudaMalloc((void**)&send, n * sizeof(float)));
  NCCLCHECK(ncclMemAlloc((void**)&recv, (size_t)nranks * n * sizeof(float)));
  CUDA_CHECK(cudaMallocAsync(&result, nranks * n * sizeof(float), s));
  produce<<<(n + 255) / 256, 256, 0, s>>>(send, input, n);
  NCCLCHECK(ncclAllGather(send,
                          recv,
                          n, ncclFloat,
                          comm, s));
  consume<<<(nranks * n + 255) / 256, 256, 0, s>>>(recv, result, nranks * n);
  CUDA_CHECK(cudaStreamSynchronize(s));
  (void)banner;
  return 0;
}
