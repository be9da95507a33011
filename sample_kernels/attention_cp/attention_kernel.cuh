// attention_kernel.cuh — the tensor-core flash-attention forward kernel shared by the three attention_cp sources.
//
// The three sources #include it: build.for_workload puts a workload's folder on the include path when it ships
// *.cuh headers and hashes them into the build cache key, so an edit here rebuilds every candidate. It is
// frozen library code for the search (outside every candidate's EVOLVE blocks).
//
// What it computes. Queries q [Sq, H, D] (token-major, bf16) of one rank, whose first query sits at global
// sequence position q0, attend over a list of K/V SEGMENTS: segment s holds n_keys consecutive tokens of the
// global sequence starting at position key0, its K and V laid out like q ([n_keys, H, D], row stride H*D).
// Softmax scale 1/sqrt(D); causal masking compares GLOBAL positions (key > query is masked), so a rank's
// sequence offset is respected whatever block of the sequence a segment is.
//
// Online softmax (flash attention 2): each CTA owns the queries of one head, 16 rows per m-tile of each warp
// (the defaults: 4 warps x 16 or 32 rows = 64 or 128 queries, see TileShape), keeps its Q fragments in registers, streams K/V in tiles of keys through shared memory (cp.async;
// V(j) loads during Q K(j)^T and, with kPrefetchK, K(j+1) during the softmax and P V(j)) and keeps per-row
// running max m, running sum l and the unnormalised output O in registers. The segments ARE the log-sum-exp
// merge: moving from one segment to the next just continues the online softmax. Across kernel launches the same
// state can be stored to / loaded from an fp32 workspace (store_state / load_state), which is the LSE merge of
// partial results computed by separate launches (O = O1 * 2^(m1 - m) + O2 * 2^(m2 - m), l likewise; m is kept in
// log2 units).
//
// Tensor cores: mma.sync.m16n8k16 bf16 x bf16 -> fp32 (inline PTX). S = Q K^T per m-tile is 16 x kBlockK
// (n-tiles of 8, D/16 k-steps); P is rounded to bf16 and reused in registers as the A operand of P V (the
// accumulator layout of two neighbouring n-tiles is the A-fragment layout of one k-step), as in FlashAttention 2.
// K and V fragments come from shared memory with ldmatrix (V with .trans), rows padded by 16 bytes so the eight
// row addresses of each 8x8 matrix hit distinct banks.
//
// Waiting on arrival (device-initiated variants): a segment may carry a flag; before the first tile of that
// segment (unless kPrefetchK already found the flag up), thread 0 waits until *flag >= epoch with the runtime's
// bounded wait (cuco_wait_until, cuco_waits.h: acquire, system scope; a flag nobody raises ends in a verdict
// naming it) and the CTA's barrier hands the acquired view to every thread. Segments a CTA skips entirely
// (causal: all keys after its last query) are never waited for.
#ifndef ATTENTION_KERNEL_CUH_
#define ATTENTION_KERNEL_CUH_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>

#include <cuda/atomic>

#include "cuco_waits.h"  // the runtime's bounded wait: the one header of the runtime this kernel needs

