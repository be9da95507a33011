"""Race amplification on a real GPU: benchmarks/harness/race_amplification.py, asserted claim by claim.

The script's JSON goes to $CUCO_RECORD_DIR when set (e.g. benchmarks/harness/, to commit it), else to a temp dir.
Its claims are verdicts, not times, so the gpu tier runs it beside other tests; there, without $CUCO_RECORD_DIR,
the comparison without the stress build (for the record only, asserted nowhere) is left out. Quick form: 5 seeds
per race, the honest samples at 4 ranks only.
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
BUDGET = ["--budget-s", "420"]  # the tier's own time limit governs; contention must not skip evaluations
QUICK_ARGS = ["--seeds", "5", "--plain-seeds", "0", "--honest-worlds", "4"]

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
        args += ["--plain-seeds", "0"]
    _script("race_amplification").main(args)
    return json.loads((out / "race_amplification.json").read_text())


def _caught_at_least(record: dict, name: str, share: float) -> dict:
    d = record["detection"][f"{name}|stress"]
    assert d["evaluated"] == record["meta"]["seeds"], record["skipped"]
    assert d["caught"] >= math.ceil(share * d["evaluated"]), [r["reason"] for r in d["rows"] if r["verdict"] != "fail"]
    return d


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", ["flag_before_stores.cu", "omits_wait.cu"])
def test_latent_races_are_rejected_at_two_ranks_in_19_of_20_seeds(record: dict, name: str) -> None:
    d = _caught_at_least(record, name, 19 / 20)
    assert all(r["level"] == "L2" for r in d["rows"] if r["verdict"] == "fail")


def test_the_sibling_races_are_rejected_too(record: dict) -> None:
    for name in ("wrong_unit_flag.cu", "barrier_missing_member.cu"):
        _caught_at_least(record, name, 0.9)


def test_every_honest_sample_passes_at_1_2_and_4_ranks(record: dict) -> None:
    rows = record["honest"]
    seen = {(r["workload"], r["file"], r["world"]) for r in rows}
    want = {(w, f, n) for w in ("allgather", "attention_cp", "gemm_allgather", "kv_transfer", "moe_dispatch_combine")
            for f in ("device_lsa.cu", "seed_copy.cu") for n in record["meta"]["honest_worlds"]}
    assert set(record["meta"]["honest_worlds"]) in ({1, 2, 4}, {4}), record["meta"]["honest_worlds"]  # full, quick
    assert want <= seen, (sorted(want - seen), record["skipped"])
    bad = [f"{r['workload']}/{r['file']} W{r['world']} stress={r['stress']}: {r['reason']}" for r in rows
           if r["verdict"] != "pass"]
    assert not bad, bad
    assert any(r["stress_applied"] for r in rows if r["stress"] and r["world"] > 1)


def test_the_stress_builds_cost_is_reported(record: dict) -> None:
    cost = record["stress_cost"]
    assert cost["pairs"] and cost["median_l2_ratio"] is not None and cost["median_l2_ratio"] > 0
    assert cost["stress_build_seconds"]
