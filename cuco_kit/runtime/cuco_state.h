// SPDX-License-Identifier: Apache-2.0
/*
 * cuco_state.h — the ABI's lifecycle for a candidate that keeps its per-rank state in ctx->user (C++).
 *
 *   struct State { ...; int release(cuco_ctx_t* ctx); };   // frees what setup made, also after a partial setup
 *                                                          // (a State that owns nothing but its fields, a seed's
 *                                                          // sizes and pointers say, leaves release out)
 *
 *   cuco_setup:    State* s = cuco_state<State>::open(ctx, ...);   // new State{...}, kept in ctx->user
 *                  ... rc = each setup step while rc == CUCO_OK ...
 *                  return cuco_state<State>::settle(ctx, rc);      // last line of setup
 *   cuco_step:     State* s = cuco_state<State>::get(ctx);         // nullptr before a successful setup
 *   cuco_teardown: return cuco_state<State>::close(ctx);
 *
 *   int cuco_alloc_zeroed(T** p, size_t n);   // n zeroed device elements (arrival counters a kernel spins on)
 *
 * Why settle synchronises the device: setup's cudaMemset and uploads run on the legacy stream, and step 1's
 * kernels on ctx->stream (non-blocking) must see zeroed counters. Why close runs on failure too: a setup that
 * fails half-way leaves nothing behind for the harness to leak, and ctx->user is never a dangling pointer.
 */
#ifndef CUCO_STATE_H_
#define CUCO_STATE_H_

#include <stddef.h>
#include <cuda_runtime_api.h>
#include "cuco_abi.h"
#include "cuco_errors.h"

#ifdef __cplusplus
#include <type_traits>
#include <utility>

// Whether State declares int release(cuco_ctx_t*): close calls it only then.
template <class State, class = void>
struct cuco_state_has_release : std::false_type {};
template <class State>
struct cuco_state_has_release<State, std::void_t<decltype(std::declval<State&>().release((cuco_ctx_t*)nullptr))>>
    : std::true_type {};

template <class State>
struct cuco_state {
  template <class... Args>
  static State* open(cuco_ctx_t* ctx, Args&&... args) {
    State* s = new State{std::forward<Args>(args)...};
    ctx->user = s;
    return s;
  }

  static State* get(const cuco_ctx_t* ctx) { return static_cast<State*>(ctx->user); }

  // Setup's end: on success wait for setup's device work; on failure release what was made.
  static int settle(cuco_ctx_t* ctx, int rc) {
    if (rc == CUCO_OK) rc = cuco_cuda_status(cudaDeviceSynchronize());
    if (rc != CUCO_OK) (void)close(ctx);
    return rc;
  }

  // Teardown: release where State has one (its status is the teardown's), delete, and forget the state.
  static int close(cuco_ctx_t* ctx) {
    State* s = get(ctx);
    ctx->user = nullptr;
    if (s == nullptr) return CUCO_OK;
    int rc = CUCO_OK;
    if constexpr (cuco_state_has_release<State>::value) rc = s->release(ctx);
    delete s;
    return rc;
  }
};

template <class T>
static inline int cuco_alloc_zeroed(T** p, size_t n) {
  CUCO_CUDA_TRY(cudaMalloc((void**)p, n * sizeof(T)));
  CUCO_CUDA_TRY(cudaMemset(*p, 0, n * sizeof(T)));
  return CUCO_OK;
}
#endif /* __cplusplus */

#endif /* CUCO_STATE_H_ */