namespace attn {

constexpr int kMaxSegments = 64;  // W * chunks <= 64 (8 ranks x 8 chunks)
constexpr int kWarps = 4;         // warps per CTA unless a tile shape says otherwise (TileConfig's last argument)
constexpr int kPad = 8;           // bf16 of padding per smem row: conflict-free 32-bit fragment loads

struct Segment {
  const __nv_bfloat16* k;  // token key0 of this segment (head 0); token key0 + j at k + j * H * D
  const __nv_bfloat16* v;
  const uint64_t* flag;    // wait for *flag >= epoch before reading (nullptr: already present)
  int key0;                // global sequence position of the segment's first key
  int n_keys;
};

struct Params {
  const __nv_bfloat16* q;  // [sq, heads, d]
  __nv_bfloat16* o;        // [sq, heads, d], written when write_out
  float* ws_o;             // [heads, sq, d] fp32 unnormalised O (load_state / store_state)
  float* ws_ml;            // [heads, sq, 2] fp32 (m in log2 units, l)
  int sq, heads, q0, causal;
  float scale_log2;        // log2(e) / sqrt(d)
  uint64_t epoch;
  int n_seg;
  int load_state, store_state, write_out;
  Segment seg[kMaxSegments];
};

__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 16-byte global -> shared copy; src_bytes 0 fills zeros (rows past the segment's end).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, int src_bytes) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Has a segment's arrival flag reached the epoch (without waiting)? The runtime's flag protocol: acquire at system
// scope, pairing the producer's release: the producer is another process (symm) or another GPU (nccl), and its
// K/V stores must be visible to this CTA once the flag is seen.
__device__ __forceinline__ bool flag_reached(const uint64_t* flag, uint64_t epoch) {
  return cuda::atomic_ref<const uint64_t, cuda::thread_scope_system>(*flag).load(cuda::memory_order_acquire) >= epoch;
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);  // .x (lo) in the low half
  return *reinterpret_cast<uint32_t*>(&h);
}
// Four 8x8 b16 matrices from shared memory; lanes 8i..8i+7 give the row addresses of matrix i. Plain: lane l
// receives row l/4, columns 2(l%4), +1 of each matrix; .trans: column l/4, rows 2(l%4), +1 (the mma B layout
// when the matrix rows are keys and the columns head dims, i.e. V stored token-major).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem_row) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(smem_row);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem_row) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(smem_row);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}

// Stage rows [row0, row0 + kRows) of a [*, H, D] tensor (head already applied to `base`) into smem rows of
// stride D + kPad with the CTA's kCtaThreads threads; rows >= n_rows are zero-filled.
template <int D, int kRows, int kCtaThreads>
__device__ __forceinline__ void load_tile(__nv_bfloat16 (*dst)[D + kPad], const __nv_bfloat16* base,
                                          size_t row_stride, int row0, int n_rows) {
  constexpr int kVecsPerRow = D / 8;
  constexpr int kVecs = kRows * kVecsPerRow;
#pragma unroll
  for (int i = threadIdx.x; i < kVecs; i += kCtaThreads) {
    const int r = i / kVecsPerRow, c = i % kVecsPerRow;
    const bool ok = row0 + r < n_rows;
    const __nv_bfloat16* src = ok ? base + (size_t)(row0 + r) * row_stride + c * 8 : base;
    cp_async16(&dst[r][c * 8], src, ok ? 16 : 0);
  }
}

// Sum over the 4 threads of a quad (the threads that share one accumulator row).
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

// 2^x by the SFU (ex2.approx.ftz: 2 ulp; what --use_fast_math makes of exp2f); 2^-inf = 0.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// The first segment at or after `si` that this CTA reads (n_keys > 0 and, causally, not entirely after its last
// query); its key count up to that query in *n_end. Returns p.n_seg when there is none.
__device__ __forceinline__ int next_segment(const Params& p, int si, int q_last, int* n_end) {
  for (; si < p.n_seg; ++si) {
    const Segment& sg = p.seg[si];
    if (sg.n_keys <= 0 || (p.causal && sg.key0 > q_last)) continue;
    *n_end = p.causal ? min(sg.n_keys, q_last - sg.key0 + 1) : sg.n_keys;
    return si;
  }
  return si;
}

// A CTA's tile shape: kMTiles 16-row m-tiles per warp (kBlockQ = kWarps x 16 x kMTiles queries; two halve the
// shared-memory fragment reads per mma, each K / V fragment feeding both, at the cost of registers), kBlockK keys
// per streamed tile, whether K(j+1) is prefetched during tile j, the CTAs per SM __launch_bounds__ asks for (which
// caps registers at 64K / (32 * kWarps * kMinCtas)) and the warps per CTA.
//
// What a shape must keep, or it does not build: kBlockK a multiple of 16 (ldmatrix reads n-tiles in pairs);
// kBlockQ <= 2 * kBlockK (the Q tile is staged through the K and V buffers); the K and V buffers,
// 2 * kBlockK * (D + kPad) bf16, within the 227 KiB of shared memory a CTA may have on sm_90 (ptxas refuses more).
template <int M, int N, bool P, int C, int W = kWarps>
struct TileConfig {
  static constexpr int kMTiles = M, kBlockK = N, kMinCtas = C, kWarps = W;
  static constexpr bool kPrefetchK = P;
};

// The shape the sources use per head dim: the fastest of benchmarks/attention_cp/tile_shapes.cu's shapes on one
// H200 (tile_shapes.py measures them against SDPA flash and writes these lines with --apply).
template <int D>
struct TileShape;
template <> struct TileShape<32> : TileConfig<1, 128, false, 1> {};
template <> struct TileShape<64> : TileConfig<2, 64, false, 1> {};
template <> struct TileShape<128> : TileConfig<1, 64, false, 1> {};

// grid (ceil(sq / kBlockQ), heads), block 32 * kCtaWarps.
//
// Pipeline per key tile j: V(j) loads during S = Q K(j)^T. With kPrefetchK (FlashAttention 2's order), K(j+1) -
// the next tile of this segment, or the first of the next segment when that one needs no wait or its flag is
// already up - also loads during the softmax and O += P V(j); one K and one V buffer still suffice, since K(j+1)
// is issued after every warp has read K(j). On an H200 that was slower at every shape tile_shapes.py compares
// (it costs a barrier per tile), so the defaults load K(j) at the top of tile j.
template <int D, int kMTiles, int kBlockK, bool kPrefetchK, int kMinCtas, int kCtaWarps = kWarps>
__global__ void __launch_bounds__(32 * kCtaWarps, kMinCtas) flash_fwd_kernel(const Params p) {
  static_assert(D % 16 == 0 && D <= 128, "head dim: a multiple of 16 up to 128");
  constexpr int kThreads = 32 * kCtaWarps;
  constexpr int kBlockQ = kCtaWarps * 16 * kMTiles;
  constexpr int kKSteps = D / 16;  // k-steps of Q K^T
  constexpr int kDTiles = D / 8;   // n-tiles of P V
  constexpr int kNTiles = kBlockK / 8;
  static_assert(kBlockK % 16 == 0 && kBlockQ <= 2 * kBlockK, "the Q tile is staged through the K and V buffers");
  __shared__ alignas(16) __nv_bfloat16 kv[2 * kBlockK][D + kPad];
  __shared__ int next_ready;  // thread 0's verdict: the next segment's K may be prefetched
  __nv_bfloat16(*ks)[D + kPad] = kv;
  __nv_bfloat16(*vs)[D + kPad] = kv + kBlockK;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane >> 2, t = lane & 3;
  const int h = blockIdx.y;
  const int qt0 = blockIdx.x * kBlockQ;  // first (local) query of this CTA
  const size_t row_stride = (size_t)p.heads * D;
  const int q_last = p.q0 + min(qt0 + kBlockQ, p.sq) - 1;  // last valid global query of the CTA
  // Accumulator row r = 2 * mt + i of this thread: local query qrow[r], global position qpos[r].
  int qrow[2 * kMTiles], qpos[2 * kMTiles];
#pragma unroll
  for (int r = 0; r < 2 * kMTiles; ++r) {
    qrow[r] = qt0 + warp * 16 * kMTiles + (r >> 1) * 16 + g + (r & 1) * 8;
    qpos[r] = p.q0 + qrow[r];
  }

  // Q tile -> registers (A fragments), staged through the K/V buffers.
  load_tile<D, kBlockQ, kThreads>(kv, p.q + (size_t)h * D, row_stride, qt0, p.sq);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  uint32_t qf[kMTiles][kKSteps][4];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
      const int r = warp * 16 * kMTiles + mt * 16 + g, c = kk * 16 + t * 2;
      qf[mt][kk][0] = *reinterpret_cast<const uint32_t*>(&kv[r][c]);
      qf[mt][kk][1] = *reinterpret_cast<const uint32_t*>(&kv[r + 8][c]);
      qf[mt][kk][2] = *reinterpret_cast<const uint32_t*>(&kv[r][c + 8]);
      qf[mt][kk][3] = *reinterpret_cast<const uint32_t*>(&kv[r + 8][c + 8]);
    }
  }
  __syncthreads();

  // Running state of my rows. l is this thread's PARTIAL row sum (its 1/4 of the columns): it is summed over
  // the quad only when stored or written, so a loaded full sum goes to the quad's thread 0 alone.
  float o[kMTiles][kDTiles][4];
  float m[2 * kMTiles], l[2 * kMTiles];
