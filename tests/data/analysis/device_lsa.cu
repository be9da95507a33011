// Device-initiated: stores into peers through LSA pointers, then a per-source flag spin-wait. No host collectives
// (the word ncclAllGather below sits in a string, and ncclGroupStart in a comment).
#include "cuco_lsa.h"

__device__ __forceinline__ unsigned long long load_acquire(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__global__ void push_and_wait(ncclDevComm dc, ncclWindow_t win, const float* src, size_t n,
                              unsigned long long* flags, unsigned long long epoch) {
  float* dst = (float*)ncclGetLsaPointer(win, 0, 1);
  for (size_t i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
  while (load_acquire(&flags[blockIdx.x]) < epoch) {
  }
}

CUCO_EXPORT int cuco_step(cuco_ctx_t* ctx) {
  const char* note = "ncclAllGather replaced";  // ncclGroupStart();
  push_and_wait<<<4, 128, 0, ctx->stream>>>(*(ncclDevComm*)ctx->user, (ncclWindow_t)ctx->tensors[0].window,
                                            (const float*)ctx->tensors[0].local, 1024,
                                            ctx->flags.local, ctx->epoch);
  (void)note;
  return 0;
}
