"""Every shape of host program (tests/data/own_programs/, written for these tests) imported by `cuco init` runs on
a real GPU (H200): its seed, the workload's oracle until a reference is approved, passes against itself at the
small preset on 1 rank under `nccl` and on 2 `symm` ranks sharing the GPU (host NCCL served by the symm backend's
layer): it runs, its outputs are finite and the same on the same inputs."""
from __future__ import annotations

from pathlib import Path

import pytest

from cuco_kit.evaluate.api import EvalRequest, EvalResult
from cuco_kit.evaluate.device import gpu_present
from cuco_kit.importer.session import ImportSession
from cuco_kit.workload import load_workload

PROGRAMS = Path(__file__).resolve().parents[1] / "data" / "own_programs"
SHAPES = sorted(p.name for p in PROGRAMS.glob("*.cu"))

pytestmark = pytest.mark.skipif(not gpu_present(), reason="needs an NVIDIA GPU (nvidia-smi)")


def _seed_against_itself(evaluator, d: Path, world: int, backend: str) -> EvalResult:
    wl = load_workload(d)
    return evaluator.evaluate(EvalRequest(
        candidate_code=(d / "seed_nccl.cu").read_text(), workload_dir=str(d), params=dict(wl.size_presets["small"]),
        world_size=world, backend=backend, iters=3, trials=2, measure_seed=False,
        label=f"imported {d.name} seed, {world} rank(s) {backend}"))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", SHAPES)
def test_each_shapes_seed_runs_as_its_own_oracle(evaluator, tmp_path, name) -> None:
    d = tmp_path / Path(name).stem
    ImportSession(PROGRAMS / name, d).write()
    assert load_workload(d).oracle == "seed"
    one = _seed_against_itself(evaluator, d, 1, "nccl")
    assert one.verdict == "pass" and one.oracle == "seed", f"{one.verdict}: {one.reason}"
    two = _seed_against_itself(evaluator, d, 2, "symm")
    assert two.verdict == "pass" and two.oracle == "seed", f"{two.verdict}: {two.reason}"
