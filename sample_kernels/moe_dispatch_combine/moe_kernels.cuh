// moe_kernels.cuh — the kernels every moe_dispatch_combine source shares: routing counts, the exclusive scan of
// per-expert counts, gathering token rows into per-expert send order, the block-scaled e4m3 wire format of
// dispatched rows (FP8=1), SwiGLU, and the weighted combine with its bf16x8 accumulate / pack helpers (which the
// device-initiated source's combine loops call too).
//
// The seeds and the device-initiated baseline #include it: build.for_workload puts a workload's folder on the
// include path when it ships *.cuh headers and hashes them into the build cache key. For the search it is
// frozen library code (outside every candidate's EVOLVE blocks); what differs between the sources — how rows
// travel and who waits for what — stays in each source.
#ifndef MOE_KERNELS_CUH_
#define MOE_KERNELS_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
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

// ---- dispatch wire format -------------------------------------------------------------------------------------
// A dispatched token row travels as a WIRE row. FP8=0: the bf16 row itself (2H bytes). FP8=1: H e4m3 bytes,
// then H / kFp8Block fp32 scales, one per block of kFp8Block consecutive elements, with
// scale = amax(|block|) / kE4m3Max (1 for an all-zero block) and q = e4m3(x / scale), round to nearest even.
// Every routed row is encoded, own rows included, and computed on as bf16(float(q) * scale), so every rank sees
// the same numbers whatever the placement; workload.fp8_roundtrip is the same arithmetic in torch.
constexpr int kFp8Block = 128;       // elements per scale (DeepSeek-V3's activation blocks)
constexpr float kE4m3Max = 448.0f;   // largest finite e4m3 value
constexpr int kFp8RowAlign = 512;    // H % 512 == 0 keeps a wire row (H + H/32 bytes) whole 16-byte vectors
constexpr int kFp8PerLane = kFp8Block / kWarpSize;  // 4 elements, one 32-bit word of e4m3 per lane

__host__ __device__ constexpr size_t wire_row_bytes(int H, bool fp8) {
  return fp8 ? (size_t)H + (size_t)(H / kFp8Block) * sizeof(float) : (size_t)H * sizeof(__nv_bfloat16);
}

// 0 or 1 for the FP8 parameter (absent = 0), -1 when the value or H cannot be used.
inline int fp8_mode(int64_t fp8_param, int64_t H) {
  if (fp8_param == -1 || fp8_param == 0) return 0;
  if (fp8_param != 1 || H % kFp8RowAlign != 0) return -1;
  return 1;
}

// One warp per (row, block): each lane holds kFp8PerLane consecutive elements, the block's amax by shuffles.
__global__ void quantize_rows(const __nv_bfloat16* src, int rows, int H, uint8_t* wire) {
  const int lane = threadIdx.x % kWarpSize;
  const int blocks = H / kFp8Block;
  const size_t row_bytes = wire_row_bytes(H, true);
  const long long n = (long long)rows * blocks;
  const long long warps = (long long)gridDim.x * (blockDim.x / kWarpSize);
  for (long long b = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / kWarpSize; b < n; b += warps) {
    const long long r = b / blocks;
    const int c = (int)(b - r * blocks);
    const int col = c * kFp8Block + lane * kFp8PerLane;
    const __nv_bfloat16* s = src + r * H + col;
    float v[kFp8PerLane];
    float amax = 0.f;
#pragma unroll
    for (int i = 0; i < kFp8PerLane; ++i) {
      v[i] = __bfloat162float(s[i]);
      amax = fmaxf(amax, fabsf(v[i]));
    }
#pragma unroll
    for (int o = kWarpSize / 2; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float scale = amax > 0.f ? amax / kE4m3Max : 1.f;
    uint8_t* row = wire + r * row_bytes;
    uint32_t packed = 0;
#pragma unroll
    for (int i = 0; i < kFp8PerLane; ++i)
      packed |= (uint32_t)__nv_cvt_float_to_fp8(v[i] / scale, __NV_SATFINITE, __NV_E4M3) << (8 * i);
    *(uint32_t*)(row + col) = packed;
    if (lane == 0) ((float*)(row + H))[c] = scale;
  }
}

// dst row r = bf16(float(q) * scale) of wire row r; a thread per kFp8PerLane elements.
__global__ void dequantize_rows(const uint8_t* wire, int rows, int H, __nv_bfloat16* dst) {
  const size_t row_bytes = wire_row_bytes(H, true);
  const int words = H / kFp8PerLane;
  const long long n = (long long)rows * words;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    const long long r = i / words;
    const int col = (int)(i - r * words) * kFp8PerLane;
    const uint8_t* row = wire + r * row_bytes;
    const float scale = ((const float*)(row + H))[col / kFp8Block];
    const uint32_t packed = *(const uint32_t*)(row + col);
#pragma unroll
    for (int k = 0; k < kFp8PerLane; ++k) {
      const __half h(__nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)((packed >> (8 * k)) & 0xffu), __NV_E4M3));
      dst[r * H + col + k] = __float2bfloat16(__half2float(h) * scale);  // e4m3 -> fp16 -> fp32 is exact
    }
  }
}

