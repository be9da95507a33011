"""Recordings answer what the UI offers: the configuration plan covers every committed benchmark table, recorded
configurations are found by name and offered first, a miss names the nearby recorded ones, and the README's
search command without a GPU ends at once with a one-line pointer. Recordings here are made with the SIMULATED
evaluator in temp dirs only (accepted by the replay under badge "simulated"), never committed."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from cuco_kit import workbench as wb
from cuco_kit.evaluate.api import EvalRequest
from cuco_kit.evaluate.recordings import catalogue, miss_hint
from cuco_kit.evaluate.replay import MISS_REASON, ReplayEvaluator
from cuco_kit.evaluate.simulated import SimulatedEvaluator
from cuco_kit.evaluate.spec import EvaluatorSpec
from cuco_kit.widgets import EvalCell

ROOT = Path(__file__).resolve().parents[3]
WL = ROOT / "sample_kernels" / "gemm_allgather"


@pytest.fixture(scope="module")
def rc() -> Any:
    path = ROOT / "benchmarks" / "search" / "record_configs.py"
    spec = importlib.util.spec_from_file_location("record_configs_under_test", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_plan_covers_every_benchmark_table_main_sample_first(rc):
    planned = rc.plan()
    assert planned[0].sample == "gemm_allgather"
    tables = {p.parent.name: p for p in (ROOT / "benchmarks").glob("*/results.json")}
    tables |= {p.name.removesuffix("-results.json"): p for p in (ROOT / "recordings").glob("*-results.json")}
    assert "gemm_allgather" in tables
    for sample, results in tables.items():
        if not (ROOT / "sample_kernels" / sample).is_dir():
            continue  # not a sample's table (the search, executor and corpus benchmarks)
        rows = json.loads(results.read_text())["rows"]
        want = {(sample, str(r["preset"]), int(r["world"]), str(r["backend"])) for r in rows}
        have = {(c.sample, c.preset, c.world, c.backend) for c in planned}
        assert want <= have, want - have
    assert [f for f, _, _ in rc.programs("gemm_allgather")] == ["device_lsa.cu", "seed_copy.cu", "seed_nccl.cu"]


def _simulated_recording(rc, tmp_path: Path) -> Path:
    configs = [rc.Config("gemm_allgather", "small", 2, "symm"), rc.Config("gemm_allgather", "4096", 1, "nccl")]
    out = rc.record_configs(SimulatedEvaluator(seed=0), tmp_path, time.monotonic() + 60, iters=3, configs=configs)
    assert len(out["configs"]) == 2 and not out["skipped"]
    return tmp_path / "gemm_allgather-configs.sqlite"


def test_recorded_configurations_are_found_offered_first_and_misses_name_them(rc, tmp_path: Path):
    db = _simulated_recording(rc, tmp_path)
    rep = ReplayEvaluator([db], accept_badges=("simulated",))
    try:
        configs = rep.configs(str(WL))
        assert {(c.world_size, c.backend) for c in configs} == {(2, "symm"), (1, "nccl")}
        code = (WL / "device_lsa.cu").read_text()
        small = configs[0].sizes if configs[0].world_size == 2 else configs[1].sizes
        hit = rep.evaluate(EvalRequest(candidate_code=code, workload_dir=str(WL), params=small, world_size=2,
                                       backend="symm"))
        assert hit.verdict != "unavailable" and hit.badge == "replayed"
        miss = rep.evaluate(EvalRequest(candidate_code=code, workload_dir=str(WL), params=small, world_size=4,
                                        backend="symm"))
        assert miss.verdict == "unavailable" and miss.reason.startswith(MISS_REASON)
        assert "4 ranks, symm" in miss.reason and "is not recorded; recorded nearby: 2 ranks, symm" in miss.reason
        edited = rep.evaluate(EvalRequest(candidate_code=code + "\n", workload_dir=str(WL), params=small,
                                          world_size=2, backend="symm"))
        assert "is recorded, but not this program" in edited.reason
        cell = EvalCell(rep, WL)
        labels = [label for label, _ in cell.recorded.options]
        assert len(labels) == 3 and labels[-1] == "other (not recorded)"
        assert (cell.ranks.value, cell.backend.value) == (configs[0].world_size, configs[0].backend)
        cell.recorded.value = 1
        assert (cell.ranks.value, cell.backend.value) == (configs[1].world_size, configs[1].backend)
        assert cell.request().params == configs[1].sizes or \
            wb.preset_of(WL, configs[1].sizes) == cell.preset.value
        cell.close()
    finally:
        rep.close()


def test_miss_hint_without_any_recording_of_the_workload():
    assert miss_hint([], "w", 2, "symm", {"M": 1}) == "nothing of w is recorded"
    assert catalogue([]) == []


def test_readme_search_without_a_gpu_ends_fast_with_a_pointer(tmp_path: Path):
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "cuco_kit", "search", "sample_kernels/gemm_allgather", "--mutator",
                        "offline", "--generations", "10", "--db", str(tmp_path / "run.sqlite")], cwd=ROOT,
                       capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
    elapsed = time.monotonic() - t0
    assert elapsed < 30, elapsed
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "no GPU" in p.stderr and "--evaluator simulated" in p.stderr and "--evaluator replay" in p.stderr
    assert "Warning" not in p.stderr and not (tmp_path / "run.sqlite").exists()  # nothing built, nothing written


def test_a_replay_spec_carries_every_recording_of_a_configuration(rc, tmp_path: Path):
    # `cuco search --evaluator replay` hands the executor a spec naming each recording that holds the configuration
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
    paths = [str(_simulated_recording(rc, tmp_path / d)) for d in ("a", "b")]
    spec = EvaluatorSpec.from_json(EvaluatorSpec("replay", {"path": paths}).to_json())
    rep = spec.make()
    try:
        assert isinstance(rep, ReplayEvaluator) and rep.paths == paths and spec.badge == "replayed"
    finally:
        rep.close()
