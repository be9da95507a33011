"""Compile tier: the stress build (-DCUCO_STRESS=1, runtime/cuco_stress.h) of every sample and adversarial source
with waits to instrument (the runtime's signalling primitives; host NCCL under symm) builds for every backend where
it has them, exports the hook the harness configures it through, and the plain build of the same source (what
world size 1 loads) does not export it.

The plain builds of the same files (the new adversarial ones included) are test_compile_samples.py's; the stress
build is what the harness loads at two ranks and more, for the L2 trials and then, pauses off, for timing
(cuco_kit/evaluate/gpu_evaluator.py). The race
classes written with raw atomics get one too (they include cuco_lsa.h): it pauses nothing of theirs, and the
harness's own perturbation has to show them (rank/perturb.py).
"""
from __future__ import annotations

import json
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from cuco_kit.evaluate import build as B
from cuco_kit.workload import sample_workloads

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "sample_kernels"
ADVERSARIAL = ROOT / "tests" / "data" / "adversarial"
# Every sample's stress build for every backend; of the adversarial set, the signalling-race classes (EXPECTED.json
# entries with a `race`), under symm (where the GPU tier runs them; their plain builds for both backends are
# test_compile_samples'), each with its workload's headers.
EXPECTED = {k: v for k, v in json.loads((ADVERSARIAL / "EXPECTED.json").read_text()).items() if not k.startswith("_")}
RACES = {name: ROOT / e.get("workload", "sample_kernels/allgather") for name, e in EXPECTED.items() if e.get("race")}


def cases(root: Path = ROOT) -> list[tuple[Path, str]]:
    """(source, backend) of every stress build: each sample folder's sources under ``root`` (the folders, so a new
    sample is built with no list to edit) for each backend where they have waits to instrument, then the race
    classes under symm."""
    samples = [p for d in sample_workloads(root) for p in sorted(d.glob("**/*.cu"))]
    return ([(p, b) for p in samples for b in B.supported_backends(p.read_text())
             if B.has_stress_hooks(p.read_text(), b)]
            + [(p, "symm") for p in sorted(ADVERSARIAL.glob("*.cu")) if p.name in RACES])


CASES = cases()
HOOK = "cuco_stress_configure"
BUDGET_S = 12 * 60

pytestmark = pytest.mark.timeout(BUDGET_S)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, toolchain: B.BuildConfig) -> dict:
    cfg = toolchain
    cache = tmp_path_factory.mktemp("stress-builds")
    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=2) as pool:
        jobs = {(p, b): pool.submit(B.build, p.read_text(), b, B.stress_config(B.for_workload(cfg, _headers(p))), cache)
                for p, b in CASES}
        results = {k: f.result() for k, f in jobs.items()}
    return {"results": results, "wall_s": time.monotonic() - t0}


def _headers(p: Path) -> Path:
    """The folder whose headers a source builds with: its own, or for a race class its workload's."""
    return RACES[p.name] if p.parent == ADVERSARIAL else p.parent


def _exports(so: Path) -> str:
    return subprocess.run(["nm", "-D", "--defined-only", str(so)], capture_output=True, text=True).stdout


def test_every_sample_and_race_class_is_covered() -> None:
    names = {(p.parent.name, p.name) for p, _ in CASES}
    for d in sample_workloads(ROOT):
        wl = d.name
        assert (wl, "device_lsa.cu") in names
        # host NCCL: its symm build pauses in the compat layer's waits; under nccl the waits are NCCL's own
        seed = SAMPLES / wl / "seed_nccl.cu"
        assert (seed, "symm") in CASES and (seed, "nccl") not in CASES
    assert {n for _, n in names} >= set(RACES)
    assert {"raw_flag_before_stores.cu", "gemm_raw_flag_before_stores.cu", "raw_omits_wait.cu",
            "gemm_raw_omits_wait.cu", "raw_wrong_unit_flag.cu"} <= set(RACES)


@pytest.mark.parametrize("case", CASES, ids=[f"{p.relative_to(ROOT)}[{b}]" for p, b in CASES])
def test_stress_build_compiles_and_exports_the_hook(built: dict, case: tuple[Path, str]) -> None:
    res = built["results"][case]
    assert res.ok, f"stress build of {case[0].name} [{case[1]}] failed:\n{res.log[-4000:]}"
    assert B.STRESS_DEFINE in res.log.splitlines()[0]
    if shutil.which("nm"):
        assert HOOK in _exports(res.so_path)


def test_the_timed_build_has_no_stress_hook(tmp_path: Path) -> None:
    cfg = B.BuildConfig()
    if shutil.which(cfg.nvcc) is None or cfg.nccl_include is None or shutil.which("nm") is None:
        pytest.skip("nvcc, the NCCL wheel or nm missing")
    src = ROOT / "tests" / "data" / "adversarial" / "flag_before_stores.cu"
    res = B.build(src.read_text(), "symm", cfg, tmp_path)
    assert res.ok, res.log[-3000:]
    assert HOOK not in _exports(res.so_path)
