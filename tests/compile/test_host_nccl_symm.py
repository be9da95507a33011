"""Compile tier: host NCCL under symm (runtime/symm_nccl/nccl.h + host_nccl_compat.h), checked without a GPU.

- The compat header mirrors the installed NCCL's nccl.h: every type, enum value, version macro and the signature of
  every function it serves (one C++ program compiled against each header, outputs compared).
- It compiles on its own, under nvcc (definitions) and g++ (declarations only).
- A symm library's host side runs on the CPU: the harness binds it (RankHarness's _bind_host_nccl with a fake
  staging window in host memory), and the queries, the refused setup calls and the argument errors answer as
  NCCL's would, with ncclGetLastError saying why; none of these reaches CUDA.
- The stress build exports cuco_stress_configure and keeps the LSA barrier's pauses when <nccl.h> comes first.
- The importer's contract: an imported seed whose header says `backends=nccl,symm` and whose setup checks only
  ctx->nccl_comm builds for symm. The gpu tier's test programs (tests/data/host_nccl/) build for symm too.
(Every sample's seed_nccl.cu builds for symm without libnccl in test_compile_samples.py.)
"""
from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace as NS

import pytest

from cuco_kit.evaluate import build as B

ROOT = Path(__file__).resolve().parents[2]
COMPAT = B.RUNTIME_DIR / B.SYMM_NCCL_SUBDIR
HOST_NCCL_DATA = ROOT / "tests" / "data" / "host_nccl"

pytestmark = pytest.mark.timeout(600)


def _toolchain() -> B.BuildConfig:
    cfg = B.BuildConfig()
    if shutil.which(cfg.nvcc) is None and not Path(cfg.nvcc).exists():
        pytest.skip(f"nvcc not found ({cfg.nvcc})")
    if cfg.nccl_include is None:
        pytest.skip("nvidia-nccl wheel (headers) not installed")
    return cfg


def _gxx() -> str:
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ not found")
    return gxx


# ---- the header against NCCL's ------------------------------------------------------------------------------

ENUMS = {
    "ncclResult_t": ["ncclSuccess", "ncclUnhandledCudaError", "ncclSystemError", "ncclInternalError",
                     "ncclInvalidArgument", "ncclInvalidUsage", "ncclRemoteError", "ncclInProgress", "ncclNumResults"],
    "ncclRedOp_t": ["ncclSum", "ncclProd", "ncclMax", "ncclMin", "ncclAvg", "ncclNumOps", "ncclMaxRedOp"],
    "ncclDataType_t": ["ncclInt8", "ncclChar", "ncclUint8", "ncclInt32", "ncclInt", "ncclUint32", "ncclInt64",
                       "ncclUint64", "ncclFloat16", "ncclHalf", "ncclFloat32", "ncclFloat", "ncclFloat64",
                       "ncclDouble", "ncclBfloat16", "ncclFloat8e4m3", "ncclFloat8e5m2", "ncclNumTypes"],
}
MACROS = ["NCCL_MAJOR", "NCCL_MINOR", "NCCL_PATCH", "NCCL_VERSION_CODE", "NCCL_VERSION(2, 28, 9)",
          "NCCL_UNIQUE_ID_BYTES", "NCCL_CONFIG_UNDEF_INT", "NCCL_SPLIT_NOCOLOR"]
CONFIG_FIELDS = ["size", "magic", "version", "blocking", "cgaClusterSize", "minCTAs", "maxCTAs", "netName",
                 "splitShare", "trafficClass", "commName", "collnetEnable", "CTAPolicy", "shrinkShare", "nvlsCTAs",
                 "nChannelsPerNetPeer", "nvlinkCentricSched"]
