"""Race amplification on a real GPU: benchmarks/harness/race_amplification.py, asserted claim by claim.

The script's JSON goes to $CUCO_RECORD_DIR when set (e.g. benchmarks/harness/, to commit it), else to a temp dir.
Its claims are verdicts, not times, so the gpu tier runs it beside other tests. Claims: every race class of the
adversarial set (the runtime-helper ones and the raw-atomic ones, for the all-gather and gemm_allgather) rejected at
2 `symm` ranks at its small preset in at least 19 of 20 seeds with every perturbation on; every honest sample
passing at 1, 2 and 4 ranks and every race class at 1 rank; the cost of each perturbation on L2 time reported. The
per-perturbation-alone numbers are for the record (asserted nowhere). Quick form: 5 seeds per race class, the honest
samples at 4 ranks only, one cost seed, nothing alone.
"""
from __future__ import annotations

import importlib.util
import json
import math
import os
from pathlib import Path

import pytest

from cuco_kit.evaluate.device import gpu_present

ROOT = Path(__file__).resolve().parents[2]
# Within the tier's parallel part (gpu_tier.py: 540 s less the serial reserve), so that a slow run ends with the
# list of what it skipped rather than a killed pytest; device_samples.sh race_catch, which runs this file alone,
# gives the script its own budget.
BUDGET = ["--budget-s", os.environ.get("CUCO_RACE_BUDGET_S", "270")]
QUICK_ARGS = ["--seeds", "5", "--honest-worlds", "4", "--cost-seeds", "1", "--alone-seeds", "0"]

pytestmark = pytest.mark.skipif(not gpu_present(), reason="needs an NVIDIA GPU")


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / "harness" / f"{name}.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def record(tmp_path_factory: pytest.TempPathFactory, quick: bool) -> dict:
    recording = os.environ.get("CUCO_RECORD_DIR")
    out = Path(recording or tmp_path_factory.mktemp("race"))
    args = ["--out", str(out), *BUDGET]
    if quick:
        args += QUICK_ARGS
    elif not recording:
        args += ["--alone-seeds", "0", "--cost-seeds", "1"]  # the record measures each alone and the cost twice
    _script("race_amplification").main(args)
    return json.loads((out / "race_amplification.json").read_text())


def _race_classes() -> dict[str, dict]:
    expected = json.loads((ROOT / "tests" / "data" / "adversarial" / "EXPECTED.json").read_text())
    return {k: v for k, v in expected.items() if not k.startswith("_") and v.get("race")}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", sorted(_race_classes()))
def test_every_race_class_is_rejected_at_two_ranks_in_19_of_20_seeds(record: dict, name: str) -> None:
    d = record["detection"].get(f"{name}|all")
    assert d is not None, record["skipped"]
    assert d["evaluated"] == record["meta"]["seeds"], record["skipped"]
    missed = [r["reason"] or r["verdict"] for r in d["rows"] if r["verdict"] != "fail"]
    assert d["caught"] >= math.ceil(19 / 20 * d["evaluated"]), missed
    assert all(r["level"] == "L2" and "verification" in r["reason"] for r in d["rows"] if r["verdict"] == "fail")


def test_every_honest_sample_passes_at_1_2_and_4_ranks_with_every_perturbation_on(record: dict) -> None:
    rows = record["honest"]
    worlds = record["meta"]["honest_worlds"]
    assert set(worlds) in ({1, 2, 4}, {4}), worlds  # full, quick
    seen = {(r["workload"], r["file"], r["world"]) for r in rows}
    want = {(w, f, n) for w, f in _script("race_amplification").honest_set() for n in worlds}
    if 1 in worlds:  # a race needs two ranks: every race class passes at one
        want |= {(Path(e.get("workload", "sample_kernels/allgather")).name, f, 1) for f, e in _race_classes().items()}
    assert want <= seen, (sorted(want - seen), record["skipped"])
    bad = [f"{r['label']}: {r['reason']}" for r in rows if r["verdict"] != "pass"]
    assert not bad, bad
    assert all(r["config"] == "all" for r in rows)
    assert any(r["stress_applied"] for r in rows if r["world"] > 1)
    assert any(r["race_size"] for r in rows if r["world"] > 1)  # small sizes were checked at a larger one too


def test_the_cost_of_each_perturbation_on_l2_time_is_reported(record: dict) -> None:
    summary = record["cost"]["summary"]
    assert set(summary) == {"allgather", "gemm_allgather"}, record["skipped"]
    for wl, per in summary.items():
        assert set(per) == set(record["meta"]["configs"]), wl
        for config, c in per.items():
            assert c["n"] >= 1 and c["l2_total_seconds"] and c["l2_total_seconds"] > 0, (wl, config, c)
        assert per["race-check size"]["race_size_seconds"] and per["none"]["race_size_seconds"] is None, per