// The bf16 dispatch rows the gather writes and the GEMMs read: with FP8=0 the send / recv windows themselves
// (they hold bf16 wire rows), with FP8=1 two local buffers of send_bytes / recv_bytes beside the wire windows.
inline cudaError_t bf16_dispatch_rows(bool fp8, void* send_win, void* recv_win, size_t send_bytes, size_t recv_bytes,
                                      __nv_bfloat16*& send, __nv_bfloat16*& recv) {
  if (!fp8) {
    send = (__nv_bfloat16*)send_win;
    recv = (__nv_bfloat16*)recv_win;
    return cudaSuccess;
  }
  const cudaError_t e = cudaMalloc(&send, send_bytes);
  return e != cudaSuccess ? e : cudaMalloc(&recv, recv_bytes);
}

// Frees what bf16_dispatch_rows allocated (nothing with FP8=0).
inline void free_bf16_dispatch_rows(bool fp8, __nv_bfloat16* send, __nv_bfloat16* recv) {
  if (!fp8) return;
  cudaFree(send);
  cudaFree(recv);
}

// FP8=1 before any row moves: send rows [0, rows) encoded into send_wire, and send rewritten with what they
// decode to (the own rows' GEMMs read send). Not called with FP8=0, where send_wire is send.
inline cudaError_t fp8_encode_send(__nv_bfloat16* send, uint8_t* send_wire, int rows, int H, int grid, int threads,
                                   cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  quantize_rows<<<grid, threads, 0, stream>>>(send, rows, H, send_wire);
  dequantize_rows<<<grid, threads, 0, stream>>>(send_wire, rows, H, send);
  return cudaGetLastError();
}

// FP8=1 once rows have arrived: wire rows [0, rows) of recv_wire decoded into recv for the expert GEMMs.
inline cudaError_t fp8_decode_recv(const uint8_t* recv_wire, int rows, int H, __nv_bfloat16* recv, int grid,
                                   int threads, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  dequantize_rows<<<grid, threads, 0, stream>>>(recv_wire, rows, H, recv);
  return cudaGetLastError();
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

// One 16-byte vector of 8 bf16 in the combine loops: acc[i] += wk * q[i] in fp32, and acc rounded back to bf16.
// q by value, so the caller's load stays one 16-byte load.
__device__ __forceinline__ void bf16x8_accumulate(float (&acc)[8], float wk, uint4 q) {
  const __nv_bfloat16* b = (const __nv_bfloat16*)&q;
#pragma unroll
  for (int i = 0; i < 8; ++i) acc[i] += wk * __bfloat162float(b[i]);
}

__device__ __forceinline__ uint4 bf16x8_pack(const float (&acc)[8]) {
  uint4 o;
  __nv_bfloat16* ob = (__nv_bfloat16*)&o;
#pragma unroll
  for (int i = 0; i < 8; ++i) ob[i] = __float2bfloat16(acc[i]);
  return o;
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
        bf16x8_accumulate(acc, wk, q);
      }
      y[(size_t)t * row_vecs + v] = bf16x8_pack(acc);
    }
  }
}

}  // namespace moe_kernels

#endif  // MOE_KERNELS_CUH_