#pragma unroll
  for (int r = 0; r < 2 * kMTiles; ++r) m[r] = -INFINITY, l[r] = 0.f;
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int nd = 0; nd < kDTiles; ++nd) o[mt][nd][0] = o[mt][nd][1] = o[mt][nd][2] = o[mt][nd][3] = 0.f;
  if (p.load_state) {
#pragma unroll
    for (int r = 0; r < 2 * kMTiles; ++r) {
      if (qrow[r] >= p.sq) continue;
      const size_t row = (size_t)h * p.sq + qrow[r];
      m[r] = p.ws_ml[row * 2];
      l[r] = t == 0 ? p.ws_ml[row * 2 + 1] : 0.f;
#pragma unroll
      for (int nd = 0; nd < kDTiles; ++nd) {
        const float2 v = *reinterpret_cast<const float2*>(p.ws_o + row * D + nd * 8 + t * 2);
        o[r >> 1][nd][2 * (r & 1)] = v.x;
        o[r >> 1][nd][2 * (r & 1) + 1] = v.y;
      }
    }
  }

  const int mrow = lane & 7, mi = lane >> 3;  // ldmatrix: the row this lane addresses, of matrix mi
  int n_end = 0;
  int si = next_segment(p, 0, q_last, &n_end);
  bool k_in_flight = false;  // the next tile's K was prefetched (kPrefetchK) during the previous tile
