// All-to-all by hand: a loop of ncclSend/ncclRecv inside one group, in a helper called from main.
#include <nccl.h>
#define NCCLCHECK(cmd) do { ncclResult_t r_ = (cmd); if (r_ != ncclSuccess) return 3; } while (0)

static int exchange(const float* sendbuf, float* recvbuf, size_t chunk, int nranks, ncclComm_t comm,
                    cudaStream_t stream) {
  NCCLCHECK(ncclGroupStart());
  for (int peer = 0; peer < nranks; ++peer) {
    NCCLCHECK(ncclSend(sendbuf + peer * chunk, chunk, ncclFloat, peer, comm, stream));
    NCCLCHECK(ncclRecv(recvbuf + peer * chunk, chunk, ncclFloat, peer,
                       comm, stream));
  }
  NCCLCHECK(ncclGroupEnd());
  // ncclSend(sendbuf, chunk, ncclFloat, 0, comm, stream); is a comment
  return 0;
}

int main() {
  ncclComm_t comm;
  ncclUniqueId id;
  NCCLCHECK(ncclGetUniqueId(&id));
  NCCLCHECK(ncclCommInitRank(&comm, 4, id, 0));
  float *a, *b;
  cudaMalloc(&a, 1024);
  cudaMalloc(&b, 1024);
  cudaStream_t st;
  cudaStreamCreate(&st);
  ncclGroupStart();
  ncclAllReduce(a, a, 256, ncclFloat, ncclSum, comm, st);
  ncclBroadcast(a, b, 256, ncclFloat, 0, comm, st);
  ncclGroupEnd();
  exchange(a, b, 64, 4, comm, st);
  NCCLCHECK(ncclCommDestroy(comm));
  return 0;
}
