// A collective on a communicator the analysis cannot trace back to its creation (it comes out of a function
// defined in another file), so the importer cannot tell the world it runs on.
#include <cuda_runtime.h>
#include <nccl.h>
ncclComm_t get_comm_from_framework();
int main() {
  ncclComm_t c = get_comm_from_framework();
  float *x, *y;
  cudaMalloc(&x, 1024 * sizeof(float));
  cudaMalloc(&y, 1024 * sizeof(float));
  for (int i = 0; i < 4; ++i) ncclAllReduce(x, y, 1024, ncclFloat, ncclSum, c, 0);
  cudaDeviceSynchronize();
  return 0;
}
