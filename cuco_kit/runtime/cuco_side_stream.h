// SPDX-License-Identifier: Apache-2.0
/*
 * cuco_side_stream.h — a second stream for work that overlaps ctx->stream (puts beside GEMMs, say), forked off
 * ctx->stream and joined back to it within one cuco_step, as the ABI requires.
 *
 *   cuco_side_stream_t side = {0};
 *   int cuco_side_stream_create(cuco_side_stream_t* s);          // setup: stream and its two events
 *   int cuco_side_stream_fork(cuco_side_stream_t* s, cudaStream_t from);  // side waits for `from`'s work so far
 *   int cuco_side_stream_join(cuco_side_stream_t* s, cudaStream_t into);  // `into` waits for side's work so far
 *   void cuco_side_stream_destroy(cuco_side_stream_t* s);        // teardown; also after a partial create
 * Each returns CUCO_OK or CUCO_ERR_CUDA. A fork or join may be repeated within a step: a wait takes the event's
 * latest record at the time of the wait.
 *
 * Why the highest priority: a consumer on ctx->stream may spin on a flag that only the side stream's kernel will
 * raise. The side stream's CTAs are then dispatched ahead of queued ctx->stream CTAs, so the producer is not
 * starved of SMs by its own consumers (the harness's capture pass keeps per-node priorities for the same reason).
 * Non-blocking: no implicit synchronisation with the legacy default stream.
 */
#ifndef CUCO_SIDE_STREAM_H_
#define CUCO_SIDE_STREAM_H_

#include <cuda_runtime_api.h>
#include "cuco_abi.h"
#include "cuco_errors.h"

typedef struct cuco_side_stream {
  cudaStream_t stream;
  cudaEvent_t fork; /* recorded on the main stream, waited for by the side stream */
  cudaEvent_t join; /* recorded on the side stream, waited for by the main stream */
} cuco_side_stream_t;

static inline int cuco_side_stream_create(cuco_side_stream_t* s) {
  int lowest = 0, highest = 0;
  CUCO_CUDA_TRY(cudaDeviceGetStreamPriorityRange(&lowest, &highest));
  CUCO_CUDA_TRY(cudaStreamCreateWithPriority(&s->stream, cudaStreamNonBlocking, highest));
  CUCO_CUDA_TRY(cudaEventCreateWithFlags(&s->fork, cudaEventDisableTiming));
  CUCO_CUDA_TRY(cudaEventCreateWithFlags(&s->join, cudaEventDisableTiming));
  return CUCO_OK;
}

static inline int cuco_side_stream_fork(cuco_side_stream_t* s, cudaStream_t from) {
  CUCO_CUDA_TRY(cudaEventRecord(s->fork, from));
  CUCO_CUDA_TRY(cudaStreamWaitEvent(s->stream, s->fork, 0));
  return CUCO_OK;
}

static inline int cuco_side_stream_join(cuco_side_stream_t* s, cudaStream_t into) {
  CUCO_CUDA_TRY(cudaEventRecord(s->join, s->stream));
  CUCO_CUDA_TRY(cudaStreamWaitEvent(into, s->join, 0));
  return CUCO_OK;
}

static inline void cuco_side_stream_destroy(cuco_side_stream_t* s) {
  if (s->join) cudaEventDestroy(s->join);
  if (s->fork) cudaEventDestroy(s->fork);
  if (s->stream) cudaStreamDestroy(s->stream);
  s->join = s->fork = NULL;
  s->stream = NULL;
}

#endif /* CUCO_SIDE_STREAM_H_ */
