"""Compile tier: the runtime's bounded waits (runtime/cuco_waits.h) build into every kind of library that has waits
and export the entry point the harness binds them through; the entry point refuses a control block of another
layout before it touches CUDA (checked here, without a GPU).

- a device-initiated candidate (cuco_wait, cuco_wait_until, the LSA barrier) for both backends, timed and stress;
- a host-NCCL seed under symm (its waits are the compat layer's);
- a seed without the runtime's waits exports nothing to bind.
The numbers a bound wait produces need the GPU: tests/gpu/test_bounded_waits_gpu.py."""
from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from cuco_kit.evaluate import build as B
from cuco_kit.evaluate.device import gpu_present
from cuco_kit.evaluate.rank import abi, waits

ROOT = Path(__file__).resolve().parents[2]
ALLGATHER = ROOT / "sample_kernels" / "allgather"
BIND = "cuco_waits_bind"

pytestmark = pytest.mark.timeout(600)

# Every bounded wait of a device-initiated candidate, each used once.
WAITS = """#include "cuco_lsa.h"
__global__ void waits(ncclDevComm dc, uint64_t* const* flags, uint64_t epoch, int* reached) {
  ncclLsaBarrierSession<ncclCoopCta> bar(ncclCoopCta(), dc, ncclTeamTagLsa{}, blockIdx.x);
  bar.sync(ncclCoopCta(), cuda::memory_order_acq_rel);
  if (threadIdx.x == 0) {
    cuco_signal(cuco_user_flag(flags, dc.rank, 0), epoch);
    reached[0] = cuco_wait(cuco_user_flag(flags, dc.rank, 0), epoch);
    reached[1] = cuco_wait_until(cuco_user_flag(flags, dc.rank, 1), epoch, cuda::memory_order_relaxed);
  }
}
CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  CUCO_CHECK_ABI(ctx);
  ncclDevComm* dc = new ncclDevComm();
  ctx->user = dc;
  return cuco_devcomm_create_lsa_world(ctx, 1, dc);
}
CUCO_EXPORT int cuco_step(cuco_ctx_t* ctx) {
  ncclDevComm* dc = (ncclDevComm*)ctx->user;
  waits<<<1, 32, 0, ctx->stream>>>(*dc, ctx->flags.peers, ctx->epoch, (int*)ctx->tensors[0].local);
  return cuco_cuda_status(cudaGetLastError());
}
CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) {
  ncclDevComm* dc = (ncclDevComm*)ctx->user;
  const int rc = cuco_devcomm_destroy(ctx, dc);
  delete dc;
  return rc;
}
"""



def _exports(so: Path) -> str:
    if shutil.which("nm") is None:
        pytest.skip("nm not found")
    return subprocess.run(["nm", "-D", "--defined-only", str(so)], capture_output=True, text=True).stdout


def _built(code: str, backend: str, cfg: B.BuildConfig, cache: Path) -> Path:
    res = B.build(code, backend, cfg, cache)
    assert res.ok and res.so_path is not None, res.log[-4000:]
    return res.so_path


@pytest.mark.parametrize("backend", B.BACKENDS)
@pytest.mark.parametrize("stress", [False, True], ids=["timed", "stress"])
def test_every_wait_of_a_device_candidate_builds_bounded(backend: str, stress: bool, tmp_path: Path,
                                                          toolchain: B.BuildConfig) -> None:
    so = _built(WAITS, backend, B.stress_config(toolchain) if stress else toolchain, tmp_path)
    names = _exports(so)
    assert BIND in names
    assert ("cuco_stress_configure" in names) == stress
    assert "spin" not in names  # the wait's out-of-line spin stays inside the module


def test_host_nccl_under_symm_binds_its_waits_and_a_seed_without_waits_has_none(tmp_path: Path,
                                                                                 toolchain: B.BuildConfig) -> None:
    cfg = B.for_workload(toolchain, ALLGATHER)
    assert BIND in _exports(_built((ALLGATHER / "seed_nccl.cu").read_text(), "symm", cfg, tmp_path))
    assert BIND not in _exports(_built((ALLGATHER / "seed_copy.cu").read_text(), "symm", cfg, tmp_path))


def test_bind_refuses_another_layout_before_it_touches_cuda(tmp_path: Path, toolchain: B.BuildConfig) -> None:
    lib = ctypes.CDLL(str(_built(WAITS, "symm", toolchain, tmp_path)), mode=os.RTLD_NOW | os.RTLD_LOCAL)
    bind = getattr(lib, BIND)
    bind.argtypes = [ctypes.c_void_p]
    bind.restype = ctypes.c_int
    ctl = abi.CucoWaitCtl()
    assert bind(ctypes.addressof(ctl)) == 1  # zeroed: no version, CUCO_ERR_ABI
    waits.reset(ctl, 2.0)
    ctl.struct_size -= 8
    assert bind(ctypes.addressof(ctl)) == 1
    waits.reset(ctl, 2.0)
    # this layout: the pointer is copied to the device (CUCO_OK), which fails without one (CUCO_ERR_CUDA)
    assert bind(ctypes.addressof(ctl)) == (0 if gpu_present() else 2)
