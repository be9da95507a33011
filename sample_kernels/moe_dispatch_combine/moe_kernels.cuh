// moe_kernels.cuh — the kernels every moe_dispatch_combine source shares: routing counts, the exclusive scan of
// per-expert counts, gathering token rows into per-expert send order, SwiGLU, and the weighted combine.
//
// The seeds and the device-initiated baseline #include it: build.for_workload puts a workload's folder on the
// include path when it ships *.cuh headers and hashes them into the build cache key. For the search it is
// frozen library code (outside every candidate's EVOLVE blocks); what differs between the sources — how rows
// travel and who waits for what — stays in each source.
#ifndef MOE_KERNELS_CUH_
#define MOE_KERNELS_CUH_

#include <cuda_bf16.h>
#include <stdint.h>

namespace moe_kernels {

constexpr int kWarpSize = 32;  // threads per warp on every NVIDIA GPU the kit targets

__global__ void count_experts(const int* idx, int n, int E, int* counts) {
  for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < n; j += gridDim.x * blockDim.x) {
    const int e = idx[j];
    if (e >= 0 && e < E) atomicAdd(&counts[e], 1);
  }
}

// send_off = exclusive prefix of counts (E <= kMaxExperts: one thread is fast enough), fill = 0.
__global__ void scan_counts(const int* counts, int E, int* send_off, int* fill) {
  if (threadIdx.x == 0) {
    int acc = 0;
    for (int e = 0; e < E; ++e) {
      send_off[e] = acc;
      acc += counts[e];
    }
    send_off[E] = acc;
  }
  for (int e = threadIdx.x; e < E; e += blockDim.x) fill[e] = 0;
}

// One warp per assignment j = t*K + k: lane 0 claims the next free row of its expert, the warp copies x[t].
// An expert id outside [0, E) gets pos -1 and is dropped (inputs never hold one for a valid token).
__global__ void gather_rows(const uint4* x, const int* idx, int n, int K, int E, int row_vecs, const int* send_off,
                            int* fill, int* pos, uint4* send) {
  const int lane = threadIdx.x % kWarpSize;
  const int n_warps = gridDim.x * (blockDim.x / kWarpSize);
  for (int j = (blockIdx.x * blockDim.x + threadIdx.x) / kWarpSize; j < n; j += n_warps) {
    const int e = idx[j];
    int p = -1;
    if (lane == 0 && e >= 0 && e < E) p = send_off[e] + atomicAdd(&fill[e], 1);
    p = __shfl_sync(0xffffffffu, p, 0);
    if (lane == 0) pos[j] = p;
    if (p < 0) continue;
    const uint4* src = x + (size_t)(j / K) * row_vecs;
    uint4* dst = send + (size_t)p * row_vecs;
    for (int v = lane; v < row_vecs; v += kWarpSize) dst[v] = src[v];
  }
}

__global__ void swiglu(const __nv_bfloat16* gu, size_t rows, int I, __nv_bfloat16* act) {
  const size_t n = rows * (size_t)I;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const size_t r = i / I, c = i - r * I;
    const float g = __bfloat162float(gu[r * 2 * I + c]);
    const float u = __bfloat162float(gu[r * 2 * I + I + c]);
    act[i] = __float2bfloat16(g / (1.0f + __expf(-g)) * u);
  }
}

// y[t] = sum_k w[t, k] * ret[pos[t*K + k]], fp32 accumulation; a CTA per token, threads over 16-byte vectors.
__global__ void combine(const uint4* ret, const int* pos, const float* w, int Tr, int K, int row_vecs, uint4* y) {
  for (int t = blockIdx.x; t < Tr; t += gridDim.x) {
    for (int v = threadIdx.x; v < row_vecs; v += blockDim.x) {
      float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
      for (int k = 0; k < K; ++k) {
        const int p = pos[t * K + k];
        if (p < 0) continue;
        const float wk = w[t * K + k];
        const uint4 q = ret[(size_t)p * row_vecs + v];
        const __nv_bfloat16* b = (const __nv_bfloat16*)&q;
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[i] += wk * __bfloat162float(b[i]);
      }
      uint4 o;
      __nv_bfloat16* ob = (__nv_bfloat16*)&o;
#pragma unroll
      for (int i = 0; i < 8; ++i) ob[i] = __float2bfloat16(acc[i]);
      y[(size_t)t * row_vecs + v] = o;
    }
  }
}

}  // namespace moe_kernels

#endif  // MOE_KERNELS_CUH_
