"""The exercise of 05_teaching on a real GPU: the hidden reference answer grades correct and overlapped, a correct
answer that waits for everything first grades correct but below the mark, one without a wait fails L2, and the
same results graded from a recording (no GPU) agree. The mark is set as benchmarks/exercise/record.py sets it:
halfway between the reference and the serial answer, measured here.

The graded answers (every hidden answer when recording) are evaluated once, in this module's warm evaluator
(record.evaluate_all). With CUCO_RECORD_DIR set (device_samples.sh exercise), those same results are written there
as the recording (record.write_recording) and what it wrote is checked."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from cuco_kit.evaluate.api import EvalResult
from cuco_kit.evaluate.device import gpu_present
from cuco_kit.evaluate.overlap import from_timeline
from cuco_kit.workbench import exercise as ex

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "exercise"))
from answers import ANSWERS  # noqa: E402 - the hidden answers live beside the recording script
from record import MIN_SEPARATION, evaluate_all, write_recording  # noqa: E402

pytestmark = [pytest.mark.serial, pytest.mark.skipif(not gpu_present(), reason="needs an NVIDIA GPU"),
              pytest.mark.timeout(600)]
FIELDS = set(EvalResult.__dataclass_fields__)


GRADED = ("reference", "waits_for_everything_first", "no_wait")  # what the tests below grade


@pytest.fixture(scope="module")
def runs(evaluator) -> dict[str, list[dict[str, Any]]]:
    """The graded answers (every hidden answer when recording) evaluated once here, in the record script's form:
    result dicts without logs."""
    return evaluate_all(1, evaluator, None if os.environ.get("CUCO_RECORD_DIR") else GRADED)


@pytest.fixture(scope="module")
def results(runs) -> dict[str, EvalResult]:
    return {name: EvalResult.from_dict({k: v for k, v in r[-1].items() if k in FIELDS}) for name, r in runs.items()}


@pytest.mark.skipif(not os.environ.get("CUCO_RECORD_DIR"), reason="records only with CUCO_RECORD_DIR set")
def test_record_the_exercise(runs):
    out = Path(os.environ["CUCO_RECORD_DIR"])
    assert write_recording(runs, out) == 0
    rec = ex.load_recording(out / ex.RECORDING.name)
    assert rec is not None and 0.0 < rec["mark"] < 1.0 and len(rec["answers"]) == len(ANSWERS)
    assert ex.grade_from_recording(ANSWERS["reference"], rec).passed
    assert not ex.grade_from_recording(ANSWERS["no_wait"], rec).correct
    assert "launch_wait" not in json.dumps(rec)  # answers are keyed by hash, never by their text


def _fraction(res) -> float:
    ov = from_timeline(res.timeline or [])
    assert ov is not None and ov.fraction is not None, f"no overlap from the timeline: {ov}"
    return ov.fraction


def test_right_and_wrong_answers_grade_as_they_should(results):
    ref, serial, racy = results["reference"], results["waits_for_everything_first"], results["no_wait"]
    assert ref.passed, ref.reason
    assert serial.passed, serial.reason
    assert not racy.passed and racy.level_reached == "L2", (racy.verdict, racy.reason)
    a, b = _fraction(ref), _fraction(serial)
    assert a - b >= MIN_SEPARATION, f"the overlap does not separate the answers: reference {a:.2f}, serial {b:.2f}"
    mark = (a + b) / 2
    g_ref = ex.grade_result(ref, mark=mark)
    g_serial = ex.grade_result(serial, mark=mark)
    g_racy = ex.grade_result(racy, mark=mark)
    assert g_ref.correct and g_ref.passed and not g_ref.hint
    assert g_serial.correct and not g_serial.passed and g_serial.hint == ex.HINTS["serial"]
    assert not g_racy.correct and not g_racy.passed and g_racy.hint


def test_the_same_answers_grade_alike_from_a_recording(results):
    a, b = _fraction(results["reference"]), _fraction(results["waits_for_everything_first"])
    recording = {"version": ex.RECORDING_VERSION, "gpu": "this GPU", "date": "today", "mark": (a + b) / 2,
                 "mark_rule": "midpoint, measured here",
                 "answers": {ex.answer_key(ANSWERS[n]): {"label": n, "result": r.to_dict()}
                             for n, r in results.items()}}
    for name in GRADED:
        res = results[name]
        live = ex.grade_result(res, mark=recording["mark"])
        replayed = ex.grade_from_recording(ANSWERS[name], recording)
        assert replayed.badge == "replayed" and (replayed.correct, replayed.passed) == (live.correct, live.passed)
    assert not ex.grade_from_recording({"per_chunk": "// something else\nint unused = 0;"}, recording).graded
