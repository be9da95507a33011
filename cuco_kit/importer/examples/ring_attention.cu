// A host-driven test program (written for cuco-kit's importer tests, not a sample): a ring exchange of key/value
// blocks with ncclSend/ncclRecv in a group, on a communication stream, overlapping an attention-like kernel
// over the local block on the compute stream; a second kernel merges in the block that arrived. The ranks agree
// on an NCCL unique id through a file-free exchange (MPI here).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#define CHECK_CUDA(x) do { if ((x) != cudaSuccess) { fprintf(stderr, "cuda failure\n"); exit(1); } } while (0)
#define CHECK_NCCL(x) do { if ((x) != ncclSuccess) { fprintf(stderr, "nccl failure\n"); exit(1); } } while (0)

constexpr int SEQ = 128;   // keys (and queries) per rank
constexpr int DIM = 64;    // head dimension
constexpr int ITERS = 20;

// Attention of this rank's queries over one key/value block (kv holds SEQ keys, then SEQ values): for each
// query row, the block's softmax numerator-weighted values (acc), its running max (m) and denominator (l).
__global__ void attend_block(const float* q, const float* kv, float* acc, float* ml, int seq, int dim) {
  const int row = blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= seq) return;
  const float* k = kv;
  const float* v = kv + (size_t)seq * dim;
  const float scale = rsqrtf((float)dim);
  float m = -INFINITY;
  for (int j = 0; j < seq; ++j) {
    float s = 0.f;
    for (int d = 0; d < dim; ++d) s += q[row * dim + d] * k[j * dim + d];
    m = fmaxf(m, s * scale);
  }
  float l = 0.f;
  for (int d = 0; d < dim; ++d) acc[row * dim + d] = 0.f;
  for (int j = 0; j < seq; ++j) {
    float s = 0.f;
    for (int d = 0; d < dim; ++d) s += q[row * dim + d] * k[j * dim + d];
    const float p = expf(s * scale - m);
    l += p;
    for (int d = 0; d < dim; ++d) acc[row * dim + d] += p * v[j * dim + d];
  }
  ml[2 * row] = m;
  ml[2 * row + 1] = l;
}

// out = softmax over both blocks: merge the local block's (acc, m, l) with the remote block's.
__global__ void merge_blocks(const float* acc_a, const float* ml_a, const float* acc_b, const float* ml_b,
                             float* out, int seq, int dim) {
  const int row = blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= seq) return;
  const float ma = ml_a[2 * row], la = ml_a[2 * row + 1];
  const float mb = ml_b[2 * row], lb = ml_b[2 * row + 1];
  const float m = fmaxf(ma, mb);
  const float wa = expf(ma - m), wb = expf(mb - m);
  const float denom = la * wa + lb * wb;
  for (int d = 0; d < dim; ++d)
    out[row * dim + d] = (acc_a[row * dim + d] * wa + acc_b[row * dim + d] * wb) / denom;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int me, world;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  ncclUniqueId uid;
  if (me == 0) ncclGetUniqueId(&uid);
  MPI_Bcast(&uid, sizeof(uid), MPI_BYTE, 0, MPI_COMM_WORLD);
  CHECK_CUDA(cudaSetDevice(me));
  ncclComm_t ring;
  CHECK_NCCL(ncclCommInitRank(&ring, world, uid, me));

  cudaStream_t compute, comm_stream;
  CHECK_CUDA(cudaStreamCreate(&compute));
  CHECK_CUDA(cudaStreamCreateWithFlags(&comm_stream, cudaStreamNonBlocking));
  cudaEvent_t arrived;
  CHECK_CUDA(cudaEventCreateWithFlags(&arrived, cudaEventDisableTiming));

  const int next = (me + 1) % world;
  const int prev = (me + world - 1) % world;
  const size_t kv_elems = 2 * (size_t)SEQ * DIM;
  float *q, *kv_local, *kv_remote, *acc_local, *ml_local, *acc_remote, *ml_remote, *out;
  CHECK_CUDA(cudaMalloc(&q, SEQ * DIM * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&kv_local, kv_elems * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&kv_remote, kv_elems * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&acc_local, SEQ * DIM * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&ml_local, 2 * SEQ * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&acc_remote, SEQ * DIM * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&ml_remote, 2 * SEQ * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&out, SEQ * DIM * sizeof(float)));

  for (int it = 0; it < ITERS; ++it) {
    CHECK_NCCL(ncclGroupStart());
    CHECK_NCCL(ncclSend(kv_local, kv_elems, ncclFloat, next, ring, comm_stream));
    CHECK_NCCL(ncclRecv(kv_remote, kv_elems, ncclFloat, prev, ring, comm_stream));
    CHECK_NCCL(ncclGroupEnd());
    attend_block<<<(SEQ + 127) / 128, 128, 0, compute>>>(q, kv_local, acc_local, ml_local, SEQ, DIM);
    CHECK_CUDA(cudaEventRecord(arrived, comm_stream));
    CHECK_CUDA(cudaStreamWaitEvent(compute, arrived, 0));
    attend_block<<<(SEQ + 127) / 128, 128, 0, compute>>>(q, kv_remote, acc_remote, ml_remote, SEQ, DIM);
    merge_blocks<<<(SEQ + 127) / 128, 128, 0, compute>>>(acc_local, ml_local, acc_remote, ml_remote, out, SEQ,
                                                          DIM);
  }
  CHECK_CUDA(cudaStreamSynchronize(compute));

  cudaFree(q); cudaFree(kv_local); cudaFree(kv_remote); cudaFree(acc_local); cudaFree(ml_local);
  cudaFree(acc_remote); cudaFree(ml_remote); cudaFree(out);
  ncclCommDestroy(ring);
  MPI_Finalize();
  return 0;
}
