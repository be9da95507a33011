"""Every sample on a real GPU, quickly: both seeds and the device-initiated baseline (its default knob values)
pass L2 with fresh inputs at world size 1 (`nccl`) and 2 ranks (`symm` + compat), at each sample's small
presets, the MoE sample's 8-bit dispatch included. The full knob grids and the timings are the benchmarks'
job (benchmarks/<sample>/run.py); this is the gpu tier's regression check, quick enough to run on every GPU run.
Every build is made at once before the first case; a case's worlds end with it (no later case uses them). The
cases come from the folders: every sample under sample_kernels/ at each of its Workload.check_presets. Quick
form: the first of them, one preset per sample."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from cuco_kit.evaluate.api import EvalRequest
from cuco_kit.evaluate.device import gpu_present
from cuco_kit.workload import load_workload, sample_workloads

ROOT = Path(__file__).resolve().parents[2]
L2_TRIALS = 3
WORLDS = ((1, "nccl"), (2, "symm"))

pytestmark = pytest.mark.skipif(not gpu_present(), reason="needs an NVIDIA GPU (nvidia-smi)")

SLOW = pytest.mark.slow


def cases(root: Path = ROOT) -> list:
    """(sample, preset) for every sample folder under ``root`` and each of its check_presets; all but the first
    are slow (the quick form leaves them out)."""
    out = []
    for d in sample_workloads(root):
        wl = load_workload(d)
        unknown = [p for p in wl.check_presets if p not in wl.size_presets]
        if unknown:
            raise ValueError(f"{d.name}/workload.py: check_presets {unknown} are not size_presets; "
                             f"name some of {sorted(wl.size_presets)}")
        out += [pytest.param(d.name, preset, marks=SLOW if i else ()) for i, preset in enumerate(wl.check_presets)]
    return out


CASES = cases()


def sources(wl_dir: Path) -> dict[str, list[str]]:
    """The files each backend checks: both seeds and the baseline under nccl (host NCCL runs at world 1), the
    copy seed and the baseline under symm."""
    wl = load_workload(wl_dir)
    assert wl.baseline is not None, f"{wl_dir.name} has no baseline"
    return {"nccl": [wl.seeds["nccl"], wl.seeds["symm"], wl.baseline], "symm": [wl.seeds["symm"], wl.baseline]}


@pytest.fixture(scope="module")
def prebuilt(evaluator) -> None:
    """Every sample's sources for both worlds (timed and stress builds), in parallel: nvcc runs side by side
    instead of one build per evaluation."""
    dirs = sorted({ROOT / "sample_kernels" / str(c.values[0]) for c in CASES})
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
