"""Compile tier: GIN on both backends. runtime/gin_compat.h serves NCCL 2.28's GIN device API under `symm`; these
builds check that one source compiles against it and against NCCL's own headers (`nccl`):

  - the GIN sample (sample_kernels/moe_dispatch_combine/device_gin.cu) for symm, its stress build (where the compat
    layer pauses and holds puts back) and for nccl against the wheel's nccl_device/gin.h;
  - the three wrong GIN candidates of the adversarial set (EXPECTED.json entries with `gin`) for symm, plain and
    stress, with the MoE workload's headers;
  - the fast path's scripted GIN answer for both backends (tests/data/fastpath/gemm_stage_b_gin_both.cu);
  - every GIN name gin_compat.h promises, used once (API_SURFACE), for both backends and the symm stress build: if
    the compat layer and NCCL drift apart, one of these stops compiling.
Nothing here runs: tests/gpu/test_gin_gpu.py does, on a GPU.
"""
from __future__ import annotations

import json
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from cuco_kit.evaluate import build as B

ROOT = Path(__file__).resolve().parents[2]
MOE = ROOT / "sample_kernels" / "moe_dispatch_combine"
GEMM = ROOT / "sample_kernels" / "gemm_allgather"
ADVERSARIAL = ROOT / "tests" / "data" / "adversarial"
EXPECTED = {k: v for k, v in json.loads((ADVERSARIAL / "EXPECTED.json").read_text()).items() if not k.startswith("_")}
GIN_WRONG = sorted(name for name, e in EXPECTED.items() if e.get("gin"))
FASTPATH_GIN = ROOT / "tests" / "data" / "fastpath" / "gemm_stage_b_gin_both.cu"
HOOK = "cuco_stress_configure"

# Every name gin_compat.h promises (its header comment), used once; the devComm from cuco_devcomm_create_gin.
API_SURFACE = """#include "cuco_lsa.h"
__global__ void surface(ncclDevComm dc, ncclWindow_t dst, ncclWindow_t src, uint64_t epoch) {
  __shared__ ncclGinDescriptorSmem desc;
  ncclGin gin(dc, blockIdx.x);
  const ncclTeam world = ncclTeamWorld(dc);
  const int peer = (world.rank + 1) % world.nRanks;
  gin.put(world, peer, dst, 0, src, 0, 256, ncclGin_SignalInc{0}, ncclGin_CounterInc{0}, ncclCoopCta());
  if (threadIdx.x < 32)
    gin.put(world, peer, dst, 256, src, 256, 128, ncclGin_SignalAdd{1, 2}, ncclGin_None{}, ncclCoopWarp(),
            ncclGin_DescriptorSmem{&desc});
  if (threadIdx.x == 0) {
    gin.put(world, peer, dst, 512, src, 512, 64);
    gin.putValue(world, peer, dst, 1024, (uint64_t)7, ncclGin_SignalInc{0});
    gin.signal(world, peer, ncclGin_SignalAdd{1, 1});
  }
  gin.flush(ncclCoopCta());
  gin.flush(ncclCoopCta(), cuda::memory_order_acquire);
  gin.waitCounter(ncclCoopCta(), 0, epoch);
  gin.waitSignal(ncclCoopCta(), 0, 2 * epoch);
  if (threadIdx.x < 32) gin.waitSignal(ncclCoopWarp(), 1, 3 * epoch, 64, cuda::memory_order_acquire);
  if (threadIdx.x == 0) {
    const uint64_t v = gin.readSignal(0) + gin.readSignal(1, 32) + gin.readCounter(0) + gin.readCounter(0, 56) +
                       *gin.getSignalShadowPtr(1);
    gin.increaseSignalShadow(1, v & 1);
    gin.waitSignalMeetShadow(ncclCoopThread(), 1);
    if (ncclTeamRankToWorld(dc, world, peer) < 0) {
      gin.resetCounter(0);
      gin.resetSignal(1);
    }
  }
}
struct State { ncclDevComm dc; };
CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  CUCO_CHECK_ABI(ctx);
  if (ctx->backend != cuco_build_backend) return CUCO_ERR_BACKEND;
  State* st = new State();
  int rc = cuco_devcomm_create_gin(ctx, 0, 2, 2, 1, &st->dc);
  if (rc != CUCO_OK) { delete st; return rc; }
  ctx->user = st;
  return CUCO_OK;
}
CUCO_EXPORT int cuco_step(cuco_ctx_t* ctx) {
  State* st = (State*)ctx->user;
  surface<<<2, 64, 0, ctx->stream>>>(st->dc, cuco_window(&ctx->tensors[1]), cuco_window(&ctx->tensors[0]),
                                      ctx->epoch);
  CUCO_CUDA_TRY(cudaGetLastError());
  return CUCO_OK;
}
CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) {
  State* st = (State*)ctx->user;
  int rc = cuco_devcomm_destroy(ctx, &st->dc);
  delete st;
  return rc;
}
"""