# Every served function with NCCL's exact type: the same file must compile against both headers.
SIGNATURES = {
    "ncclGetVersion": "ncclResult_t (*)(int*)",
    "ncclGetErrorString": "const char* (*)(ncclResult_t)",
    "ncclGetLastError": "const char* (*)(ncclComm_t)",
    "ncclCommGetAsyncError": "ncclResult_t (*)(ncclComm_t, ncclResult_t*)",
    "ncclCommCount": "ncclResult_t (*)(const ncclComm_t, int*)",
    "ncclCommCuDevice": "ncclResult_t (*)(const ncclComm_t, int*)",
    "ncclCommUserRank": "ncclResult_t (*)(const ncclComm_t, int*)",
    "ncclMemAlloc": "ncclResult_t (*)(void**, size_t)",
    "ncclMemFree": "ncclResult_t (*)(void*)",
    "ncclGetUniqueId": "ncclResult_t (*)(ncclUniqueId*)",
    "ncclCommInitRank": "ncclResult_t (*)(ncclComm_t*, int, ncclUniqueId, int)",
    "ncclCommInitRankConfig": "ncclResult_t (*)(ncclComm_t*, int, ncclUniqueId, int, ncclConfig_t*)",
    "ncclCommInitAll": "ncclResult_t (*)(ncclComm_t*, int, const int*)",
    "ncclCommFinalize": "ncclResult_t (*)(ncclComm_t)",
    "ncclCommDestroy": "ncclResult_t (*)(ncclComm_t)",
    "ncclCommAbort": "ncclResult_t (*)(ncclComm_t)",
    "ncclReduce": "ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t, "
                  "cudaStream_t)",
    "ncclBcast": "ncclResult_t (*)(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t)",
    "ncclBroadcast": "ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t)",
    "ncclAllReduce": "ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, "
                     "cudaStream_t)",
    "ncclReduceScatter": "ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, "
                         "cudaStream_t)",
    "ncclAllGather": "ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t)",
    "ncclAlltoAll": "ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t)",
    "ncclGather": "ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t)",
    "ncclScatter": "ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t)",
    "ncclSend": "ncclResult_t (*)(const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t)",
    "ncclRecv": "ncclResult_t (*)(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t)",
    "ncclGroupStart": "ncclResult_t (*)()",
    "ncclGroupEnd": "ncclResult_t (*)()",
}


def _mirror_program() -> str:
    lines = ["#include <nccl.h>", "#include <stddef.h>", "#include <stdio.h>", "#include <type_traits>", ""]
    for name, sig in SIGNATURES.items():
        lines.append(f'static_assert(std::is_same<decltype(&{name}), {sig}>::value, "{name}");')
    lines += ["int main() {", '  printf("sizeof ncclUniqueId %zu\\n", sizeof(ncclUniqueId));',
              '  printf("sizeof ncclConfig_t %zu\\n", sizeof(ncclConfig_t));',
              '  printf("sizeof ncclRedOp_t %zu\\n", sizeof(ncclRedOp_t));',
              '  printf("sizeof ncclDataType_t %zu\\n", sizeof(ncclDataType_t));',
              '  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;',
              '  printf("config init %zu %x %u %d\\n", c.size, c.magic, c.version, c.blocking);']
    for f in CONFIG_FIELDS:
        lines.append(f'  printf("offsetof {f} %zu\\n", offsetof(ncclConfig_t, {f}));')
    for values in ENUMS.values():
        for v in values:
            lines.append(f'  printf("{v} %lld\\n", (long long){v});')
    for m in MACROS:
        lines.append(f'  printf("{m} %lld\\n", (long long)({m}));')
    lines += ["  return 0;", "}"]
    return "\n".join(lines) + "\n"


def _run_against(include: Path, cfg: B.BuildConfig, tmp: Path) -> str:
    src = tmp / "mirror.cpp"
    src.write_text(_mirror_program())
    exe = tmp / f"mirror-{include.name}"
    out = subprocess.run([_gxx(), "-std=c++17", "-Wall", "-Wextra", "-Werror", f"-I{include}",
                          f"-I{cfg.toolkit_include}", str(src), "-o", str(exe)], capture_output=True, text=True)
    assert out.returncode == 0, f"against {include}:\n{out.stderr[-3000:]}"
    return subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout


