"""The harness on a real GPU: the same run as scripts/remote_gpu/gpu_check.sh (benchmarks/harness/run.py), asserted
case by case. Its leak check looks at the whole machine and it times warm against cold evaluations, so the gpu
tier runs it alone on the GPU (serial). Quick form: one adversarial candidate per kind of rejection."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from cuco_kit.evaluate.device import gpu_present

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.skipif(not gpu_present(), reason="needs an NVIDIA GPU"), pytest.mark.serial]


@pytest.fixture(scope="module")
def summary(tmp_path_factory: pytest.TempPathFactory, quick: bool) -> dict:
    spec = importlib.util.spec_from_file_location("harness_run", ROOT / "benchmarks" / "harness" / "run.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path_factory.mktemp("gpu_check")
    mod.main(["--out", str(out), *(["--quick"] if quick else [])])
    return json.loads((out / "harness_gpu_check.json").read_text())


@pytest.mark.timeout(600)
def test_device_lsa_passes_l2_nccl_world1_and_symm_2_4(summary: dict) -> None:
    rows = {(r["case"], r["backend"], r["world"]): r for r in summary["rows"]}
    for key in (("device_lsa.cu", "nccl", 1), ("device_lsa.cu", "symm", 2), ("device_lsa.cu", "symm", 4)):
        r = rows[key]
        assert r["verdict"] == "pass" and r["median_ms"] > 0, r
        assert r["seed_median_ms"] and r["speedup"], r


def test_every_adversarial_candidate_is_rejected_and_never_scored(summary: dict) -> None:
    adv = [r for r in summary["rows"] if r["case"].endswith(".cu") and r["expect"].get("verdict") == "fail"]
    assert adv, "no adversarial case ran"
    bad = [f"{r['case']} {r['backend']}-{r['world']}: {r['why']}" for r in adv if not r["ok"]]
    assert not bad, bad
    assert all(r["median_ms"] is None and r["speedup"] is None for r in adv)
    assert not summary["skipped"], summary["skipped"]


def test_warm_evaluation_is_cheaper_than_a_cold_start(summary: dict) -> None:
    ov = summary["overhead"]
    assert ov["warm_eval_seconds"], ov
    assert ov["cold_eval_seconds"] is not None
    assert max(ov["warm_eval_seconds"]) < ov["cold_eval_seconds"], ov


def test_warm_candidates_reuse_the_seed_and_carry_their_phases(summary: dict) -> None:
    warm = [r for r in summary["rows"] if r["case"] == "device_lsa.cu (warm)"]
    assert warm and all(r["verdict"] == "pass" and r["speedup_ci"] for r in warm), warm
    # the same world and protocol: the seed measured for the first of them (or before) serves the others, unless
    # a ratio claimed a new best and had the seed measured again right after it
    how = [str(r["seed_measured"]) for r in warm]
    assert any(h.startswith(("reused", "again")) for h in how), how
    for r in warm:
        assert {"candidate", "rank.load_setup", "rank.device_timing", "rank.teardown"} <= set(r["phases"]), r["phases"]


def test_no_leaks(summary: dict) -> None:
    assert summary["leak_ok"], summary["leaks"]


def test_timeline_has_every_rank_and_the_candidates_kernels(summary: dict) -> None:
    row = next(r for r in summary["rows"] if r["case"] == "device_lsa.cu (timeline)")
    assert row["verdict"] == "pass", row["reason"]
    assert row["timeline"]["ranks"] == [0, 1], row.get("timeline")
    assert any("put" in n or "gather" in n for n in row["timeline"]["names"]), row["timeline"]["names"]
