"""The adversarial set's expectations: as the harness benchmark judges them (a reason may name one word or any of
several, benchmarks/harness/run.py `check`, and a rejection is never a score), and EXPECTED.json's own fields: the
workload and preset an entry names exist, every race class is there, and the raw ones really are raw."""
from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

from cuco_kit.workload import load_workload

ROOT = Path(__file__).resolve().parents[3]
_spec = importlib.util.spec_from_file_location("harness_run", ROOT / "benchmarks" / "harness" / "run.py")
assert _spec is not None and _spec.loader is not None
harness_run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(harness_run)

FAIL = {"verdict": "fail", "level_reached": "L2", "median_ms": None}


def test_a_reason_list_accepts_any_of_its_words() -> None:
    expect = {"verdict": "fail", "level": "L2", "reason": ["stream capture", "verification"]}
    assert harness_run.check({**FAIL, "reason": "verification failed: rank 1: output 'y' changed after"}, expect)[0]
    assert harness_run.check({**FAIL, "reason": "stream capture: work forked off"}, expect)[0]
    ok, why = harness_run.check({**FAIL, "reason": "timeout: watchdog ended the step"}, expect)
    assert not ok and "'stream capture' or 'verification'" in why


def test_a_single_reason_and_a_score_still_fail() -> None:
    expect = {"verdict": "fail", "level": "L2", "reason": "timeout"}
    assert not harness_run.check({**FAIL, "reason": "verification failed"}, expect)[0]
    assert not harness_run.check({**FAIL, "verdict": "pass", "median_ms": 0.1, "reason": "timeout"}, expect)[0]


ADV = ROOT / "tests" / "data" / "adversarial"
ENTRIES = {k: v for k, v in json.loads((ADV / "EXPECTED.json").read_text()).items() if not k.startswith("_")}
RUNTIME_SIGNALLING = re.compile(r"\bcuco_signal\s*\(|\bcuco_wait\s*\(|\bncclLsaBarrierSession\b")


def test_each_entry_names_a_workload_and_a_preset_it_has() -> None:
    for name, e in ENTRIES.items():
        wl = load_workload(ROOT / e.get("workload", "sample_kernels/allgather"))
        assert e.get("preset") is None or e["preset"] in wl.size_presets, name


def test_every_race_class_is_there_and_written_raw_for_both_gather_workloads() -> None:
    races = {name: e for name, e in ENTRIES.items() if e.get("race")}
    assert {e["race"] for e in races.values()} == {"flag before stores", "omits wait", "wrong unit", "barrier member"}
    for name, e in races.items():  # a race is correct at one rank and wrong from two on, in its output
        assert (e["level"], e["reason_contains"], e["min_world"]) == ("L2", "verification", 2), name
    raw = {(e.get("workload", "sample_kernels/allgather"), e["race"]) for e in races.values() if e.get("raw")}
    for wl in ("sample_kernels/allgather", "sample_kernels/gemm_allgather"):
        assert {(wl, "flag before stores"), (wl, "omits wait")} <= raw
    assert any(race == "wrong unit" for _, race in raw)


def test_raw_races_use_none_of_the_runtimes_signalling_primitives() -> None:
    for name, e in ENTRIES.items():
        uses = bool(RUNTIME_SIGNALLING.search(_kernel_code((ADV / name).read_text())))
        if e.get("raw"):
            assert not uses, f"{name} is marked raw but calls the runtime's signalling"
        elif e.get("race"):
            assert uses, f"{name} signals through the runtime: the stress build is what shows it"


def _kernel_code(src: str) -> str:
    """The source without its comments (a header may name the primitives it avoids)."""
    return re.sub(r"//[^\n]*|/\*.*?\*/", "", src, flags=re.DOTALL)
