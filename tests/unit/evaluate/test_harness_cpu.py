"""CPU checks of the harness: the ctypes ABI mirror against the C header, timing statistics, verification
maths, reply merging, `cuco eval` on a machine without a GPU, and the parent side staying free of torch."""
from __future__ import annotations

import ctypes
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace as NS
from typing import Any

import pytest
import torch

from cuco_kit.evaluate.gpu_evaluator import merge_replies
from cuco_kit.evaluate.rank import abi
from cuco_kit.evaluate.rank.harness import OracleMissing, _Evaluation, kernel_rows, rel_error
from cuco_kit.evaluate.stats import input_seed, iteration_stats, verified_iterations
from cuco_kit.workload import Tolerance

ROOT = Path(__file__).resolve().parents[3]


CONSTANTS = ("CUCO_ABI_VERSION", "CUCO_MAX_TENSORS", "CUCO_MAX_PARAMS", "CUCO_MAX_SCRATCH", "CUCO_MAX_RANKS",
             "CUCO_NAME_LEN", "CUCO_WAITS_VERSION", "CUCO_WAIT_FLAG", "CUCO_WAIT_LSA_BARRIER", "CUCO_WAIT_HOST_NCCL",
             "CUCO_WAIT_GIN_SIGNAL", "CUCO_WAIT_GIN_COUNTER", "CUCO_WAIT_LIMIT", "CUCO_WAIT_ABORT")


def _c_layout_program() -> str:
    lines = ['#include <stdio.h>', '#include <stddef.h>', '#include "cuco_abi.h"', '#include "cuco_waits.h"',
             "int main(void) {"]
    for tag, struct, ctype in (("tensor", abi.CucoTensor, "cuco_tensor_t"), ("flags", abi.CucoFlags, "cuco_flags_t"),
                               ("scratch_req", abi.CucoScratchRequest, "cuco_scratch_request_t"),
                               ("ctx", abi.CucoCtx, "cuco_ctx_t"), ("wait_ctl", abi.CucoWaitCtl, "cuco_wait_ctl_t")):
        lines.append(f'  printf("sizeof.{tag} %zu\\n", sizeof({ctype}));')
        for name, _ in struct._fields_:
            lines.append(f'  printf("{tag}.{name} %zu\\n", offsetof({ctype}, {name}));')
    for name in CONSTANTS:
        lines.append(f'  printf("const.{name} %d\\n", (int){name});')
    lines += ["  return 0;", "}"]
    return "\n".join(lines) + "\n"


def test_ctypes_struct_matches_header(tmp_path: Path) -> None:
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        pytest.skip("no C compiler")
    cuda_inc = Path("/usr/local/cuda/include")
    if not (cuda_inc / "cuda_runtime_api.h").exists():
        pytest.skip("cuda_runtime_api.h not found")
    src = tmp_path / "layout.c"
    src.write_text(_c_layout_program())
    exe = tmp_path / "layout"
    subprocess.run([gcc, "-std=c11", f"-I{ROOT / 'cuco_kit' / 'runtime'}", f"-I{cuda_inc}", str(src), "-o", str(exe)],
                   check=True, capture_output=True, timeout=120)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True, timeout=30).stdout
    c = {k: int(v) for k, v in (line.split() for line in out.strip().splitlines())}
    py = abi.layout()
    for key, value in py.items():
        assert c[key] == value, f"{key}: header says {c[key]}, ctypes mirror says {value}"
    for name in CONSTANTS:
        assert c[f"const.{name}"] == getattr(abi, name), name
    assert abi.new_ctx().struct_size == c["sizeof.ctx"]


def test_set_name_refuses_overlong_names() -> None:
    ctx = abi.new_ctx()
    abi.set_name(ctx.tensors[1], "name", "longer_name")
    abi.set_name(ctx.tensors[1], "name", "x")  # shorter over longer: no leftover bytes
    assert ctx.tensors[1].name == b"x" and ctx.tensors[0].name == b""
    abi.set_name(ctx, "param_names", "N_PER_RANK", 2)
    assert bytes(ctx.param_names[2]).rstrip(b"\0") == b"N_PER_RANK" and bytes(ctx.param_names[1]).strip(b"\0") == b""
    with pytest.raises(ValueError):
        abi.set_name(ctx.tensors[0], "name", "n" * abi.CUCO_NAME_LEN)


