// Overlap on two streams: the GEMM-side kernel on `compute`, the collective on `comm_s`. The producer's result
// reaches the collective through an event; the consumer is NOT ordered after the collective (a deliberate race).
#include <nccl.h>

__global__ void gemm_tile(const float* a, float* c, int n) { c[threadIdx.x] = a[threadIdx.x] * n; }
__global__ void epilogue(const float* gathered, float* out, int n) { out[threadIdx.x] = gathered[threadIdx.x]; }

static void launch_gemm(const float* in, float* out, int n, cudaStream_t stream) {
  gemm_tile<<<n / 128, 128, 0, stream>>>(in, out, n);
}

void step(ncclComm_t comm, float* x, float* partial, float* full, float* y, int n, cudaStream_t compute,
          cudaStream_t comm_s, cudaEvent_t done) {
  launch_gemm(x, partial, n, compute);
  cudaEventRecord(done, compute);
  cudaStreamWaitEvent(comm_s, done, 0);
  ncclAllGather(partial, full, n, ncclFloat, comm, comm_s);
  epilogue<<<n / 128, 128, 0, compute>>>(full, y, n);
  cudaDeviceSynchronize();
  epilogue<<<n / 128, 128, 0, compute>>>(full, y, n);
}
