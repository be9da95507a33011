// A host-driven program written for cuco-kit's importer tests (not a sample): explicit 1D heat diffusion on a
// periodic rod split over the ranks. Every time step each rank sends its edge cells to its two neighbours and
// receives theirs into its halo cells (ncclSend/ncclRecv in a group, on a communication stream), then updates
// its cells on the compute stream; a heat source pulses at the centre of each rank's part, with an amplitude that
// depends on the time step. No MPI: the launcher sets RANK, WORLD_SIZE and LOCAL_RANK, and the ranks share the
// NCCL unique id through a file that rank 0 writes.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unistd.h>
#include <cuda_runtime.h>
#include <nccl.h>

#define CHECK_CUDA(x)                                                       \
  do {                                                                      \
    cudaError_t err = (x);                                                  \
    if (err != cudaSuccess) {                                               \
      fprintf(stderr, "CUDA %s at line %d\n", cudaGetErrorString(err), __LINE__); \
      abort();                                                              \
    }                                                                       \
  } while (0)
#define CHECK_NCCL(x)                                                       \
  do {                                                                      \
    ncclResult_t res = (x);                                                 \
    if (res != ncclSuccess) {                                               \
      fprintf(stderr, "NCCL %s at line %d\n", ncclGetErrorString(res), __LINE__); \
      abort();                                                              \
    }                                                                       \
  } while (0)

#define NX (1 << 20)              // cells per rank
constexpr int kHalo = 2 * 64;     // halo width in cells, each side
constexpr int kSteps = 100;

// u_next[i] = u[i] + alpha (u[i - 1] - 2 u[i] + u[i + 1]) over this rank's cells (the halos are read only)
__global__ void diffuse(const float* u, float* u_next, int nx, int halo, float alpha) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= nx) return;
  const int c = halo + i;
  u_next[c] = u[c] + alpha * (u[c - 1] - 2.f * u[c] + u[c + 1]);
}

// the pulsed source: its amplitude depends on the time step
__global__ void heat_source(float* u, int cell, int step) {
  if (threadIdx.x == 0 && blockIdx.x == 0) u[cell] += 0.5f * (1.f + sinf(0.05f * (float)step));
}

__global__ void initial_temperature(float* u, int nx, int halo, int rank) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < nx + 2 * halo) u[i] = (i >= halo && i < nx + halo) ? 1.f + 0.1f * rank : 0.f;
}

static int env_int(const char* name, int fallback) {
  const char* v = getenv(name);
  return v ? atoi(v) : fallback;
}

static void share_unique_id(ncclUniqueId* id, int rank, const char* path) {
  if (rank == 0) {
    CHECK_NCCL(ncclGetUniqueId(id));
    FILE* f = fopen(path, "wb");
    fwrite(id, sizeof(*id), 1, f);
    fclose(f);
    return;
  }
  for (;;) {
    FILE* f = fopen(path, "rb");
    if (f != nullptr && fread(id, sizeof(*id), 1, f) == 1) {
      fclose(f);
      return;
    }
    if (f != nullptr) fclose(f);
    usleep(10000);
  }
}

int main() {
  const int rank = env_int("RANK", 0);
  const int world = env_int("WORLD_SIZE", 1);
  CHECK_CUDA(cudaSetDevice(env_int("LOCAL_RANK", 0)));
  const char* id_file = getenv("NCCL_ID_FILE") ? getenv("NCCL_ID_FILE") : "/tmp/heat_halo.id";
  ncclUniqueId id;
  share_unique_id(&id, rank, id_file);
  ncclComm_t comm;
  CHECK_NCCL(ncclCommInitRank(&comm, world, id, rank));

  cudaStream_t compute, halo_stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamCreateWithFlags(&halo_stream, cudaStreamNonBlocking));
  cudaEvent_t cells_ready, halos_ready;
  CHECK_CUDA(cudaEventCreateWithFlags(&cells_ready, cudaEventDisableTiming));
  CHECK_CUDA(cudaEventCreateWithFlags(&halos_ready, cudaEventDisableTiming));

  const int left = (rank + world - 1) % world, right = (rank + 1) % world;
  const int threads = 256, blocks = (NX + threads - 1) / threads;
  const float alpha = 0.2f;
  const size_t rod_bytes = (size_t)(NX + 2 * kHalo) * sizeof(float);
  float *u, *u_next;
  CHECK_CUDA(cudaMalloc(&u, rod_bytes));
  CHECK_CUDA(cudaMalloc(&u_next, rod_bytes));
  initial_temperature<<<(NX + 2 * kHalo + 255) / 256, 256, 0, compute>>>(u, NX, kHalo, rank);

  for (int t = 0; t < kSteps; ++t) {
    CHECK_CUDA(cudaEventRecord(cells_ready, compute));
    CHECK_CUDA(cudaStreamWaitEvent(halo_stream, cells_ready, 0));
    CHECK_NCCL(ncclGroupStart());
    CHECK_NCCL(ncclSend(u + kHalo, kHalo, ncclFloat, left, comm, halo_stream));
    CHECK_NCCL(ncclSend(u + NX, kHalo, ncclFloat, right, comm, halo_stream));
    CHECK_NCCL(ncclRecv(u, kHalo, ncclFloat, left, comm, halo_stream));
    CHECK_NCCL(ncclRecv(u + NX + kHalo, kHalo, ncclFloat, right, comm, halo_stream));
    CHECK_NCCL(ncclGroupEnd());
    CHECK_CUDA(cudaEventRecord(halos_ready, halo_stream));
    CHECK_CUDA(cudaStreamWaitEvent(compute, halos_ready, 0));
    diffuse<<<blocks, threads, 0, compute>>>(u, u_next, NX, kHalo, alpha);
    heat_source<<<1, 32, 0, compute>>>(u_next, kHalo + NX / 2, t);
    CHECK_CUDA(cudaMemcpyAsync(u + kHalo, u_next + kHalo, (size_t)NX * sizeof(float), cudaMemcpyDeviceToDevice,
                               compute));
  }
  CHECK_CUDA(cudaStreamSynchronize(compute));
  if (rank == 0) printf("heat: %d steps of %d cells per rank on %d ranks\n", kSteps, NX, world);

  CHECK_CUDA(cudaFree(u));
  CHECK_CUDA(cudaFree(u_next));
  CHECK_NCCL(ncclCommDestroy(comm));
  return 0;
}