def test_iteration_time_is_max_over_ranks_then_median_and_spread() -> None:
    per_rank = [[1.0, 5.0, 2.0, 2.0, 3.0], [2.0, 1.0, 2.5, 9.0, 1.0], [0.5, 0.5, 0.5, 0.5, 0.5]]
    st = iteration_stats(per_rank)
    assert st["iteration_ms"] == [2.0, 5.0, 2.5, 9.0, 3.0]
    assert st["median_ms"] == 3.0
    # numpy-style linear percentiles of [2, 2.5, 3, 5, 9]: p10 = 2.2, p90 = 7.4
    assert math.isclose(st["p10_ms"], 2.2) and math.isclose(st["p90_ms"], 7.4)
    assert math.isclose(st["spread_ms"], 5.2)
    assert st["per_rank_median_ms"] == [2.0, 2.0, 0.5]


def test_iteration_stats_rejects_ragged_and_bad_input() -> None:
    with pytest.raises(ValueError):
        iteration_stats([[1.0, 2.0], [1.0]])
    with pytest.raises(ValueError):
        iteration_stats([[1.0, float("nan")]])
    with pytest.raises(ValueError):
        iteration_stats([])


def test_verified_iterations_first_plus_about_one_in_k() -> None:
    picked = verified_iterations(3000, 3, seed=5)
    assert picked[0] == 0
    assert picked == verified_iterations(3000, 3, seed=5)  # every rank picks the same
    assert picked != verified_iterations(3000, 3, seed=6)
    assert 800 < len(picked) < 1200
    assert verified_iterations(10, 1, seed=0) == list(range(10))


def test_input_seeds_differ_per_trial_and_rank() -> None:
    seeds = {input_seed(0, t, r) for t in range(50) for r in range(8)}
    assert len(seeds) == 400
    assert input_seed(1, 0, 0) != input_seed(0, 0, 0)


def test_rel_error_nan_never_passes_and_prefix_is_compared() -> None:
    ref = torch.arange(1, 9, dtype=torch.float32)
    out = ref.clone().to(torch.bfloat16)
    assert rel_error(out, ref) == 0.0
    bad = out.clone()
    bad[3] = float("nan")
    assert rel_error(bad, ref) == math.inf
    longer = torch.cat([out, torch.full((4,), float("nan"), dtype=torch.bfloat16)])
    assert rel_error(longer, ref) == 0.0  # only the valid prefix is compared
    assert rel_error(out[:4], ref) == math.inf
    off = out.float() * 1.01
    assert math.isclose(rel_error(off, ref), 0.01, rel_tol=1e-4)


def test_merge_replies_prefers_the_rank_that_failed_itself() -> None:
    replies = [{"verdict": "fail", "level": "L2", "reason": "verification failed on a peer in trial 1"},
               {"verdict": "fail", "level": "L2", "reason": "verification failed: rank 1: output 'y' wrong"}]
    res = merge_replies(replies, {})
    assert res.verdict == "fail" and "rank 1" in res.reason and res.median_ms is None
    res = merge_replies([{"verdict": "pass", "times_ms": [1.0, 2.0, 3.0]}, None], {})
    assert res.verdict == "fail" and res.median_ms is None
    res = merge_replies([{"verdict": "pass", "times_ms": [1.0, 4.0, 3.0], "max_rel_err": 0.0},
                         {"verdict": "pass", "times_ms": [2.0, 1.0, 3.5], "max_rel_err": 1e-3}], {})
    assert res.verdict == "pass" and res.level_reached == "L3"
    assert res.iteration_ms == [2.0, 4.0, 3.5] and res.median_ms == 3.5 and res.max_rel_err == 1e-3