def test_compat_header_mirrors_the_installed_nccl_h(tmp_path: Path) -> None:
    cfg = _toolchain()
    assert cfg.nccl_include is not None
    ours = _run_against(COMPAT, cfg, tmp_path)
    theirs = _run_against(cfg.nccl_include, cfg, tmp_path)
    assert ours == theirs
    assert "NCCL_VERSION_CODE 22809" in ours  # the release it mirrors; a new wheel means reviewing the header


def test_compat_header_compiles_on_its_own(tmp_path: Path) -> None:
    cfg = _toolchain()
    src = tmp_path / "alone.cu"
    src.write_text("#include <nccl.h>\n")
    nvcc = subprocess.run([cfg.nvcc, "-std=c++17", "-c", *cfg.gencode, "-Xcompiler", "-Wall,-Wextra", "-Werror",
                           "all-warnings", f"-I{COMPAT}", f"-I{B.RUNTIME_DIR}", str(src), "-o",
                           str(tmp_path / "alone.o")], capture_output=True, text=True)
    assert nvcc.returncode == 0, nvcc.stdout + nvcc.stderr
    host = tmp_path / "alone.cpp"
    host.write_text("#include <nccl.h>\n")
    gxx = subprocess.run([_gxx(), "-std=c++17", "-fsyntax-only", "-Wall", "-Wextra", "-Werror", f"-I{COMPAT}",
                          f"-I{cfg.toolkit_include}", str(host)], capture_output=True, text=True)
    assert gxx.returncode == 0, gxx.stderr


# ---- the host side on the CPU ----------------------------------------------------------------------------------

PROBE = r"""#include <nccl.h>
#include "cuco_abi.h"

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) { return ctx->nccl_comm != NULL ? CUCO_OK : CUCO_ERR_BACKEND; }
CUCO_EXPORT int cuco_step(cuco_ctx_t*) { return CUCO_OK; }
CUCO_EXPORT int cuco_teardown(cuco_ctx_t*) { return CUCO_OK; }

// out: rank, count, device, version, the async error
CUCO_EXPORT int probe_queries(cuco_ctx_t* ctx, int* out) {
  ncclComm_t c = (ncclComm_t)ctx->nccl_comm;
  ncclResult_t async = ncclInProgress;
  const ncclResult_t r[5] = {ncclCommUserRank(c, &out[0]), ncclCommCount(c, &out[1]), ncclCommCuDevice(c, &out[2]),
                             ncclGetVersion(&out[3]), ncclCommGetAsyncError(c, &async)};
  out[4] = async;
  for (ncclResult_t x : r)
    if (x != ncclSuccess) return x;
  return ncclSuccess;
}

// Calls that settle before any CUDA work: refusals, argument errors, nothing to move. buf is never touched.
CUCO_EXPORT int probe_call(cuco_ctx_t* ctx, int which) {
  ncclComm_t c = (ncclComm_t)ctx->nccl_comm;
  float* buf = (float*)0x1000;
  ncclUniqueId id = {};
  ncclComm_t other = NULL;
  switch (which) {
    case 0: return ncclGetUniqueId(&id);
    case 1: return ncclCommInitRank(&other, 2, id, 0);
    case 2: return ncclAllReduce(buf, buf, 16, ncclFloat, (ncclRedOp_t)7, c, 0);
    case 3: return ncclAllReduce(buf, buf, 16, (ncclDataType_t)12, ncclSum, c, 0);
    case 4: return ncclAllReduce(buf, buf, 0, ncclFloat, ncclSum, c, 0);
    case 5: return ncclBroadcast(buf, buf, 16, ncclFloat, 5, c, 0);
    case 6: return ncclSend(buf, 16, ncclFloat, -1, c, 0);
    case 7:
      ncclGroupStart();
      ncclSend(buf, 16, ncclFloat, ctx->rank, c, 0);
      ncclRecv(buf, 8, ncclFloat, ctx->rank, c, 0);
      return ncclGroupEnd();
    case 8: return ncclGroupEnd();
    case 9: return ncclAllReduce(buf, buf, 16, ncclFloat, ncclSum, (ncclComm_t)&id, 0);
    case 10: return ncclCommDestroy(c);
    default: return -1;
  }
}

CUCO_EXPORT const char* probe_last_error(void) { return ncclGetLastError(NULL); }
"""

