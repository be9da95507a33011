"""Bounded waits on a real GPU (H200): a candidate whose kernel waits, through the runtime's cuco_wait, on a flag no
rank raises (tests/data/adversarial/waits_on_unraised_flag.cu) gets a verdict naming the flag within the step limit,
and the same warm worlds (the same rank processes, no new start) evaluates the next candidate: at 2 `symm` ranks
(its L2 trials on the stress build) and at 1 `nccl` rank (the capture pass first). A spin the candidate writes
itself (spins_forever.cu) is still the watchdog's: the world is started again, and with it every symm world beside
it under the same MPS server."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from cuco_kit.evaluate.api import EvalRequest, EvalResult
from cuco_kit.evaluate.device import gpu_present
from cuco_kit.evaluate.gpu_evaluator import GpuEvaluator
from cuco_kit.evaluate.pool import WorkerGroup

ROOT = Path(__file__).resolve().parents[2]
WL = ROOT / "sample_kernels" / "allgather"
ADV = ROOT / "tests" / "data" / "adversarial"
PARAMS = {"N_PER_RANK": 1 << 20}
WAIT_ABORT_GRACE_S = 2.0  # rank/harness.py: a step stuck in the runtime's waits ends within it once aborted
VERDICT = re.compile(r"rank (\d+): timeout: waited on user flag \(peer (\d+), slot 3\) epoch (\d+) for ([\d.]+) s")

pytestmark = pytest.mark.skipif(not gpu_present(), reason="needs an NVIDIA GPU (nvidia-smi)")


def _eval(evaluator: GpuEvaluator, source: Path, backend: str, world: int) -> EvalResult:
    return evaluator.evaluate(EvalRequest(candidate_code=source.read_text(), workload_dir=str(WL), params=PARAMS,
                                          world_size=world, backend=backend, iters=5, trials=2, label=source.name))


def _worlds(evaluator: GpuEvaluator) -> dict[str, tuple[WorkerGroup, list[object]]]:
    """The evaluator's warm worlds (under symm also the race-check size's) and their rank processes' pids."""
    return {key: (g, [i.get("pid") for i in g.info]) for key, g in evaluator.pool.groups.items()}


@pytest.mark.timeout(420)
@pytest.mark.parametrize("backend, world", [("symm", 2), ("nccl", 1)])
def test_a_flag_nobody_raises_ends_in_a_verdict_naming_it_in_the_same_world(evaluator: GpuEvaluator, backend: str,
                                                                             world: int) -> None:
    evaluator.pool.close()  # this case's world only
    warm = _eval(evaluator, WL / "device_lsa.cu", backend, world)
    assert warm.verdict == "pass", f"{warm.verdict}: {warm.reason}"
    worlds = _worlds(evaluator)
    assert worlds
    starts, recycles = evaluator.pool.starts, list(evaluator.pool.recycles)

    hung = _eval(evaluator, ADV / "waits_on_unraised_flag.cu", backend, world)
    assert hung.verdict == "fail" and hung.level_reached == "L2", f"{hung.verdict}: {hung.reason}"
    assert hung.median_ms is None and hung.speedup is None
    found = VERDICT.search(hung.reason)
    assert found, hung.reason
    rank, peer, epoch, waited = int(found[1]), int(found[2]), int(found[3]), float(found[4])
    assert rank == peer < world and epoch >= 1, hung.reason  # each rank waits on its own slot 3
    limit = float(hung.provenance["step_limit_s"])
    assert 0 < waited <= limit + WAIT_ABORT_GRACE_S, (waited, limit)
    assert evaluator.pool.starts == starts and evaluator.pool.recycles == recycles, evaluator.pool.recycles
    assert _worlds(evaluator) == worlds and all(g.alive() for g, _ in worlds.values())

    after = _eval(evaluator, WL / "device_lsa.cu", backend, world)
    assert after.verdict == "pass", f"{after.verdict}: {after.reason}"
    assert after.provenance["warm_workers"] is True
    assert evaluator.pool.starts == starts and _worlds(evaluator) == worlds
    evaluator.pool.close()


@pytest.mark.slow
@pytest.mark.serial  # it kills a rank mid-kernel: a fault that may disturb other clients of a shared MPS server
@pytest.mark.timeout(420)
def test_a_spin_of_its_own_is_still_the_watchdogs_and_restarts_the_world(evaluator: GpuEvaluator) -> None:
    evaluator.pool.close()
    assert _eval(evaluator, WL / "device_lsa.cu", "symm", 2).verdict == "pass"
    starts, warm = evaluator.pool.starts, len(_worlds(evaluator))
    hung = _eval(evaluator, ADV / "spins_forever.cu", "symm", 2)
    assert hung.verdict == "fail" and "timeout" in hung.reason and "spin of its own" in hung.reason, hung.reason
    assert hung.median_ms is None
    # the killed world and every world beside it under the same MPS server (the race-check size's) start again
    after = _eval(evaluator, WL / "device_lsa.cu", "symm", 2)
    assert after.verdict == "pass", (after.reason, evaluator.pool.recycles)
    assert evaluator.pool.starts == starts + warm, (starts, warm, evaluator.pool.recycles)
    evaluator.pool.close()