def test_cuco_eval_without_gpu_says_which_levels_were_not_run(tmp_path: Path) -> None:
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not installed: L1 cannot run here")
    # an nvidia-smi that finds no GPU comes first on PATH: no GPU, whatever this machine has
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed: no devices were found' >&2\nexit 9\n")
    fake.chmod(0o755)
    env = dict(os.environ)
    env.update(PATH=f"{bindir}:{os.environ.get('PATH', '')}", HOME=str(tmp_path), PYTHONPATH=str(ROOT))
    cand = ROOT / "sample_kernels" / "allgather" / "device_lsa.cu"
    p = subprocess.run([sys.executable, "-m", "cuco_kit.cli", "eval", str(cand), "--workload",
                        str(ROOT / "sample_kernels" / "allgather"), "--ranks", "2", "--backend", "symm", "--json"],
                       capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    assert p.returncode == 0, (p.stdout[:1500] + p.stderr[-3000:])
    out = json.loads(p.stdout)
    assert out["verdict"] == "unavailable"
    assert out["reason"] == "no GPU: L2/L3 not evaluated"
    assert out["level_reached"] == "L1"
    assert out["levels_not_run"] == ["L2", "L3"]
    assert out["median_ms"] is None and out["speedup"] is None
    assert "build" in out["logs"]


def test_the_parent_side_imports_neither_torch_nor_the_rank_package() -> None:
    # Only rank processes may touch CUDA: every module of cuco_kit.evaluate outside evaluate/rank/ must import
    # without torch (a fresh interpreter, so nothing this test process imported counts).
    parent = sorted(f"cuco_kit.evaluate.{p.stem}" for p in (ROOT / "cuco_kit" / "evaluate").glob("*.py")
                    if p.stem != "__init__")
    code = (f"import importlib, json, sys\nfor m in {parent!r}:\n    importlib.import_module(m)\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'torch' "
            "or m.startswith('cuco_kit.evaluate.rank'))))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "cuco_kit.evaluate.gpu_evaluator" in parent and "cuco_kit.evaluate.stats" in parent
    assert json.loads(p.stdout) == [], "the parent side imported torch or the rank package"


def test_kernel_rows_keep_gpu_kernels_with_stream_and_times():
    ev = [NS(device_type="DeviceType.CUDA", name="gemm", device_resource_id=7, time_range=NS(start=20.0, end=35.0)),
          NS(device_type="DeviceType.CPU", name="cudaLaunchKernel", device_resource_id=0,
             time_range=NS(start=1.0, end=2.0)),
          NS(device_type="DeviceType.CUDA", name="put", device_resource_id=9, time_range=NS(start=10.0, end=12.5))]
    rows = kernel_rows(ev, rank=3)
    assert rows == [{"rank": 3, "stream": 9, "name": "put", "start_us": 10.0, "dur_us": 2.5},
                    {"rank": 3, "stream": 7, "name": "gemm", "start_us": 20.0, "dur_us": 15.0}]


# ---- the capture pass's verdicts, with the CUDA helper replaced by scripted codes -------------------------

class _ScriptedHelpers:
    """cuco_h_capture's out[6] = (step rc, begin, end capture, instantiate, launch, last error)."""

    def __init__(self, out: tuple[int, ...]) -> None:
        self.out = out

    def cuco_h_capture(self, step, ctx, stream, launch, out) -> int:
        for i, v in enumerate(self.out):
            out[i] = v
        return 0

    @staticmethod
    def error_name(code: int) -> str:
        return f"code{code}"


def _captured(out: tuple[int, ...]) -> tuple[str, Any]:
    step = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)(lambda ctx: 0)
    ev = _Evaluation.__new__(_Evaluation)
    ev.h = NS(helpers=_ScriptedHelpers(out), stream=NS(cuda_stream=0))
    ev.lib = NS(cuco_step=step)
    ev.ctx, ev.notes, ev.recycle = abi.new_ctx(), [], False
    ev._eager_after_capture = lambda: ""  # the eager re-run itself needs a GPU
    return ev._captured_step(), ev


@pytest.mark.timeout(60)
def test_a_step_that_refuses_capture_keeps_its_worker() -> None:
    # MoE-style: the step synchronises on purpose, the capture is invalidated (901), nothing else went wrong
    reason, ev = _captured((1, 0, 901, 0, 0, 901))
    assert reason == "" and not ev.recycle
    assert any("inconclusive" in n for n in ev.notes)


@pytest.mark.timeout(60)
def test_a_non_capture_error_after_an_invalidated_capture_recycles_the_worker() -> None:
    reason, ev = _captured((1, 0, 901, 0, 0, 700))  # cudaErrorIllegalAddress raised by then
    assert reason == "" and ev.recycle


@pytest.mark.timeout(60)
def test_unjoined_side_stream_work_fails_and_recycles() -> None:
    reason, ev = _captured((0, 0, 904, 0, 0, 904))
    assert "never rejoins" in reason and ev.recycle


# ---- differential verification: the seed as the oracle -------------------------------------------------------

def _oracle_eval(monkeypatch: pytest.MonkeyPatch, h: Any, role: str, key: str = "k") -> _Evaluation:
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)  # the checks themselves run on the CPU
    ev = _Evaluation.__new__(_Evaluation)
    ev.h, ev.role, ev.oracle, ev.max_err = h, role, "seed", 0.0
    ev.cmd = {"oracle_key": key}
    ev._view = lambda name: ev.current[name]  # type: ignore[method-assign]
    return ev