#pragma unroll 1
  while (si < p.n_seg) {
    const Segment& sg = p.seg[si];
    const __nv_bfloat16* kb = sg.k + (size_t)h * D;
    const __nv_bfloat16* vb = sg.v + (size_t)h * D;
    int next_si = si, next_end = 0;
#pragma unroll 1
    for (int kt0 = 0; kt0 < n_end; kt0 += kBlockK) {
      if (!k_in_flight) {
        if (kt0 == 0 && sg.flag != nullptr) {
          if (threadIdx.x == 0) cuco_wait_until(sg.flag, p.epoch);
          __syncthreads();  // hands thread 0's acquired view to the CTA
        }
        load_tile<D, kBlockK, kThreads>(ks, kb, row_stride, kt0, sg.n_keys);
        cp_async_commit();
      }
      load_tile<D, kBlockK, kThreads>(vs, vb, row_stride, kt0, sg.n_keys);
      cp_async_commit();
      cp_async_wait<1>();  // K(j) has landed; V(j) still in flight during Q K^T
      __syncthreads();

      float s[kMTiles][kNTiles][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0.f;
      // K fragments of n-tiles (nt, nt+1) and k-step kk in one ldmatrix: matrix i of lane l is keys
      // (nt + i/2)*8 + l%8, head dims kk*16 + (i%2)*8 .. +8 -> {b0b1, b2b3} of nt, then of nt + 1.
#pragma unroll
      for (int nt = 0; nt < kNTiles; nt += 2) {
#pragma unroll
        for (int kk = 0; kk < kKSteps; ++kk) {
          uint32_t kb4[4];
          ldmatrix_x4(kb4, &ks[(nt + (mi >> 1)) * 8 + mrow][kk * 16 + (mi & 1) * 8]);
#pragma unroll
          for (int mt = 0; mt < kMTiles; ++mt) {
            mma_bf16(s[mt][nt], qf[mt][kk], kb4[0], kb4[1]);
            mma_bf16(s[mt][nt + 1], qf[mt][kk], kb4[2], kb4[3]);
          }
        }
      }

      const bool last_tile = kt0 + kBlockK >= n_end;
      if (last_tile) next_si = next_segment(p, si + 1, q_last, &next_end);
      k_in_flight = false;
      if constexpr (kPrefetchK) {
        // Prefetch the next K tile into ks once every warp has read this one: the next tile of this segment, or
        // the first of the next segment if it needs no wait or its flag is already up.
        if (last_tile && threadIdx.x == 0) {
          const bool ready = next_si < p.n_seg;
          next_ready = ready && (p.seg[next_si].flag == nullptr || flag_reached(p.seg[next_si].flag, p.epoch));
        }
        __syncthreads();  // ks is free; next_ready is visible (with thread 0's acquired view)
        if (!last_tile) {
          load_tile<D, kBlockK, kThreads>(ks, kb, row_stride, kt0 + kBlockK, sg.n_keys);
          k_in_flight = true;
        } else if (next_ready) {
          const Segment& nx = p.seg[next_si];
          load_tile<D, kBlockK, kThreads>(ks, nx.k + (size_t)h * D, row_stride, 0, nx.n_keys);
          k_in_flight = true;
        }
        cp_async_commit();  // possibly empty: V(j) stays the older pending group either way
      }

      // Mask keys past the segment's end and, causally, keys after the row's query.
      const bool need_mask = kt0 + kBlockK > sg.n_keys || (p.causal && sg.key0 + kt0 + kBlockK - 1 > p.q0 + qt0);
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int j = kt0 + nt * 8 + t * 2 + (e & 1);
            if (need_mask && (j >= sg.n_keys || (p.causal && sg.key0 + j > qpos[2 * mt + (e >> 1)])))
              s[mt][nt][e] = -INFINITY;
          }
        }
      }
      // Online softmax update of every row. S is unscaled: the scale rides in the exponent's FMA (m is in scaled
      // log2 units; scaling by a positive number commutes with the max).
