// moe_host.cuh — host code every moe_dispatch_combine source shares: the layer on one rank (moe_host::Layer) as
// the candidate ABI hands it over, and the steps that do not depend on how rows travel.
//
//   declare_windows          cuco_declare_scratch's body: the five scratch windows and their sizes
//   Layer::open / close      check parameters, tensors and windows; allocate / free the workspace
//   Layer::read_valid_rows   this step's token count T_r (x's valid bytes)
//   Layer::route             count rows per expert, scan, gather token rows into send (FP8=1: encode them)
//   Layer::build_plan        from the [W, E] counts on the host: every source's send offsets and every rank's
//                            recv rows (cnt / off / rrow read them back)
//   Layer::expert_own / expert_arrived / expert_mlp   one local expert's SwiGLU MLP (cuBLAS) on its rows
//   Layer::decode_arrived_rows, copy_own_outputs, refuse_capture
//   plan_layout(E)           where each list of the device-initiated source's per-step plan starts in its one
//                            int buffer, and the buffer's size
//
// The kernels it launches are moe_kernels.cuh's. What differs between the sources (how rows travel, who waits for
// what) stays in each source. For the search this is frozen library code (on the include path and in the build
// cache key through build.for_workload, outside every candidate's EVOLVE blocks); what EVOLVE blocks call here
// are member functions, which L0's host-call check accepts.
#ifndef MOE_HOST_CUH_
#define MOE_HOST_CUH_

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "cuco_abi.h"
#include "cuco_errors.h"
#include "moe_kernels.cuh"

namespace moe_host {

constexpr int kBf16Bytes = 2;
constexpr int kI32Bytes = 4;
constexpr int kF32Bytes = 4;
constexpr int kVecBytes = 16;  // one uint4: 8 bf16
constexpr int kMaxExperts = 1024;
constexpr int kThreads = 256;   // threads of the grid-stride kernels
constexpr int kCtasPerSm = 4;   // their grid: this many CTAs per SM

// The scratch windows send, recv, out, ret, counts (their layouts: seed_nccl.cu's header), in the order
// workload.scratch_bytes lists them; each source names them in this order.
enum Window { kSend, kRecv, kOut, kRet, kCounts, kWindows };

// The five window sizes for ctx's parameters; false when the parameters cannot be used (setup then refuses).
inline bool window_bytes(const cuco_ctx_t* ctx, size_t (&bytes)[kWindows]) {
  const int64_t T = cuco_param(ctx, "T"), H = cuco_param(ctx, "H"), E = cuco_param(ctx, "E"),
                K = cuco_param(ctx, "K");
  const int64_t W = ctx->world_size;
  if (T <= 0 || H <= 0 || E <= 0 || K <= 0 || W < 1 || E % W != 0) return false;
  const int fp8 = moe_kernels::fp8_mode(cuco_param(ctx, "FP8"), H);
  if (fp8 < 0) return false;
  const size_t cap = (size_t)T * (size_t)std::min<int64_t>(K, E / W);
  const size_t row = (size_t)H * kBf16Bytes;
  const size_t wire = moe_kernels::wire_row_bytes((int)H, fp8 == 1);
  bytes[kSend] = (size_t)T * K * wire;
  bytes[kRecv] = std::max<size_t>(1, (size_t)(W - 1) * cap) * wire;
  bytes[kOut] = (size_t)W * cap * row;
  bytes[kRet] = (size_t)T * K * row;
  bytes[kCounts] = (size_t)W * E * kI32Bytes;
  return true;
}

// cuco_declare_scratch: the windows `names` (in Window order) with their sizes; 0 requests when the parameters
// cannot be used (setup then refuses them).
inline int declare_windows(const cuco_ctx_t* ctx, const char* const (&names)[kWindows], cuco_scratch_request_t* req,
                           int max_req) {
  size_t bytes[kWindows];
  if (max_req < kWindows || !window_bytes(ctx, bytes)) return 0;
  for (int i = 0; i < kWindows; ++i) {
    memset(&req[i], 0, sizeof(req[i]));
    strncpy(req[i].name, names[i], CUCO_NAME_LEN - 1);
    req[i].bytes = bytes[i];
  }
  return kWindows;
}

// Under stream capture the host read of the counts cannot happen. A synchronise on a capturing stream is
// refused and invalidates the capture, so cudaStreamEndCapture fails, the harness notes "cannot be captured"
// and runs the step eagerly; nothing collective was issued before, so the ranks stay in step.
inline int refuse_capture(cudaStream_t stream) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  CUCO_CUDA_TRY(cudaStreamIsCapturing(stream, &st));
  if (st == cudaStreamCaptureStatusNone) return CUCO_OK;
  (void)cudaStreamSynchronize(stream);
  (void)cudaGetLastError();
  return CUCO_ERR_CUDA;
}

