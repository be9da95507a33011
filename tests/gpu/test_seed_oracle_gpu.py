"""Differential verification on a real GPU (H200): an imported program with no torch reference is its own oracle.
The all-reduce + RMS norm example is imported (cuco init leaves oracle="seed" until a reference is approved); at
2 `symm` ranks on one GPU its seed (host NCCL, served by the symm backend's host-NCCL layer) runs first and the
candidate is compared with the seed's outputs of the same iterations. The device-initiated Stage B (a FIXTURE
answer written for the tests) must pass against it, the same code without gamma must fail, and a reference
approved afterwards switches the check to the reference. Ranks sharing one GPU check correctness, not NVLink."""
from __future__ import annotations

from pathlib import Path

import pytest

from cuco_kit.evaluate.api import EvalRequest, EvalResult
from cuco_kit.evaluate.device import gpu_present
from cuco_kit.importer.session import ImportSession
from cuco_kit.llm import fixtures
from cuco_kit.workload import load_workload

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = ROOT / "cuco_kit" / "importer" / "examples" / "allreduce_norm.cu"
WITH_GAMMA = "x[(size_t)row * cols + c] * inv * gamma[c];"

pytestmark = pytest.mark.skipif(not gpu_present(), reason="needs an NVIDIA GPU (nvidia-smi)")


def _eval(evaluator, d: Path, code: str, label: str) -> EvalResult:
    wl = load_workload(d)
    return evaluator.evaluate(EvalRequest(
        candidate_code=code, workload_dir=str(d), params=dict(wl.size_presets["small"]), world_size=2,
        backend="symm", iters=4, trials=2, measure_seed=False, label=label))


@pytest.mark.timeout(400)
def test_an_imported_program_is_its_own_oracle(evaluator, tmp_path) -> None:
    d = tmp_path / "allreduce_norm"
    session = ImportSession(PROGRAM, d)
    session.write()
    assert load_workload(d).oracle == "seed"
    stage_b = fixtures.load("own_norm_stage_b_lsa.cu")
    assert WITH_GAMMA in stage_b

    seed = _eval(evaluator, d, (d / "seed_nccl.cu").read_text(), "the seed against itself")
    assert seed.verdict == "pass" and seed.oracle == "seed", f"{seed.verdict}: {seed.reason}"
    assert seed.max_rel_err is not None and seed.max_rel_err <= load_workload(d).tolerance.rel

    good = _eval(evaluator, d, stage_b, "Stage B (FIXTURE) against the seed")
    assert good.verdict == "pass" and good.oracle == "seed", f"{good.verdict}: {good.reason}"
    assert good.seed_median_ms is not None  # the seed ran in the same world, so the ratio is there too

    no_gamma = _eval(evaluator, d, stage_b.replace(WITH_GAMMA, "x[(size_t)row * cols + c] * inv;"),
                     "Stage B without gamma")
    assert no_gamma.verdict == "fail" and no_gamma.oracle == "seed", f"{no_gamma.verdict}: {no_gamma.reason}"
    assert "wrong" in no_gamma.reason and "normed" in no_gamma.reason, no_gamma.reason

    session.accept_reference(fixtures.load("own_norm_reference.txt"))
    assert load_workload(d).oracle == "reference"
    ref = _eval(evaluator, d, stage_b, "Stage B against the approved reference")
    assert ref.verdict == "pass" and ref.oracle == "reference", f"{ref.verdict}: {ref.reason}"