#pragma unroll
      for (int r = 0; r < 2 * kMTiles; ++r) {
        float(&sr)[kNTiles][4] = s[r >> 1];
        const int c = 2 * (r & 1);
        float mx = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) mx = fmaxf(mx, fmaxf(sr[nt][c], sr[nt][c + 1]));
        const float m_new = fmaxf(m[r], quad_max(mx) * p.scale_log2);
        const float m_use = m_new == -INFINITY ? 0.f : m_new;  // a fully masked row so far: no NaN from -inf - -inf
        const float alpha = fast_exp2(m[r] - m_use);
        float sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
          sr[nt][c] = fast_exp2(fmaf(sr[nt][c], p.scale_log2, -m_use));
          sr[nt][c + 1] = fast_exp2(fmaf(sr[nt][c + 1], p.scale_log2, -m_use));
          sum += sr[nt][c] + sr[nt][c + 1];
        }
        l[r] = l[r] * alpha + sum;
        m[r] = m_new;
#pragma unroll
        for (int nd = 0; nd < kDTiles; ++nd) {
          o[r >> 1][nd][c] *= alpha;
          o[r >> 1][nd][c + 1] *= alpha;
        }
      }

      if constexpr (kPrefetchK) {
        cp_async_wait<1>();  // V(j) has landed; K(j+1) may still be in flight
      } else {
        cp_async_wait<0>();  // V(j) has landed
      }
      __syncthreads();
      // O += P V: P (bf16) straight from the S accumulators, V fragments from smem.
