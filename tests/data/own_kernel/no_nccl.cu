// A CUDA program with no NCCL at all: the importer has nothing to port.
#include <cuda_runtime.h>
__global__ void scale(float* x, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] *= 2.f; }
int main() {
  float* x;
  cudaMalloc(&x, 1024 * sizeof(float));
  scale<<<4, 256>>>(x, 1024);
  cudaDeviceSynchronize();
  cudaFree(x);
  return 0;
}
