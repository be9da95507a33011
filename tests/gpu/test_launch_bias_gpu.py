"""Timing without host-launch bias on a real GPU: benchmarks/harness/launch_bias.py (cublas_alone.cu under the
harness against torch.matmul held the same way, world size 1), asserted size by size: each side's held device
time over its own product's time in its own profiled steps, and the harness's bias against torch's, fail only
when the interval lies entirely outside +-3% (the script's docstring says what that can hide).

The script's JSON and table go to $CUCO_RECORD_DIR when set (e.g. benchmarks/harness/), else to a temp dir. Timing:
the gpu tier runs it alone on the GPU (serial). Quick form: 1024 and 8192, fewer iterations.
"""
from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from cuco_kit.evaluate.device import gpu_present

ROOT = Path(__file__).resolve().parents[2]
QUICK_ARGS = ["--sizes", "1024", "8192", "--iters", "20", "--profiled", "10"]
SIZES = [1024, pytest.param(2048, marks=pytest.mark.slow), pytest.param(4096, marks=pytest.mark.slow), 8192]

pytestmark = [pytest.mark.skipif(not gpu_present(), reason="needs an NVIDIA GPU"), pytest.mark.serial]


@pytest.fixture(scope="module")
def record(tmp_path_factory: pytest.TempPathFactory, quick: bool) -> dict:
    spec = importlib.util.spec_from_file_location("launch_bias", ROOT / "benchmarks" / "harness" / "launch_bias.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = Path(os.environ.get("CUCO_RECORD_DIR") or tmp_path_factory.mktemp("bias"))
    mod.main(["--out", str(out), *(QUICK_ARGS if quick else [])])
    return json.loads((out / "launch_bias.json").read_text())


@pytest.mark.timeout(600)
@pytest.mark.parametrize("n", SIZES)
def test_the_harness_adds_no_more_than_torch_held_the_same_way(record: dict, n: int) -> None:
    row = next((r for r in record["rows"] if r["n"] == n), None)
    assert row is not None, f"size {n} was not measured"
    run = row["harness_run"]
    assert run["verdict"] == "pass" and run["score"] == "device", run["reason"]
    assert not row["torch_error"] and not row["torch_hold_timed_out"], row["torch_error"]
    for side in ("harness", "torch"):  # timed iterations and profiled products on both sides, each with an interval
        assert row[side]["bias_ci"] is not None, (side, row[side]["bias"], row[side]["product_us"])
    summary = {k: row[k] for k in ("bias_ratio", "bias_ratio_ci")}
    summary.update({f"{s}_bias": (row[s]["bias"], row[s]["bias_ci"]) for s in ("harness", "torch")})
    assert row["ok"], summary


def test_end_to_end_time_is_kept_beside_it(record: dict) -> None:
    for r in record["rows"]:
        assert r["harness_e2e_ms"] and r["harness_device_ms"]
        assert r["harness_e2e_ms"] >= 0.9 * r["harness_device_ms"]  # host launches only ever add