// The per-step plan a device-initiated source uploads in one copy, laid out in one int buffer for E experts:
// dispatch segments [E] (kSegmentInts ints each), their chunk prefixes [E + 1], return segments [E], their chunk
// prefixes [E + 1], base rows [E]. Offsets in ints; `ints` is the buffer's size. One definition for the host that
// fills the pinned copy and for the device pointers into the uploaded one, so the two cannot drift apart.
constexpr size_t kSegmentInts = 4;  // a segment: source row, destination rank, destination row, rows
struct PlanLayout {
  size_t disp, disp_chunk0, back, back_chunk0, base_row, ints;
};
constexpr PlanLayout plan_layout(size_t E) {
  const size_t disp = 0;
  const size_t disp_chunk0 = disp + kSegmentInts * E;
  const size_t back = disp_chunk0 + E + 1;
  const size_t back_chunk0 = back + kSegmentInts * E;
  const size_t base_row = back_chunk0 + E + 1;
  return PlanLayout{disp, disp_chunk0, back, back_chunk0, base_row, base_row + E};
}
static_assert(plan_layout(8).back == 5 * 8 + 1 && plan_layout(8).ints == 11 * 8 + 2, "plan lists back to back");

inline bool tensor_ok(const cuco_tensor_t* t, int dtype, size_t bytes) {
  return t != nullptr && t->dtype == dtype && t->local != nullptr && t->capacity_bytes >= bytes;
}

// The layer on one rank. World size W, E experts, EL = E/W per rank (rank q owns experts [q*EL, (q+1)*EL)); T
// token capacity per rank, T_r valid this step; top-K routing; hidden H, expert intermediate I (workload.py).
// Cap = T*min(K, EL) is the most rows one rank can send to one expert rank. A source's State derives from it.
struct Layer {
  int T, H, I, E, K, W, EL, rank, Tr;
  size_t cap;
  int row_vecs;                      // H bf16 in 16-byte vectors
  bool fp8;                          // FP8=1: block-scaled e4m3 wire rows
  size_t wire_row;                   // bytes of one dispatched row
  size_t arrived;                    // rows this rank received this step (build_plan)
  int grid;                          // CTAs of the grid-stride kernels
  const __nv_bfloat16* x;            // [T, H] tokens
  const int* idx;                    // [T, K] expert of each (token, slot)
  const float* w;                    // [T, K] combine weight of each (token, slot)
  const __nv_bfloat16* wgu;          // [EL, H, 2I] own experts: gate columns [0, I), up columns [I, 2I)
  const __nv_bfloat16* wd;           // [EL, I, H] own experts
  __nv_bfloat16* y;                  // [T, H] output
  const cuco_tensor_t* windows[kWindows];
  __nv_bfloat16 *send, *recv, *out, *ret;  // send / recv: bf16 rows (the windows themselves when FP8=0)
  uint8_t *send_wire, *recv_wire;    // the send / recv windows: wire rows
  int* counts;                       // [W, E] window, own row = rank
  int* send_off;                     // [E + 1] device, own send offsets
  int* fill;                         // [E] device
  int* pos;                          // [T * K] device: send row of each assignment (-1: dropped)
  __nv_bfloat16 *gu, *act;           // [W*Cap, 2I], [W*Cap, I] device: the expert MLPs' workspace
  int* host_counts;                  // [W, E] pinned
  std::vector<size_t> offsets;       // [W, E + 1] every source's send offsets
  std::vector<size_t> recv_rows;     // [W, EL, W] row in rank q's recv of (q's expert le, source s)

