// tile_shapes.cu — the shared attention kernel at each tile shape, as a shared library for tile_shapes.py
// (ctypes). One entry point: run one shape on token-major q, k, v [seq, heads, d] (bf16), writing o; the whole
// sequence is one segment, so this is the kernel alone, without communication.
#include "attention_kernel.cuh"

// (D, m-tiles per warp, keys per tile): the shapes that fit in 255 registers without spilling (ptxas -v).
#define ATTN_TILE_SHAPES(X) \
  X(32, 1, 64) X(32, 2, 64) X(32, 1, 128) X(64, 1, 64) X(64, 2, 64) X(64, 1, 128) X(128, 1, 64)

namespace {
struct Shape { int d, m_tiles, block_k; };
constexpr Shape kShapes[] = {
#define ATTN_SHAPE_ENTRY(D, M, N) {D, M, N},
    ATTN_TILE_SHAPES(ATTN_SHAPE_ENTRY)
#undef ATTN_SHAPE_ENTRY
};
}  // namespace

extern "C" int attn_shape_count() { return (int)(sizeof(kShapes) / sizeof(kShapes[0])); }

// Shape i as (d, m_tiles, block_k); -1 past the end.
extern "C" int attn_shape(int i, int* d, int* m_tiles, int* block_k) {
  if (i < 0 || i >= attn_shape_count()) return -1;
  *d = kShapes[i].d, *m_tiles = kShapes[i].m_tiles, *block_k = kShapes[i].block_k;
  return 0;
}

// Enqueue the kernel of one shape on `stream`; a cudaError_t (cudaErrorInvalidValue for a shape not built).
extern "C" int attn_run(int d, int m_tiles, int block_k, const void* q, const void* k, const void* v, void* o,
                        int seq, int heads, int causal, void* stream) {
  attn::Params p{};
  p.q = (const __nv_bfloat16*)q;
  p.o = (__nv_bfloat16*)o;
  p.sq = seq, p.heads = heads, p.q0 = 0, p.causal = causal;
  p.scale_log2 = attn::scale_log2(d);
  p.n_seg = 1;
  p.seg[0] = attn::Segment{(const __nv_bfloat16*)k, (const __nv_bfloat16*)v, nullptr, 0, seq};
  p.write_out = 1;
  const cudaStream_t s = (cudaStream_t)stream;
#define ATTN_SHAPE_CASE(D, M, N) \
  if (d == D && m_tiles == M && block_k == N) return (int)attn::launch_shape<D, M, N>(p, s);
  ATTN_TILE_SHAPES(ATTN_SHAPE_CASE)
#undef ATTN_SHAPE_CASE
  return (int)cudaErrorInvalidValue;
}
