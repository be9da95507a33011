"""Compile tier: the runtime's host helpers (cuco_errors.h, cuco_side_stream.h, cuco_devcomm_create_lsa_world)
build with nvcc for both backends, each used once, and cuco_errors.h gains its NCCL part whichever of it and
<nccl.h> a seed includes first (a later include of the header adds it)."""
from __future__ import annotations

from pathlib import Path

import pytest

from cuco_kit.evaluate import build as B

pytestmark = pytest.mark.timeout(300)

# Every host helper a device-initiated candidate gets with cuco_lsa.h; the NCCL error helpers only where NCCL is.
DEVICE_HELPERS = """#include <cublas_v2.h>
#include "cuco_lsa.h"
struct State { ncclDevComm dc; cuco_side_stream_t side; };
__global__ void noop() {}
static int launch(cudaStream_t stream) {
  noop<<<1, 1, 0, stream>>>();
  return cuco_cuda_status(cudaGetLastError());
}
CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  CUCO_CHECK_ABI(ctx);
  State* st = new State();
  ctx->user = st;
  CUCO_TRY(cuco_devcomm_create_lsa_world(ctx, 1, &st->dc));
  CUCO_CUBLAS_TRY(cublasSetStream((cublasHandle_t)ctx->cublas, ctx->stream));
#if !CUCO_LSA_COMPAT
  CUCO_NCCL_TRY((ncclComm_t)ctx->nccl_comm, ncclGroupStart());
  CUCO_TRY(cuco_nccl_status((ncclComm_t)ctx->nccl_comm, ncclGroupEnd()));
#endif
  return cuco_side_stream_create(&st->side);
}
CUCO_EXPORT int cuco_step(cuco_ctx_t* ctx) {
  State* st = (State*)ctx->user;
  CUCO_TRY(cuco_side_stream_fork(&st->side, ctx->stream));
  CUCO_TRY(launch(st->side.stream));
  return cuco_side_stream_join(&st->side, ctx->stream);
}
CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) {
  State* st = (State*)ctx->user;
  cuco_side_stream_destroy(&st->side);
  const int rc = cuco_devcomm_destroy(ctx, &st->dc);
  delete st;
  return rc;
}
"""

# A host-NCCL seed that includes the error header before <nccl.h>, then again.
SEED_ORDER = """#include "cuco_errors.h"
#include <nccl.h>
#include "cuco_errors.h"
CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) { CUCO_CHECK_ABI(ctx); return CUCO_OK; }
CUCO_EXPORT int cuco_step(cuco_ctx_t* ctx) {
  ncclComm_t comm = (ncclComm_t)ctx->nccl_comm;
  CUCO_NCCL_TRY(comm, ncclAllReduce(ctx->tensors[0].local, ctx->tensors[0].local, 1, ncclFloat, ncclSum, comm,
                                    ctx->stream));
  return cuco_nccl_status(comm, ncclSuccess);
}
CUCO_EXPORT int cuco_teardown(cuco_ctx_t*) { return CUCO_OK; }
"""



@pytest.mark.parametrize("backend", B.BACKENDS)
def test_device_candidate_helpers_build(backend: str, tmp_path: Path, toolchain: B.BuildConfig) -> None:
    res = B.build(DEVICE_HELPERS, backend, toolchain, tmp_path)
    assert res.ok, res.log[-4000:]


def test_error_header_before_nccl_gains_its_nccl_part(tmp_path: Path, toolchain: B.BuildConfig) -> None:
    res = B.build(SEED_ORDER, "nccl", toolchain, tmp_path)
    assert res.ok, res.log[-4000:]