# which -> (ncclResult_t, what ncclGetLastError says)
EXPECTED = {
    0: (5, "harness owns the communicator"),
    1: (5, "harness owns the communicator"),
    2: (4, "reduction op 7 is not a built-in one"),
    3: (4, "data type 12 is not an ncclDataType_t"),
    4: (0, ""),
    5: (4, "root 5 is not a rank of this 2-rank communicator"),
    6: (4, "peer -1 is not a rank"),
    7: (5, "sends 64 bytes to itself but receives 32"),
    8: (5, "ncclGroupEnd without ncclGroupStart"),
    9: (4, "comm is not this rank's communicator"),
    10: (0, ""),
}


class _HostWindows:
    """A symm backend stand-in: 'symmetric' windows in host memory, every rank's at its own address."""

    def __init__(self, world: int) -> None:
        self.world = world

    def alloc_window(self, name: str, nbytes: int):
        import torch

        from cuco_kit.evaluate.rank.backends import Window

        per_rank = [torch.zeros(nbytes, dtype=torch.uint8) for _ in range(self.world)]
        peers = [t.data_ptr() for t in per_rank]
        return Window(name, nbytes, nbytes, peers[0], peers, torch.tensor(peers), per_rank[0], None, per_rank)


def _probe_evaluation(so: Path, staging_bytes: int, monkeypatch: pytest.MonkeyPatch):
    from cuco_kit.evaluate.rank import abi, harness

    monkeypatch.setattr(harness, "HOST_NCCL_STAGING_BYTES", staging_bytes)
    h = NS(backend_name="symm", backend=_HostWindows(2), host_nccl_staging=None, rank=0, world=2,
           _host_agree=lambda failed: bool(failed))
    ev = harness._Evaluation.__new__(harness._Evaluation)
    ev.h, ev.ctx = h, abi.new_ctx()
    ev.ctx.rank, ev.ctx.world_size, ev.ctx.device = 0, 2, 3
    ev.lib = ctypes.CDLL(str(so), mode=os.RTLD_NOW | os.RTLD_LOCAL)
    return ev


@pytest.fixture(scope="module")
def probe_so(tmp_path_factory: pytest.TempPathFactory) -> Path:
    res = B.build(PROBE, "symm", _toolchain(), tmp_path_factory.mktemp("probe"))
    assert res.ok and res.so_path is not None, res.log[-3000:]
    return res.so_path


def test_the_harness_binds_a_host_nccl_library_and_its_calls_answer_like_nccl(probe_so: Path, monkeypatch) -> None:
    ev = _probe_evaluation(probe_so, 1 << 20, monkeypatch)
    ev._bind_host_nccl()
    assert ev.ctx.nccl_comm, "bind left ctx->nccl_comm NULL"
    assert ev.h.host_nccl_staging is not None and ev.h.host_nccl_staging.alloc_bytes == 1 << 20
    ev.lib.probe_last_error.restype = ctypes.c_char_p
    out = (ctypes.c_int * 5)()
    assert ev.lib.probe_queries(ctypes.byref(ev.ctx), out) == 0
    assert list(out) == [0, 2, 3, 22809, 0]  # rank, count, device, NCCL_VERSION_CODE, no async error
    for which, (code, why) in EXPECTED.items():
        assert ev.lib.probe_call(ctypes.byref(ev.ctx), which) == code, (which, ev.lib.probe_last_error())
        if why:
            assert why in ev.lib.probe_last_error().decode(), (which, ev.lib.probe_last_error())
    staging = ev.h.host_nccl_staging
    ev.ctx.nccl_comm = None
    ev._bind_host_nccl()  # a second load: the same window, zeroed again
    assert ev.h.host_nccl_staging is staging and ev.ctx.nccl_comm


