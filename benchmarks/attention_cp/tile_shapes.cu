// tile_shapes.cu — the shared attention kernel at each tile shape, as a shared library for tile_shapes.py
// (ctypes). One entry point: run one shape on token-major q, k, v [seq, heads, d] (bf16), writing o; the whole
// sequence is one segment, so this is the kernel alone, without communication.
#include "attention_kernel.cuh"

// (D, m-tiles per warp, keys per tile, prefetch K, min CTAs per SM): shapes whose registers fit without spilling
// (ptxas -v) and whose tiles use at most 48 KiB of static shared memory: a choice for this hand-picked list, not
// a limit (Hopper launches larger static allocations; device_lsa.cu's knob block spans the wider space).
#define ATTN_TILE_SHAPES(X)                                                                                   \
  X(32, 1, 64, 0, 1) X(32, 1, 64, 1, 1) X(32, 1, 64, 1, 4) X(32, 1, 128, 0, 1) X(32, 1, 128, 1, 1)              \
  X(32, 2, 64, 1, 1)                                                                                          \
  X(64, 1, 64, 0, 1) X(64, 1, 64, 1, 1) X(64, 1, 64, 0, 4) X(64, 1, 64, 1, 4) X(64, 1, 128, 0, 1)               \
  X(64, 1, 128, 1, 1) X(64, 2, 64, 0, 1) X(64, 2, 64, 1, 1)                                                    \
  X(128, 1, 64, 0, 1) X(128, 1, 64, 1, 1)

namespace {
struct Shape { int d, m_tiles, block_k, prefetch_k, min_ctas; };
constexpr Shape kShapes[] = {
#define ATTN_SHAPE_ENTRY(D, M, N, P, C) {D, M, N, P, C},
    ATTN_TILE_SHAPES(ATTN_SHAPE_ENTRY)
#undef ATTN_SHAPE_ENTRY
};

template <int D>
constexpr bool default_is_compared() {
  using T = attn::TileShape<D>;
  for (const Shape& s : kShapes)
    if (s.d == D && s.m_tiles == T::kMTiles && s.block_k == T::kBlockK && s.prefetch_k == (int)T::kPrefetchK &&
        s.min_ctas == T::kMinCtas)
      return true;
  return false;
}
static_assert(default_is_compared<32>() && default_is_compared<64>() && default_is_compared<128>(),
              "attn::TileShape's default for a head dim must be one of the shapes compared here");
}  // namespace

extern "C" int attn_shape_count() { return (int)(sizeof(kShapes) / sizeof(kShapes[0])); }

// Shape i as (d, m_tiles, block_k, prefetch_k, min_ctas); -1 past the end.
extern "C" int attn_shape(int i, int* d, int* m_tiles, int* block_k, int* prefetch_k, int* min_ctas) {
  if (i < 0 || i >= attn_shape_count()) return -1;
  const Shape& s = kShapes[i];
  *d = s.d, *m_tiles = s.m_tiles, *block_k = s.block_k, *prefetch_k = s.prefetch_k, *min_ctas = s.min_ctas;
  return 0;
}

// Enqueue the kernel of one shape on `stream`; a cudaError_t (cudaErrorInvalidValue for a shape not built).
extern "C" int attn_run(int d, int m_tiles, int block_k, int prefetch_k, int min_ctas, const void* q, const void* k,
                        const void* v, void* o, int seq, int heads, int causal, void* stream) {
  attn::Params p{};
  p.q = (const __nv_bfloat16*)q;
  p.o = (__nv_bfloat16*)o;
  p.sq = seq, p.heads = heads, p.q0 = 0, p.causal = causal;
  p.scale_log2 = attn::scale_log2(d);
  p.n_seg = 1;
  p.seg[0] = attn::Segment{(const __nv_bfloat16*)k, (const __nv_bfloat16*)v, nullptr, 0, seq};
  p.write_out = 1;
  const cudaStream_t s = (cudaStream_t)stream;
#define ATTN_SHAPE_CASE(D, M, N, P, C)                                                    \
  if (d == D && m_tiles == M && block_k == N && prefetch_k == P && min_ctas == C) \
    return (int)attn::launch_shape<D, M, N, P, C>(p, s);
  ATTN_TILE_SHAPES(ATTN_SHAPE_CASE)
#undef ATTN_SHAPE_CASE
  return (int)cudaErrorInvalidValue;
}