#pragma unroll
      for (int kk = 0; kk < kBlockK / 16; ++kk) {
        uint32_t pa[kMTiles][4];
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          pa[mt][0] = pack_bf16(s[mt][2 * kk][0], s[mt][2 * kk][1]);
          pa[mt][1] = pack_bf16(s[mt][2 * kk][2], s[mt][2 * kk][3]);
          pa[mt][2] = pack_bf16(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
          pa[mt][3] = pack_bf16(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
        }
        // V fragments of d-tiles (nd, nd+1) in one transposing ldmatrix: matrix i of lane l is keys
        // kk*16 + (i%2)*8 + l%8, head dims (nd + i/2)*8 .. +8 -> {b0b1, b2b3} of nd, then of nd + 1.
#pragma unroll
        for (int nd = 0; nd < kDTiles; nd += 2) {
          uint32_t vb4[4];
          ldmatrix_x4_trans(vb4, &vs[kk * 16 + (mi & 1) * 8 + mrow][(nd + (mi >> 1)) * 8]);
#pragma unroll
          for (int mt = 0; mt < kMTiles; ++mt) {
            mma_bf16(o[mt][nd], pa[mt], vb4[0], vb4[1]);
            mma_bf16(o[mt][nd + 1], pa[mt], vb4[2], vb4[3]);
          }
        }
      }
      __syncthreads();  // every warp is done with vs before V(j+1) overwrites it
    }
    si = next_si;
    n_end = next_end;
  }
  cp_async_wait<0>();

#pragma unroll
  for (int r = 0; r < 2 * kMTiles; ++r) {
    const float l_full = quad_sum(l[r]);  // all lanes take part in the shuffle
    if (qrow[r] >= p.sq) continue;
    const size_t row = (size_t)h * p.sq + qrow[r];
    const float(&orow_acc)[kDTiles][4] = o[r >> 1];
    const int c = 2 * (r & 1);
    if (p.store_state) {
      if (t == 0) {
        p.ws_ml[row * 2] = m[r];
        p.ws_ml[row * 2 + 1] = l_full;
      }
#pragma unroll
      for (int nd = 0; nd < kDTiles; ++nd)
        *reinterpret_cast<float2*>(p.ws_o + row * D + nd * 8 + t * 2) =
            make_float2(orow_acc[nd][c], orow_acc[nd][c + 1]);
    }
    if (p.write_out) {
      const float inv = 1.f / l_full;  // l_full == 0 (no key at all) writes inf/NaN: verification fails loudly
      __nv_bfloat16* orow = p.o + (size_t)qrow[r] * row_stride + (size_t)h * D;
#pragma unroll
      for (int nd = 0; nd < kDTiles; ++nd)
        *reinterpret_cast<__nv_bfloat162*>(orow + nd * 8 + t * 2) =
            __floats2bfloat162_rn(orow_acc[nd][c] * inv, orow_acc[nd][c + 1] * inv);
    }
  }
}

// Host: log2(e) / sqrt(d), the scale the kernel applies to Q K^T before exp2.
inline float scale_log2(int d) { return (float)(1.4426950408889634 / sqrt((double)d)); }

// Enqueue one launch of a given tile shape (benchmarks compare shapes, device_lsa.cu's knobs pick one per head
// dim; launch() picks TileShape<D>).
template <int D, int kMTiles, int kBlockK, bool kPrefetchK, int kMinCtas, int kCtaWarps = kWarps>
inline cudaError_t launch_shape(const Params& p, cudaStream_t stream) {
  if (p.sq <= 0 || p.heads <= 0 || p.n_seg < 0 || p.n_seg > kMaxSegments) return cudaErrorInvalidValue;
  constexpr int kBlockQ = kCtaWarps * 16 * kMTiles;
  const dim3 grid((unsigned)((p.sq + kBlockQ - 1) / kBlockQ), (unsigned)p.heads);
  flash_fwd_kernel<D, kMTiles, kBlockK, kPrefetchK, kMinCtas, kCtaWarps><<<grid, 32 * kCtaWarps, 0, stream>>>(p);
  return cudaGetLastError();
}

template <int D>
inline cudaError_t launch_default(const Params& p, cudaStream_t stream) {
  using T = TileShape<D>;
  return launch_shape<D, T::kMTiles, T::kBlockK, T::kPrefetchK, T::kMinCtas, T::kWarps>(p, stream);
}

// Enqueue one attention launch on `stream`; cudaErrorInvalidValue for a head dim other than 32, 64, 128.
inline cudaError_t launch(const Params& p, int d, cudaStream_t stream) {
  switch (d) {
    case 32: return launch_default<32>(p, stream);
    case 64: return launch_default<64>(p, stream);
    case 128: return launch_default<128>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace attn

#endif  // ATTENTION_KERNEL_CUH_