def _oracle_harness() -> Any:
    def no_reference(*a: Any) -> Any:
        raise AssertionError("a seed-oracle workload's torch reference must not be called")

    agreed: list[bool] = []
    return NS(rank=0, world=1, dev="cpu", oracle_key="", oracle_outputs={}, agreed=agreed,
              _host_agree=lambda failed: agreed.append(bool(failed)) or bool(failed),
              workload=NS(tolerance=Tolerance(rel=1e-3), reference=no_reference))


@pytest.mark.timeout(60)
def test_the_seed_records_its_outputs_and_a_candidate_is_compared_with_them(monkeypatch) -> None:
    h = _oracle_harness()
    seed = _oracle_eval(monkeypatch, h, "seed")
    seed._oracle_ready()
    out = torch.randn(64)
    seed.current = {"y": out.clone()}
    assert seed._verify(7, {}, {"y": out.clone()}, "trial 7") == ""
    assert h.oracle_key == "k" and torch.equal(h.oracle_outputs[7]["y"], out)

    cand = _oracle_eval(monkeypatch, h, "candidate")
    cand._oracle_ready()
    close = out * (1 + 1e-5)
    cand.current = {"y": close}
    assert cand._verify(7, {}, {"y": close.clone()}, "trial 7") == "" and cand.max_err < 1e-4
    wrong = out.clone()
    wrong[:8] = 0
    cand.current = {"y": wrong}
    reason = cand._verify(7, {}, {"y": wrong.clone()}, "trial 7")
    assert "output 'y' wrong in trial 7" in reason and "rel err" in reason


@pytest.mark.timeout(60)
def test_a_seed_that_leaves_poison_cannot_be_the_oracle(monkeypatch) -> None:
    h = _oracle_harness()
    seed = _oracle_eval(monkeypatch, h, "seed")
    seed._oracle_ready()
    out = torch.randn(16)
    out[3] = float("nan")
    seed.current = {"y": out.clone()}
    reason = seed._verify(0, {}, {"y": out.clone()}, "trial 1")
    assert "cannot serve as the oracle" in reason and "1 non-finite" in reason and 0 not in h.oracle_outputs


@pytest.mark.timeout(60)
def test_a_candidate_never_meets_another_requests_seed(monkeypatch) -> None:
    h = _oracle_harness()
    seed = _oracle_eval(monkeypatch, h, "seed", key="seed-a:0")
    seed._oracle_ready()
    other = _oracle_eval(monkeypatch, h, "candidate", key="seed-a:1")  # another request seed: other inputs
    with pytest.raises(OracleMissing, match="not in this world"):
        other._oracle_ready()
    same = _oracle_eval(monkeypatch, h, "candidate", key="seed-a:0")
    same._oracle_ready()
    same.current = {"y": torch.ones(4)}
    with pytest.raises(OracleMissing, match="no outputs for timed iteration 3"):
        same._verify(2002, {}, {"y": torch.ones(4)}, "timed iteration 3")
    assert h.agreed[-1] is True  # the peers learn of it through the same agreement and fail with it


# ---- host NCCL under symm: only a library that exports the bind entry point gets a staging window ----------------
# (the binding itself, with a real symm library on the CPU: tests/compile/test_host_nccl_symm.py)

@pytest.mark.timeout(60)
@pytest.mark.parametrize("backend, lib", [("symm", NS()), ("nccl", NS(cuco_host_nccl_bind=object()))])
def test_no_staging_window_without_host_nccl_under_symm(backend: str, lib: Any) -> None:
    def no_window(*a: Any) -> Any:
        raise AssertionError("a staging window was allocated")

    ev = _Evaluation.__new__(_Evaluation)
    ev.h = NS(backend_name=backend, host_nccl_staging=None, backend=NS(alloc_window=no_window))
    ev.ctx, ev.lib = abi.new_ctx(), lib
    ev._bind_host_nccl()
    assert ev.h.host_nccl_staging is None and not ev.ctx.nccl_comm
