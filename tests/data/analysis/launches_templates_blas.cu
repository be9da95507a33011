// Launch configurations with 2, 3 and 4 arguments, template kernels, cuBLAS compute and two streams.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include "cuco_abi.h"

template <typename T, int kBlock>
__global__ void __launch_bounds__(256) fill(T* dst, T value, size_t n) {
  size_t i = blockIdx.x * (size_t)kBlock + threadIdx.x;
  if (i < n) dst[i] = value;
}

__global__ void scale(float* x, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= a;
}

template <typename T>
__global__ void accumulate(const T* src, T* dst, int n);

struct State {
  cudaStream_t comm_stream;
  cudaEvent_t ready;
};

CUCO_EXPORT int cuco_step(cuco_ctx_t* ctx) {
  cuco_tensor_t* a_t = cuco_tensor(ctx, "A");
  auto* a = (__nv_bfloat16*)a_t->local;
  __nv_bfloat16* w = reinterpret_cast<__nv_bfloat16*>(ctx->tensors[1].local);
  auto* y = (__nv_bfloat16*)ctx->tensors[2].local;
  float* tmp = (float*)ctx->scratch[0].local;
  State* st = (State*)ctx->user;
  cudaStream_t s = ctx->stream;
  cublasHandle_t h = (cublasHandle_t)ctx->cublas;
  const int n = 1 << 20;
  const float alpha = 1.0f, beta = 0.0f;
  fill<__nv_bfloat16, 256><<<n / 256, 256>>>(a, __float2bfloat16(0.f), n);
  scale<<<dim3(n / 256), dim3(256), 0>>>(tmp, 2.0f, n);
  accumulate<float><<<n / 256, 256, 0, st->comm_stream>>>(tmp, tmp, n);
  cudaEventRecord(st->ready, st->comm_stream);
  cudaStreamWaitEvent(s, st->ready, 0);
  cublasSetStream(h, s);
  cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha,
               w, CUDA_R_16BF, n,
               a, CUDA_R_16BF, n, &beta,
               y, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  return 0;
}
