"""Every sample on a real GPU, quickly: both seeds and the device-initiated baseline (its default knob values)
pass L2 with fresh inputs at world size 1 (`nccl`) and 2 ranks (`symm` + compat), at each sample's small
presets, the MoE sample's 8-bit dispatch included. The full knob grids and the timings are the benchmarks'
job (benchmarks/<sample>/run.py); this is the gpu tier's regression check, quick enough to run on every GPU run."""
from __future__ import annotations

from pathlib import Path

import pytest

from cuco_kit.evaluate.api import EvalRequest
from cuco_kit.evaluate.device import gpu_present
from cuco_kit.workload import load_workload

ROOT = Path(__file__).resolve().parents[2]
L2_TRIALS = 3

pytestmark = pytest.mark.skipif(not gpu_present(), reason="needs an NVIDIA GPU (nvidia-smi)")

CASES = [
    ("gemm_allgather", "small"),
    ("moe_dispatch_combine", "small_skew5"),
    ("moe_dispatch_combine", "small_fp8"),
    ("moe_dispatch_combine", "small_skew5_fp8"),
    ("attention_cp", "small"),
    ("attention_cp", "small_noncausal"),
    ("kv_transfer", "small"),
    ("kv_transfer", "small_paged"),
]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("sample, preset", CASES)
def test_seeds_and_baseline_pass_l2_at_one_and_two_ranks(evaluator, sample: str, preset: str) -> None:
    wl_dir = ROOT / "sample_kernels" / sample
    wl = load_workload(wl_dir)
    params = wl.resolve(wl.size_presets[preset])
    sources = {"nccl": ["seed_nccl.cu", "seed_copy.cu", wl.baseline], "symm": ["seed_copy.cu", wl.baseline]}
    failures = []
    for world, backend in ((1, "nccl"), (2, "symm")):
        for name in sources[backend]:
            r = evaluator.evaluate(EvalRequest(candidate_code=(wl_dir / name).read_text(), workload_dir=str(wl_dir),
                                               params=params, world_size=world, backend=backend, iters=2,
                                               trials=L2_TRIALS, measure_seed=False, label=name))
            if r.verdict != "pass":
                failures.append(f"{name} {backend}-{world}: {r.verdict} at {r.level_reached}: {r.reason[:200]}")
    assert not failures, "\n".join(failures)
