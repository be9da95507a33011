// A host-driven program written for cuco-kit's importer tests (not a sample): an expert-parallel MoE layer.
// main() only starts MPI and NCCL and calls run_layer(), which does everything else: it allocates, fills the
// inputs, warms the all-to-all up, then times ONE layer (dispatch all-to-all, each rank's expert applied to the
// rows every source sent it, combine all-to-all) without a loop, prints the times and frees everything.
// Every source sends `tokens_per_peer` rows (padded); how many of them are real depends on the pair.
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#define CK(call)                                                                                 \
  do {                                                                                           \
    cudaError_t e_ = call;                                                                       \
    if (e_ != cudaSuccess) {                                                                     \
      fprintf(stderr, "CUDA error at %s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));  \
      exit(EXIT_FAILURE);                                                                        \
    }                                                                                            \
  } while (0)
#define NK(call)                                                                                 \
  do {                                                                                           \
    ncclResult_t r_ = call;                                                                      \
    if (r_ != ncclSuccess) {                                                                     \
      fprintf(stderr, "NCCL error at %s:%d: %s\n", __FILE__, __LINE__, ncclGetErrorString(r_));  \
      exit(EXIT_FAILURE);                                                                        \
    }                                                                                            \
  } while (0)

#define HIDDEN 1024
#define TILE 16

// out[rows, HIDDEN] = relu(in[rows, HIDDEN] W[HIDDEN, HIDDEN]), tiled through shared memory
__global__ void expert_ffn(const float* in, const float* w, float* out, int rows, int hidden) {
  __shared__ float a[TILE][TILE];
  __shared__ float b[TILE][TILE];
  const int row = blockIdx.y * TILE + threadIdx.y, col = blockIdx.x * TILE + threadIdx.x;
  float acc = 0.f;
  for (int k0 = 0; k0 < hidden; k0 += TILE) {
    a[threadIdx.y][threadIdx.x] = (row < rows && k0 + threadIdx.x < hidden) ? in[(size_t)row * hidden + k0 + threadIdx.x] : 0.f;
    b[threadIdx.y][threadIdx.x] = (k0 + threadIdx.y < hidden && col < hidden) ? w[(size_t)(k0 + threadIdx.y) * hidden + col] : 0.f;
    __syncthreads();
    for (int k = 0; k < TILE; ++k) acc += a[threadIdx.y][k] * b[k][threadIdx.x];
    __syncthreads();
  }
  if (row < rows && col < hidden) out[(size_t)row * hidden + col] = fmaxf(acc, 0.f);
}

__global__ void fill(float* p, size_t n, float v) {
  const size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n) p[i] = v * (float)((i * 40503u) % 251) / 251.f;
}

static void run_layer(int rank, int nranks, ncclComm_t comm) {
  cudaStream_t stream;
  CK(cudaStreamCreate(&stream));
  const int tokens_per_peer = 512;              // padded rows per (source, expert) pair
  int real_rows[4] = {512, 384, 256, 128};      // rows that carry tokens, by (source + expert) % 4
  const size_t chunk = (size_t)tokens_per_peer * HIDDEN;

  float *tokens, *routed, *weights, *expert_out, *combined;
  CK(cudaMalloc(&tokens, chunk * nranks * sizeof(float)));
  CK(cudaMalloc(&routed, chunk * nranks * sizeof(float)));
  CK(cudaMalloc(&weights, (size_t)HIDDEN * HIDDEN * sizeof(float)));
  CK(cudaMalloc(&expert_out, chunk * nranks * sizeof(float)));
  CK(cudaMalloc(&combined, chunk * nranks * sizeof(float)));
  fill<<<(unsigned)((chunk * nranks + 255) / 256), 256, 0, stream>>>(tokens, chunk * nranks, 1.f + rank);
  fill<<<(HIDDEN * HIDDEN + 255) / 256, 256, 0, stream>>>(weights, (size_t)HIDDEN * HIDDEN, 0.01f);
  CK(cudaMemset(expert_out, 0, chunk * nranks * sizeof(float)));

  for (int w = 0; w < 3; ++w) {
    NK(ncclAlltoAll(tokens, routed, chunk, ncclFloat, comm, stream));
    NK(ncclAlltoAll(expert_out, combined, chunk, ncclFloat, comm, stream));
  }
  CK(cudaStreamSynchronize(stream));

  cudaEvent_t t_begin, t_dispatched, t_computed, t_end;
  CK(cudaEventCreate(&t_begin));
  CK(cudaEventCreate(&t_dispatched));
  CK(cudaEventCreate(&t_computed));
  CK(cudaEventCreate(&t_end));
  CK(cudaEventRecord(t_begin, stream));

  NK(ncclAlltoAll(tokens, routed, chunk, ncclFloat, comm, stream));
  CK(cudaEventRecord(t_dispatched, stream));
  for (int src = 0; src < nranks; ++src) {
    const int rows = real_rows[(src + rank) % 4];
    const dim3 block(TILE, TILE), grid(HIDDEN / TILE, (rows + TILE - 1) / TILE);
    expert_ffn<<<grid, block, 0, stream>>>(routed + src * chunk, weights, expert_out + src * chunk, rows, HIDDEN);
  }
  CK(cudaEventRecord(t_computed, stream));
  NK(ncclAlltoAll(expert_out, combined, chunk, ncclFloat, comm, stream));

  CK(cudaEventRecord(t_end, stream));
  CK(cudaEventSynchronize(t_end));
  float dispatch_ms, expert_ms, combine_ms;
  CK(cudaEventElapsedTime(&dispatch_ms, t_begin, t_dispatched));
  CK(cudaEventElapsedTime(&expert_ms, t_dispatched, t_computed));
  CK(cudaEventElapsedTime(&combine_ms, t_computed, t_end));
  MPI_Barrier(MPI_COMM_WORLD);
  printf("rank %d: dispatch %.3f ms, experts %.3f ms, combine %.3f ms\n", rank, dispatch_ms, expert_ms, combine_ms);

  CK(cudaFree(tokens));
  CK(cudaFree(routed));
  CK(cudaFree(weights));
  CK(cudaFree(expert_out));
  CK(cudaFree(combined));
  CK(cudaStreamDestroy(stream));
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, nranks;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  if (nranks > 4) {
    if (rank == 0) printf("this layer runs on at most 4 ranks\n");
    MPI_Finalize();
    return 1;
  }
  CK(cudaSetDevice(rank));
  ncclUniqueId id;
  if (rank == 0) NK(ncclGetUniqueId(&id));
  MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t comm;
  NK(ncclCommInitRank(&comm, nranks, id, rank));
  run_layer(rank, nranks, comm);
  NK(ncclCommDestroy(comm));
  MPI_Finalize();
  return 0;
}