  // Checks the parameters, tensors and the windows `names` (Window order), and allocates the workspace.
  // CUCO_OK, or the error after which the caller calls close().
  int open(cuco_ctx_t* ctx, const char* const (&names)[kWindows]) {
    if (ctx->cublas == nullptr) return CUCO_ERR_PARAM;
    const int64_t t64 = cuco_param(ctx, "T"), h64 = cuco_param(ctx, "H"), i64 = cuco_param(ctx, "I"),
                  e64 = cuco_param(ctx, "E"), k64 = cuco_param(ctx, "K");
    const int64_t w64 = ctx->world_size;
    if (t64 <= 0 || h64 <= 0 || i64 <= 0 || e64 <= 0 || k64 <= 0 || w64 < 1 || e64 % w64 != 0 || k64 > e64 ||
        e64 > kMaxExperts)
      return CUCO_ERR_PARAM;
    if ((h64 * kBf16Bytes) % kVecBytes != 0 || (i64 * kBf16Bytes) % kVecBytes != 0) return CUCO_ERR_PARAM;
    if (t64 * k64 >= ((int64_t)1 << 31) || w64 * t64 * std::min<int64_t>(k64, e64 / w64) >= ((int64_t)1 << 31))
      return CUCO_ERR_PARAM;  // rows are int in the kernels and in cuBLAS
    const int fp8_param = moe_kernels::fp8_mode(cuco_param(ctx, "FP8"), h64);
    if (fp8_param < 0) return CUCO_ERR_PARAM;
    T = (int)t64;
    H = (int)h64;
    I = (int)i64;
    E = (int)e64;
    K = (int)k64;
    W = (int)w64;
    EL = E / W;
    rank = ctx->rank;
    cap = (size_t)T * (size_t)std::min(K, EL);
    fp8 = fp8_param == 1;
    const size_t row = (size_t)H * kBf16Bytes;
    row_vecs = (int)(row / kVecBytes);
    wire_row = moe_kernels::wire_row_bytes(H, fp8);
    const cuco_tensor_t* tx = cuco_tensor(ctx, "x");
    const cuco_tensor_t* tidx = cuco_tensor(ctx, "topk_idx");
    const cuco_tensor_t* tw = cuco_tensor(ctx, "topk_w");
    const cuco_tensor_t* twgu = cuco_tensor(ctx, "w_gate_up");
    const cuco_tensor_t* twd = cuco_tensor(ctx, "w_down");
    const cuco_tensor_t* ty = cuco_tensor(ctx, "y");
    if (!tensor_ok(tx, CUCO_DTYPE_BF16, (size_t)T * row) ||
        !tensor_ok(tidx, CUCO_DTYPE_I32, (size_t)T * K * kI32Bytes) ||
        !tensor_ok(tw, CUCO_DTYPE_F32, (size_t)T * K * kF32Bytes) ||
        !tensor_ok(twgu, CUCO_DTYPE_BF16, (size_t)EL * H * 2 * I * kBf16Bytes) ||
        !tensor_ok(twd, CUCO_DTYPE_BF16, (size_t)EL * I * H * kBf16Bytes) ||
        !tensor_ok(ty, CUCO_DTYPE_BF16, (size_t)T * row))
      return CUCO_ERR_PARAM;
    const size_t need[kWindows] = {(size_t)T * K * wire_row, (size_t)(W - 1) * cap * wire_row, (size_t)W * cap * row,
                                   (size_t)T * K * row, (size_t)W * E * kI32Bytes};
    for (int i = 0; i < kWindows; ++i) {
      windows[i] = cuco_scratch(ctx, names[i]);
      if (windows[i] == nullptr || windows[i]->local == nullptr || windows[i]->capacity_bytes < need[i])
        return CUCO_ERR_PARAM;
    }
    int sms = ctx->sm_count;
    if (sms <= 0) CUCO_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx->device));
    grid = sms * kCtasPerSm;
    x = (const __nv_bfloat16*)tx->local;
    idx = (const int*)tidx->local;
    w = (const float*)tw->local;
    wgu = (const __nv_bfloat16*)twgu->local;
    wd = (const __nv_bfloat16*)twd->local;
    y = (__nv_bfloat16*)ty->local;
    send_wire = (uint8_t*)windows[kSend]->local;
    recv_wire = (uint8_t*)windows[kRecv]->local;
    out = (__nv_bfloat16*)windows[kOut]->local;
    ret = (__nv_bfloat16*)windows[kRet]->local;
    counts = (int*)windows[kCounts]->local;
    offsets.assign((size_t)W * (E + 1), 0);
    recv_rows.assign((size_t)W * EL * W, 0);
    const size_t rows_all = (size_t)W * cap;
    CUCO_CUDA_TRY(cudaMalloc(&send_off, sizeof(int) * (size_t)(E + 1)));
    CUCO_CUDA_TRY(cudaMalloc(&fill, sizeof(int) * (size_t)E));
    CUCO_CUDA_TRY(cudaMalloc(&pos, sizeof(int) * (size_t)T * K));
    CUCO_CUDA_TRY(cudaMalloc(&gu, rows_all * 2 * I * kBf16Bytes));
    CUCO_CUDA_TRY(cudaMalloc(&act, rows_all * I * kBf16Bytes));
    CUCO_CUDA_TRY(cudaMallocHost(&host_counts, sizeof(int) * (size_t)W * E));
    return cuco_cuda_status(moe_kernels::bf16_dispatch_rows(fp8, send_wire, recv_wire, (size_t)T * K * row,
                                                            std::max<size_t>(1, (size_t)(W - 1) * cap) * row, send,
                                                            recv));
  }

  // Frees what open allocated (also after a failed open).
  void close() {
    cudaFree(send_off);
    cudaFree(fill);
    cudaFree(pos);
    cudaFree(gu);
    cudaFree(act);
    cudaFreeHost(host_counts);
    moe_kernels::free_bf16_dispatch_rows(fp8, send, recv);
  }

  // T_r from x's valid bytes (whole rows, at most the capacity); topk_idx / topk_w must cover as many rows.
  int read_valid_rows(cuco_ctx_t* ctx) {
    const cuco_tensor_t* tx = cuco_tensor(ctx, "x");
    const cuco_tensor_t* tidx = cuco_tensor(ctx, "topk_idx");
    const cuco_tensor_t* tw = cuco_tensor(ctx, "topk_w");
    if (tx == nullptr || tidx == nullptr || tw == nullptr) return CUCO_ERR_PARAM;
    const size_t tr = tx->valid_bytes / ((size_t)H * kBf16Bytes);
    if (tr == 0 || tr > (size_t)T || tidx->valid_bytes < tr * K * kI32Bytes || tw->valid_bytes < tr * K * kF32Bytes)
      return CUCO_ERR_PARAM;
    Tr = (int)tr;
    return CUCO_OK;
  }

  // This rank's counts row (row `rank` of the counts window), the send offsets, and every routed token row in
  // send (expert order; pos[t*K + k] = its row). FP8=1: the rows are encoded into wire rows and send holds what
  // they decode to, so own rows are computed on the same numbers as everyone else's.
  int route(cudaStream_t stream) const {
    const int n = Tr * K;
    int* my_counts = counts + (size_t)rank * E;
    CUCO_CUDA_TRY(cudaMemsetAsync(my_counts, 0, sizeof(int) * (size_t)E, stream));
    const int count_grid = std::max(1, std::min(grid, (n + kThreads - 1) / kThreads));
    moe_kernels::count_experts<<<count_grid, kThreads, 0, stream>>>(idx, n, E, my_counts);
    moe_kernels::scan_counts<<<1, kThreads, 0, stream>>>(my_counts, E, send_off, fill);
    moe_kernels::gather_rows<<<grid, kThreads, 0, stream>>>((const uint4*)x, idx, n, K, E, row_vecs, send_off, fill,
                                                            pos, (uint4*)send);
    CUCO_CUDA_TRY(cudaGetLastError());
    return fp8 ? cuco_cuda_status(moe_kernels::fp8_encode_send(send, send_wire, n, H, grid, kThreads, stream))
               : CUCO_OK;
  }

  // From the [W, E] counts in host_counts: every source's send offsets, and for every rank q the recv row of each
  // (expert le of q, source s != q): experts in order, sources ascending within an expert.
  // Refuses (CUCO_ERR_PARAM, on every rank alike: all hold the same counts) more rows to one rank than the windows
  // hold, which only routing with repeated experts per token could produce.
  int build_plan() {
    for (int src = 0; src < W; ++src)
      for (int q = 0; q < W; ++q) {
        size_t rows = 0;
        for (int le = 0; le < EL; ++le) rows += (size_t)host_counts[(size_t)src * E + q * EL + le];
        if (rows > cap) return CUCO_ERR_PARAM;
      }
    for (int src = 0; src < W; ++src) {
      size_t acc = 0;
      for (int e = 0; e < E; ++e) {
        offsets[(size_t)src * (E + 1) + e] = acc;
        acc += (size_t)host_counts[(size_t)src * E + e];
      }
      offsets[(size_t)src * (E + 1) + E] = acc;
    }
    for (int q = 0; q < W; ++q) {
      size_t acc = 0;
      for (int le = 0; le < EL; ++le)
        for (int src = 0; src < W; ++src) {
          recv_rows[((size_t)q * EL + le) * W + src] = acc;
          if (src != q) acc += (size_t)host_counts[(size_t)src * E + q * EL + le];
        }
      if (q == rank) arrived = acc;
    }
    return CUCO_OK;
  }

  // Rows source src sends to expert e; src's send row of expert e's first; rank q's recv row of (q's expert le,
  // source src).
  size_t cnt(int src, int e) const { return (size_t)host_counts[(size_t)src * E + e]; }
  size_t off(int src, int e) const { return offsets[(size_t)src * (E + 1) + e]; }
  size_t rrow(int q, int le, int src) const { return recv_rows[((size_t)q * EL + le) * W + src]; }

  // out[row0 + i] = local expert le applied to rows [0, n) of `rows`; gu / act rows row0.. are its workspace. The
  // GEMMs run on the handle's stream, SwiGLU on `stream` (the same one). cuBLAS is column-major, our matrices
  // row-major: out = A @ B is computed as out^T = B^T A^T, i.e.
  // cublasGemmEx(N, N, m = cols(B), n = rows(A), k, B, ld cols(B), A, ld k, out, ld cols(B)).
  int expert_mlp(cublasHandle_t handle, int le, const __nv_bfloat16* rows, int n, size_t row0,
                 cudaStream_t stream) const {
    if (n <= 0) return CUCO_OK;
    const float one = 1.0f, zero = 0.0f;
    const int I2 = 2 * I;
    __nv_bfloat16* g = gu + row0 * I2;
    __nv_bfloat16* a = act + row0 * I;
    CUCO_CUBLAS_TRY(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, I2, n, H, &one, wgu + (size_t)le * H * I2,
                                 CUDA_R_16BF, I2, rows, CUDA_R_16BF, H, &zero, g, CUDA_R_16BF, I2, CUBLAS_COMPUTE_32F,
                                 CUBLAS_GEMM_DEFAULT));
    const size_t elems = (size_t)n * I;
    const int swiglu_grid = (int)std::min<size_t>((elems + kThreads - 1) / kThreads, (size_t)grid);
    moe_kernels::swiglu<<<swiglu_grid, kThreads, 0, stream>>>(g, (size_t)n, I, a);
    CUCO_CUDA_TRY(cudaGetLastError());
    CUCO_CUBLAS_TRY(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, H, n, I, &one, wd + (size_t)le * I * H,
                                 CUDA_R_16BF, H, a, CUDA_R_16BF, I, &zero, out + row0 * H, CUDA_R_16BF, H,
                                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return CUCO_OK;
  }

  // Local expert le on this rank's own rows of it, straight from send: out rows [0, Cap) in send order.
  int expert_own(cublasHandle_t handle, int le, cudaStream_t stream) const {
    const int e = rank * EL + le;
    const size_t own0 = off(rank, rank * EL);
    return expert_mlp(handle, le, send + off(rank, e) * H, (int)cnt(rank, e), off(rank, e) - own0, stream);
  }

  // Local expert le on the rows that arrived for it from the other ranks (contiguous in recv, sources
  // ascending): out rows Cap + their recv rows.
  int expert_arrived(cublasHandle_t handle, int le, cudaStream_t stream) const {
    const int e = rank * EL + le;
    size_t rows = 0, first = 0;
    bool have_first = false;
    for (int src = 0; src < W; ++src) {
      if (src == rank) continue;
      if (!have_first) {
        first = rrow(rank, le, src);
        have_first = true;
      }
      rows += cnt(src, e);
    }
    return rows ? expert_mlp(handle, le, recv + first * H, (int)rows, cap + first, stream) : CUCO_OK;
  }

  // FP8=1: the rows that arrived in the recv window, decoded into the bf16 rows the arrived GEMMs read.
  int decode_arrived_rows(cudaStream_t stream) const {
    return fp8 ? cuco_cuda_status(moe_kernels::fp8_decode_recv(recv_wire, (int)arrived, H, recv, grid, kThreads,
                                                               stream))
               : CUCO_OK;
  }

  // The own rows' outputs into ret (their send order), where the combine reads every assignment's output.
  int copy_own_outputs(cudaStream_t stream) const {
    const size_t own0 = off(rank, rank * EL);
    const size_t own_rows = off(rank, (rank + 1) * EL) - own0;
    if (own_rows == 0) return CUCO_OK;
    return cuco_cuda_status(cudaMemcpyAsync(ret + own0 * H, out, own_rows * H * kBf16Bytes, cudaMemcpyDeviceToDevice,
                                            stream));
  }
};

}  // namespace moe_host

#endif  // MOE_HOST_CUH_
