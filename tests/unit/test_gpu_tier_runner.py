"""The gpu tier's runner (scripts/remote_gpu/gpu_tier.py) without a GPU: which part runs each gpu test (the
`serial` marker; every file somewhere, the quick form included), the per-file summary from junit files or, when a
part was ended, from pytest's own lines, and the MPS leak rule it shares with the harness check."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cuco_kit.evaluate import mps

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("gpu_tier_under_test", ROOT / "scripts" / "remote_gpu" / "gpu_tier.py")
assert _spec is not None and _spec.loader is not None
gpu_tier = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_tier)
GPU_FILES = sorted(p.name for p in (ROOT / "tests" / "gpu").glob("test_*.py"))


def _collected(marker: str, quick: bool = False) -> dict[str, int]:
    env = {k: v for k, v in os.environ.items() if k != "CUCO_GPU_QUICK"}
    if quick:
        env["CUCO_GPU_QUICK"] = "1"
    p = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q", "-m", marker,
                        "tests/gpu"], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert p.returncode in (0, 5), p.stdout[-2000:] + p.stderr[-2000:]
    files: dict[str, int] = {}
    for line in p.stdout.splitlines():
        if line.startswith("tests/gpu/") and "::" in line:
            name = Path(line.split("::")[0]).name
            files[name] = files.get(name, 0) + 1
    return files


@pytest.mark.parametrize("quick", [False, True])
def test_every_gpu_file_runs_in_a_part_and_only_the_timing_ones_alone(quick: bool) -> None:
    parts = {name: _collected(marker, quick) for name, marker in gpu_tier.PARTS}
    # timings (the exercise's overlap is one), the whole-machine leak check, and hangs until the watchdog (the
    # wrong peer of host NCCL; a spin of the candidate's own, slow, so not in the quick form)
    serial = {"test_launch_bias_gpu.py", "test_harness_gpu.py", "test_host_nccl_symm_gpu.py", "test_exercise_gpu.py"}
    assert set(parts["serial"]) == serial | (set() if quick else {"test_bounded_waits_gpu.py"})
    assert set(parts["parallel"]) | set(parts["serial"]) == set(GPU_FILES)  # new files land in the parallel part
    full = _collected("gpu")
    both = {f: parts["parallel"].get(f, 0) + parts["serial"].get(f, 0) for f in GPU_FILES}
    if quick:  # smaller, and still every file
        assert sum(both.values()) < sum(full.values())
    else:  # every test in exactly one part
        assert both == full


def test_the_parallel_part_spreads_files_over_workers(tmp_path: Path) -> None:
    cmd = gpu_tier.pytest_command("gpu and not serial", 6, tmp_path / "x.xml")
    assert cmd[cmd.index("-n") + 1] == "6" and cmd[cmd.index("--dist") + 1] == "loadfile"
    assert "--durations=25" in cmd and f"--junitxml={tmp_path / 'x.xml'}" in cmd and cmd[-1] == "tests/gpu"
    assert "-n" not in gpu_tier.pytest_command("gpu and serial", 1, tmp_path / "y.xml")


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="4">
<testcase classname="tests.gpu.test_samples_gpu" name="test_a[gemm]" time="40.5" />
<testcase classname="tests.gpu.test_samples_gpu" name="test_a[moe]" time="20.0"><failure message="x">x</failure>
</testcase>
<testcase classname="tests.gpu.test_llm_search_gpu" name="test_b" time="61.0" />
<testcase classname="tests.gpu.test_fastpath_gpu.TestX" name="test_c" time="1.0"><skipped message="s" /></testcase>
</testsuite></testsuites>"""


def test_per_file_rows_and_the_verdict(tmp_path: Path) -> None:
    xml = tmp_path / "p.xml"
    xml.write_text(JUNIT)
    parallel = {"part": "parallel", "workers": 4, "rc": 1, "seconds": 70.0, "limit_s": 295, "killed_rank_workers": [],
                "cases": gpu_tier.junit_cases(xml)}
    lines = ["[gw0] [ 50%] PASSED tests/gpu/test_harness_gpu.py::test_no_leaks \n",
             "tests/gpu/test_launch_bias_gpu.py::test_end_to_end_time_is_kept_beside_it ERROR [100%]\n",
             "collected 3 items\n"]
    serial = {"part": "serial", "workers": 1, "rc": 124, "seconds": 200.0, "limit_s": 200,
              "killed_rank_workers": [4242], "cases": gpu_tier.cases_from_output(lines)}
    rows = {(r["file"], r["part"]): r for r in gpu_tier.file_rows([parallel, serial])}
    assert rows[("test_samples_gpu.py", "parallel")] == {"file": "test_samples_gpu.py", "part": "parallel",
                                                         "seconds": 60.5, "passed": 1, "failed": 1, "error": 0,
                                                         "skipped": 0}
    assert rows[("test_fastpath_gpu.py", "parallel")]["skipped"] == 1
    harness = rows[("test_harness_gpu.py", "serial")]  # the part was ended: pytest's lines, no seconds
    assert harness["passed"] == 1 and harness["seconds"] is None
    assert rows[("test_launch_bias_gpu.py", "serial")]["error"] == 1
    files = ["test_fastpath_gpu.py", "test_harness_gpu.py", "test_launch_bias_gpu.py", "test_llm_search_gpu.py",
             "test_samples_gpu.py", "test_new_gpu.py"]
    text, ok = gpu_tier.summary("full", [parallel, serial], files, 280.0, 540.0, ["a note"])
    assert not ok and text.splitlines()[-1].startswith("GPU TIER FAILED: 3 passed, 1 failed, 1 errors, 1 skipped")
    assert "test_new_gpu.py" in text and "NOT RUN" in text and "killed rank workers [4242]" in text
    assert "slowest: test_llm_search_gpu.py::test_b 61 s" in text
    good = {**parallel, "rc": 0, "cases": [c for c in parallel["cases"] if c["outcome"] != "failed"]}
    text, ok = gpu_tier.summary("quick", [good], ["test_samples_gpu.py", "test_llm_search_gpu.py",
                                                  "test_fastpath_gpu.py"], 100.0, 300.0, [])
    assert ok and text.splitlines()[-1].startswith("GPU TIER PASSED: 2 passed")
    nothing = {**good, "cases": [c for c in good["cases"] if c["outcome"] == "skipped"]}
    assert not gpu_tier.summary("full", [nothing], ["test_fastpath_gpu.py"], 1.0, 540.0, [])[1]  # nothing ran


def test_an_mps_process_is_ours_unless_a_daemon_from_before_started_it(monkeypatch: pytest.MonkeyPatch) -> None:
    assert mps.parent_pid(os.getpid()) == os.getppid() and mps.parent_pid(2**30) is None
    parents = {10: 1, 11: 10, 12: 1, 13: 12}  # 10: a control daemon from before, 11 its server; 12, 13: new
    monkeypatch.setattr(mps, "mps_daemon_pids", lambda: sorted(parents))
    monkeypatch.setattr(mps, "parent_pid", parents.get)
    assert mps.mps_pids_since({10}) == [12, 13]
    assert mps.mps_pids_since({10, 12}) == []
    assert mps.mps_pids_since(set()) == [10, 11, 12, 13]
