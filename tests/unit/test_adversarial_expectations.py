"""The adversarial set's expectations as the harness benchmark judges them: a reason may name one word or any of
several (benchmarks/harness/run.py `check`), and a rejection is never a score."""
from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
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
