"""Timing without host-launch bias on a real GPU: benchmarks/harness/launch_bias.py (cublas_alone.cu under the
harness against torch.matmul timed the same way, world size 1), asserted size by size.

The script's JSON and table go to $CUCO_RECORD_DIR when set (e.g. benchmarks/harness/), else to a temp dir.
"""
from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from cuco_kit.evaluate.device import gpu_present

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(not gpu_present(), reason="needs an NVIDIA GPU")


@pytest.fixture(scope="module")
def record(tmp_path_factory: pytest.TempPathFactory) -> dict:
    spec = importlib.util.spec_from_file_location("launch_bias", ROOT / "benchmarks" / "harness" / "launch_bias.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = Path(os.environ.get("CUCO_RECORD_DIR") or tmp_path_factory.mktemp("bias"))
    mod.main(["--out", str(out)])
    return json.loads((out / "launch_bias.json").read_text())


@pytest.mark.timeout(600)
@pytest.mark.parametrize("n", [1024, 2048, 4096, 8192])
def test_harness_device_time_is_within_3_percent_of_torch(record: dict, n: int) -> None:
    row = next(r for r in record["rows"] if r["n"] == n)
    assert row["harness"]["verdict"] == "pass" and row["harness"]["score"] == "device", row["harness"]
    assert row["ratio"] is not None, row.get("torch_error")
    assert abs(row["ratio"] - 1.0) <= 0.03, row


def test_end_to_end_time_is_kept_beside_it(record: dict) -> None:
    for r in record["rows"]:
        assert r["harness_e2e_ms"] and r["harness_device_ms"]
        assert r["harness_e2e_ms"] >= 0.9 * r["harness_device_ms"]  # host launches only ever add