def _cases() -> dict[str, tuple[str, str, Path | None, bool]]:
    """name -> (code, backend, workload folder for headers, stress build)."""
    sample = (MOE / "device_gin.cu").read_text()
    out = {
        "device_gin.cu[symm]": (sample, "symm", MOE, False),
        "device_gin.cu[symm, stress]": (sample, "symm", MOE, True),
        "device_gin.cu[nccl]": (sample, "nccl", MOE, False),
        "surface[symm]": (API_SURFACE, "symm", None, False),
        "surface[symm, stress]": (API_SURFACE, "symm", None, True),
        "surface[nccl]": (API_SURFACE, "nccl", None, False),
        "gemm_stage_b_gin_both.cu[symm]": (FASTPATH_GIN.read_text(), "symm", GEMM, False),
        "gemm_stage_b_gin_both.cu[nccl]": (FASTPATH_GIN.read_text(), "nccl", GEMM, False),
    }
    for name in GIN_WRONG:
        code = (ADVERSARIAL / name).read_text()
        out[f"{name}[symm]"] = (code, "symm", MOE, False)
        out[f"{name}[symm, stress]"] = (code, "symm", MOE, True)
    return out


CASES = _cases()

pytestmark = pytest.mark.timeout(12 * 60)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, toolchain: B.BuildConfig) -> dict:
    cfg = toolchain
    cache = tmp_path_factory.mktemp("gin-builds")

    def one(case: tuple[str, str, Path | None, bool]) -> B.BuildResult:
        code, backend, headers, stress = case
        c = B.for_workload(cfg, headers) if headers is not None else cfg
        return B.build(code, backend, B.stress_config(c) if stress else c, cache)

    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {name: pool.submit(one, case) for name, case in CASES.items()}
        return {name: f.result() for name, f in futures.items()}


def test_the_three_wrong_gin_candidates_are_there() -> None:
    assert {EXPECTED[n]["gin"] for n in GIN_WRONG} == {"omits signal wait", "wrong signal value", "missing flush"}


@pytest.mark.parametrize("name", sorted(CASES))
def test_builds(built: dict, name: str) -> None:
    res = built[name]
    assert res.ok, f"{name} failed to build:\n{res.log[-4000:]}"
    backend, stress = CASES[name][1], CASES[name][3]
    if backend == "symm":
        assert "nccl.so" not in res.log.splitlines()[0], "a symm build must not link libnccl"
    if shutil.which("nm"):
        syms = subprocess.run(["nm", "-D", "--defined-only", str(res.so_path)], capture_output=True,
                              text=True).stdout
        assert (HOOK in syms) == stress, f"{name}: {HOOK} exported={HOOK in syms}, stress build={stress}"


def test_the_symm_build_takes_gin_from_the_compat_layer_and_nccl_from_nccl() -> None:
    """Where the names come from: under symm NCCL's device headers are never on the way (gin_compat.h defines
    ncclGin itself); under nccl cuco_lsa.h includes <nccl_device.h>, whose gin.h defines it."""
    runtime = ROOT / "cuco_kit" / "runtime"
    lsa = (runtime / "cuco_lsa.h").read_text()
    switch = lsa[lsa.index("#if defined(CUCO_BUILD_SYMM)"):]
    symm_part, nccl_part = switch.split("#else", 1)
    assert '#include "gin_compat.h"' in symm_part and "nccl_device.h" not in symm_part
    assert "<nccl_device.h>" in nccl_part.split("#endif", 1)[0]
    assert "cuMulticastCreate" not in (runtime / "gin_compat.h").read_text()
