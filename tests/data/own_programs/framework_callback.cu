// A host-driven program written for cuco-kit's importer tests (not a sample), in the shape of NCCL's documented
// examples: main() hands the work to a launcher defined in another file (launch_ranks, declared in the program's
// own header), which calls damp_and_reduce() once per rank. That function creates the communicator, then
// iterates on the default stream: a kernel damps the local field by a factor that depends on the iteration and
// adds a source, and an in-place all-reduce sums the fields over the ranks, until the iteration count is reached.
#include "framework_callback_common.h"

using scalar_t = float;

__global__ void damp(scalar_t* field, int n, int iteration) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) field[i] = field[i] * (0.5f / (1 + iteration)) + 0.001f * (i % 64);
}

void* damp_and_reduce(int rank, int nranks, int device) {
  ncclUniqueId id;
  share_id(rank, &id);
  CHECK_CUDA(cudaSetDevice(device));
  ncclComm_t comm;
  CHECK_NCCL(ncclCommInitRank(&comm, nranks, id, rank));

  const int n = 256 * 1024;
  scalar_t* field;
  CHECK_CUDA(cudaMalloc(&field, n * sizeof(scalar_t)));
  CHECK_CUDA(cudaMemset(field, 0, n * sizeof(scalar_t)));
  if (rank == 0) printf("damping %d cells on %d ranks\n", n, nranks);

  int iteration = 0;
  while (iteration < 50) {
    damp<<<(n + 255) / 256, 256>>>(field, n, iteration);
    CHECK_NCCL(ncclAllReduce(field, field, n, ncclFloat, ncclSum, comm, 0));
    ++iteration;
  }
  CHECK_CUDA(cudaDeviceSynchronize());
  if (rank == 0) printf("done after %d iterations\n", iteration);

  CHECK_CUDA(cudaFree(field));
  CHECK_NCCL(ncclCommDestroy(comm));
  return nullptr;
}

int main(int argc, char** argv) { return launch_ranks(argc, argv, damp_and_reduce); }
