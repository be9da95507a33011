"""Every sample on a real GPU, quickly: both seeds and the device-initiated baseline (its default knob values)
pass L2 with fresh inputs at world size 1 (`nccl`) and 2 ranks (`symm` + compat), at each sample's small
presets, the MoE sample's 8-bit dispatch included. The full knob grids and the timings are the benchmarks'
job (benchmarks/<sample>/run.py); this is the gpu tier's regression check, quick enough to run on every GPU run.
Every build is made at once before the first case; a case's worlds end with it (no later case uses them). Quick
form: one preset per sample, the richest."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from cuco_kit.evaluate.api import EvalRequest
from cuco_kit.evaluate.device import gpu_present
from cuco_kit.workload import load_workload

ROOT = Path(__file__).resolve().parents[2]
L2_TRIALS = 3
WORLDS = ((1, "nccl"), (2, "symm"))

pytestmark = pytest.mark.skipif(not gpu_present(), reason="needs an NVIDIA GPU (nvidia-smi)")

SLOW = pytest.mark.slow
CASES = [
    pytest.param("gemm_allgather", "small"),
    pytest.param("moe_dispatch_combine", "small_skew5", marks=SLOW),
    pytest.param("moe_dispatch_combine", "small_fp8", marks=SLOW),
    pytest.param("moe_dispatch_combine", "small_skew5_fp8"),
    pytest.param("attention_cp", "small"),
    pytest.param("attention_cp", "small_noncausal", marks=SLOW),
    pytest.param("kv_transfer", "small", marks=SLOW),
    pytest.param("kv_transfer", "small_paged"),
]


def sources(wl_dir: Path) -> dict[str, list[str]]:
    baseline = load_workload(wl_dir).baseline
    return {"nccl": ["seed_nccl.cu", "seed_copy.cu", baseline], "symm": ["seed_copy.cu", baseline]}


@pytest.fixture(scope="module")
def prebuilt(evaluator) -> None:
    """Every sample's sources for both worlds (timed and stress builds), in parallel: nvcc runs side by side
    instead of one build per evaluation."""
    dirs = sorted({ROOT / "sample_kernels" / c.values[0] for c in CASES})
    reqs = [EvalRequest(candidate_code=(d / name).read_text(), workload_dir=str(d), world_size=world, backend=backend)
            for d in dirs for world, backend in WORLDS for name in sources(d)[backend]]
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(evaluator.prebuild, reqs))  # a failed build shows as that case's L1 failure


@pytest.mark.timeout(600)
@pytest.mark.parametrize("sample, preset", CASES)
def test_seeds_and_baseline_pass_l2_at_one_and_two_ranks(evaluator, prebuilt, sample: str, preset: str) -> None:
    wl_dir = ROOT / "sample_kernels" / sample
    wl = load_workload(wl_dir)
    params = wl.resolve(wl.size_presets[preset])
    failures = []
    for world, backend in WORLDS:
        for name in sources(wl_dir)[backend]:
            r = evaluator.evaluate(EvalRequest(candidate_code=(wl_dir / name).read_text(), workload_dir=str(wl_dir),
                                               params=params, world_size=world, backend=backend, iters=2,
                                               trials=L2_TRIALS, measure_seed=False, label=name))
            if r.verdict != "pass":
                failures.append(f"{name} {backend}-{world}: {r.verdict} at {r.level_reached}: {r.reason[:200]}")
    evaluator.pool.close()  # this case's worlds (its sizes) are not used again: free their ranks and GPU memory
    assert not failures, "\n".join(failures)