def test_a_staging_window_too_small_to_bind_fails_l2_with_the_reason(probe_so: Path, monkeypatch) -> None:
    from cuco_kit.evaluate.rank.harness import CandidateFailure

    ev = _probe_evaluation(probe_so, 4096 + 512, monkeypatch)  # flag words, then no 256-byte chunk per peer
    with pytest.raises(CandidateFailure, match="cuco_host_nccl_bind returned CUCO_ERR_PARAM") as e:
        ev._bind_host_nccl()
    assert e.value.level == "L2" and not ev.ctx.nccl_comm


# ---- the stress build ------------------------------------------------------------------------------------------

STRESS_ORDER = r"""#include <nccl.h>
#include "cuco_lsa.h"
#ifndef CUCO_STRESS_LSA_BARRIER_H_
#error "the stress build lost the LSA barrier's pauses when <nccl.h> came first"
#endif
__global__ void k(ncclDevComm dc) {
  ncclLsaBarrierSession<ncclCoopCta> b(ncclCoopCta(), dc, ncclTeamTagLsa{}, blockIdx.x);
  b.sync(ncclCoopCta(), cuda::memory_order_relaxed);
}
CUCO_EXPORT int cuco_setup(cuco_ctx_t*) { return CUCO_OK; }
CUCO_EXPORT int cuco_step(cuco_ctx_t* ctx) {
  return ncclAllGather(ctx->tensors[0].local, ctx->tensors[1].local, 1, ncclInt, (ncclComm_t)ctx->nccl_comm,
                       ctx->stream) == ncclSuccess ? CUCO_OK : CUCO_ERR_NCCL;
}
CUCO_EXPORT int cuco_teardown(cuco_ctx_t*) { return CUCO_OK; }
"""


def test_the_stress_build_pauses_host_nccl_and_keeps_the_barrier_wrapper(tmp_path: Path) -> None:
    cfg = _toolchain()
    assert B.has_stress_hooks(STRESS_ORDER, "symm")
    res = B.build(STRESS_ORDER, "symm", B.stress_config(cfg), tmp_path)
    assert res.ok and res.so_path is not None, res.log[-3000:]
    if shutil.which("nm"):
        syms = subprocess.run(["nm", "-D", "--defined-only", str(res.so_path)], capture_output=True, text=True).stdout
        assert "cuco_stress_configure" in syms and "cuco_host_nccl_bind" in syms


# ---- the importer's contract and the gpu tier's programs ----------------------------------------------------------

IMPORTED_HEADER = ("// cuco: backends=nccl\n", "// cuco: backends=nccl,symm\n")
IMPORTED_SETUP = ("if (ctx->backend != CUCO_BACKEND_NCCL || ctx->nccl_comm == NULL) return CUCO_ERR_BACKEND;",
                  "if (ctx->nccl_comm == NULL) return CUCO_ERR_BACKEND;")


@pytest.mark.parametrize("program", ["allreduce_norm.cu", "ring_attention.cu"])
def test_an_imported_seed_with_the_symm_contract_builds_for_symm(program: str, tmp_path: Path) -> None:
    from cuco_kit.importer.session import ImportSession

    cfg = _toolchain()
    seed = ImportSession(ROOT / "cuco_kit" / "importer" / "examples" / program, tmp_path / "wl").skeleton
    for old, new in (IMPORTED_HEADER, IMPORTED_SETUP):  # the two lines the contract asks of the importer
        if old in seed:
            seed = seed.replace(old, new)
        assert new in seed, f"the seed has neither {old.strip()!r} nor {new.strip()!r}"
    assert B.supported_backends(seed) == ("nccl", "symm")
    res = B.build(seed, "symm", cfg, tmp_path / "cache")
    assert res.ok, res.log[-3000:]


@pytest.mark.parametrize("name, workload", [("host_nccl_ops.cu", HOST_NCCL_DATA),
                                            ("unjoined_gather.cu", ROOT / "sample_kernels" / "gemm_allgather")])
def test_the_gpu_tiers_host_nccl_programs_build_for_symm(name: str, workload: Path, tmp_path: Path) -> None:
    cfg = B.for_workload(_toolchain(), workload)
    res = B.build((HOST_NCCL_DATA / name).read_text(), "symm", cfg, tmp_path)
    assert res.ok, res.log[-3000:]
