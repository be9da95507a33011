"""The exercise of 05_teaching without a GPU: gaps filled, answers keyed whatever their spacing, the answer kept out
of the notebook and the exercise file, grades from results and from a recording, and the exercise cell.

The recordings and timelines here are TEST DATA made up for the grading logic, not measurements."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from cuco_kit.errors import BadInput
from cuco_kit.evaluate.api import EvalResult
from cuco_kit.widgets import ExerciseCell
from cuco_kit.workbench import exercise as ex

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks" / "exercise"))
from answers import ANSWERS  # noqa: E402 - the hidden answers live beside the recording script

pytestmark = pytest.mark.unit


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


def test_the_answer_is_in_neither_the_notebook_nor_the_exercise_file():
    ref = _squash(ANSWERS["reference"]["per_chunk"])
    assert ref not in _squash((ROOT / ex.EXERCISE).read_text())
    for nb in (ROOT / "notebooks").glob("*.ipynb"):
        sources = "".join("".join(c["source"]) for c in json.loads(nb.read_text())["cells"])
        assert ref not in _squash(sources), nb.name
        assert "launch_wait(s.my_flags+(size_t)src" not in _squash(sources), nb.name


def test_fill_places_each_gap_and_refuses_unknown_gaps():
    src = ex.exercise_source(ROOT)
    assert set(ex.gaps(src)) == set(ex.GAPS) and all(not body.strip() for body in ex.gaps(src).values())
    filled = ex.fill({"per_chunk": "  foo();\n\n bar();"}, src)
    assert ex.gaps(filled)["per_chunk"] == "      foo();\n      bar();\n" and ex.gaps(filled)["before_local"] == ""
    with pytest.raises(BadInput, match="no gap 'after'"):
        ex.fill({"after": "x"}, src)


def test_answer_key_ignores_comments_and_spacing_only():
    a = {"per_chunk": "CUCO_TRY(launch_wait(f, 1, 0, 0, e, ctx->stream));"}
    b = {"per_chunk": "// my wait\nCUCO_TRY( launch_wait(f,1,0,0,e, ctx->stream) ); /* done */", "before_local": " "}
    c = {"per_chunk": "CUCO_TRY(launch_wait(f, 1, 0, 0, e, s.side.stream));"}
    assert ex.answer_key(a) == ex.answer_key(b) != ex.answer_key(c)
    assert ex.answer_key(a) != ex.answer_key({"before_local": a["per_chunk"]})


def _timeline(fraction: float) -> list[dict]:
    # TEST DATA: compute 100 us and a 60 us transfer placed so that `fraction` of it is hidden
    span = 160.0 - fraction * 60.0
    return [{"rank": r, "iteration": 0, "stream": 7, "name": "gemm", "start_us": 0.0, "dur_us": 100.0}
            for r in range(2)] + [{"rank": r, "iteration": 0, "stream": 9, "name": "put_kernel",
                                   "start_us": span - 60.0, "dur_us": 60.0} for r in range(2)]


def test_grade_result_correctness_overlap_and_hints():
    good = EvalResult("L3", "pass", median_ms=1.0, timeline=_timeline(0.8))
    g = ex.grade_result(good, mark=0.5, mark_note="test mark")
    assert g.correct and g.passed and g.overlap is not None and g.overlap.fraction == pytest.approx(0.8)
    assert "PASSED" in g.summary() and not g.hint
    serial = ex.grade_result(EvalResult("L3", "pass", median_ms=1.0, timeline=_timeline(0.1)), mark=0.5)
    assert serial.correct and not serial.passed and serial.hint == ex.HINTS["serial"]
    race = ex.grade_result(EvalResult("L2", "fail", reason="rank 1: max rel err 0.9 in y"), mark=0.5)
    assert not race.correct and race.hint == ex.HINTS["wrong"] and "not correct" in race.summary()
    hang = ex.grade_result(EvalResult("L2", "fail", reason="timeout: a wait passed the step limit"), mark=0.5)
    assert hang.hint == ex.HINTS["hang"]
    assert ex.grade_result(EvalResult("L1", "fail", reason="nvcc: error"), mark=0.5).hint == ex.HINTS["build"]
    unmeasured = ex.grade_result(EvalResult("L3", "pass", median_ms=1.0), mark=0.5)
    assert unmeasured.correct and not unmeasured.passed and unmeasured.hint == ex.HINTS["unmeasured"]


def _recording() -> dict:
    # TEST DATA in the recording's format, not a measurement
    return {"version": ex.RECORDING_VERSION, "gpu": "NVIDIA H200", "date": "2026-12-05T09:00:00+00:00",
            "mark": 0.45, "mark_rule": "midpoint (test data)",
            "answers": {ex.answer_key(ANSWERS["reference"]): {"label": "reference", "result": EvalResult(
                "L3", "pass", median_ms=1.0, timeline=_timeline(0.8)).to_dict()},
                ex.answer_key(ANSWERS["no_wait"]): {"label": "no_wait", "result": EvalResult(
                    "L2", "fail", reason="rank 0: max rel err 1.0").to_dict()}}}


def test_grade_from_recording(tmp_path):
    rec = _recording()
    g = ex.grade_from_recording(ANSWERS["reference"], rec)
    assert g.graded and g.passed and g.badge == "replayed" and g.detail == "NVIDIA H200, 2026-12-05"
    assert g.mark == 0.45 and "test data" in g.mark_note
    assert not ex.grade_from_recording({}, rec).correct
    other = ex.grade_from_recording({"per_chunk": "int x = 0;"}, rec)
    assert not other.graded and "not among the 2 recorded" in other.reason and "GPU" in other.reason
    assert not ex.grade_from_recording(ANSWERS["reference"], None).graded
    path = tmp_path / "recording.json"
    path.write_text(json.dumps({**rec, "version": 7}))
    with pytest.raises(BadInput, match="version 7"):
        ex.load_recording(path)
    path.write_text(json.dumps(rec))
    assert ex.load_recording(path) == rec and ex.load_recording(tmp_path / "none.json") is None


def test_exercise_cell_without_gpu_grades_from_the_recording():
    cell = ExerciseCell(gpu=False, recording=_recording())
    assert "no GPU here" in cell.where.value
    cell.boxes["per_chunk"].value = ANSWERS["reference"]["per_chunk"]
    cell.button.click()
    assert cell.grade is not None and cell.grade.passed and 'data-badge="replayed"' in cell.result.value
    cell.boxes["per_chunk"].value = ""
    cell.button.click()
    assert "hint:" in cell.result.value and "not correct" in cell.result.value
    bare = ExerciseCell(gpu=False, recording=None)
    bare.button.click()
    assert "cannot be graded on this machine" in bare.result.value


def test_exercise_cell_with_gpu_grades_in_a_thread():
    seen = []

    def fake(answer):  # stands in for the GPU evaluation
        seen.append(answer)
        return ex.grade_result(EvalResult("L3", "pass", median_ms=1.0, timeline=_timeline(0.2),
                                          provenance={"gpu": "GPU", "date": "2026-12-05"}), mark=0.5)

    cell = ExerciseCell(gpu=True, grade_on_gpu=fake)
    cell.boxes["before_local"].value = "wait_all();"
    cell.button.click()
    cell.wait(10)
    assert seen == [{"before_local": "wait_all();", "per_chunk": ""}]
    assert cell.grade is not None and cell.grade.correct and not cell.grade.passed
    assert ex.HINTS["serial"][:40] in cell.result.value.replace("&#x27;", "'") and not cell.button.disabled


def test_request_asks_for_a_timeline_at_two_symm_ranks():
    req = ex.request(ANSWERS["reference"], root=ROOT)
    assert (req.world_size, req.backend, req.timeline, req.timeline_iters) == (2, "symm", True, 3)
    assert req.params == {"M": 8192, "N": 8192, "K": 8192}
    assert _squash(ANSWERS["reference"]["per_chunk"]) in _squash(req.candidate_code)


class _ScriptedEvaluator:
    """TEST DATA: answers graded as a GPU would, by which answer was filled in (no GPU here)."""

    def __init__(self, separation: float = 0.7) -> None:
        self.separation = separation

    def evaluate(self, request, progress=None):
        code = _squash(request.candidate_code)
        prov = {"gpu": "NVIDIA H200", "driver": "580", "date": "2026-12-05T09:00:00+00:00", "eval_seconds": 20.0,
                "phases": {"rank.timeline": 1.0}}
        if _squash(ANSWERS["reference"]["per_chunk"]) in code:
            return EvalResult("L3", "pass", median_ms=1.0, timeline=_timeline(0.1 + self.separation), provenance=prov)
        if _squash(ANSWERS["waits_for_everything_first"]["before_local"]) in code:
            return EvalResult("L3", "pass", median_ms=1.2, timeline=_timeline(0.1), provenance=prov)
        return EvalResult("L2", "fail", reason="rank 1: max rel err 0.8 in y", provenance=prov)


def test_record_script_sets_the_mark_and_keys_answers_by_hash(tmp_path):
    from record import main as record_main

    assert record_main(["--out", str(tmp_path), "--repeats", "1"], evaluator=_ScriptedEvaluator()) == 0
    rec = ex.load_recording(tmp_path / ex.RECORDING.name)
    assert rec is not None and rec["mark"] == pytest.approx((0.8 + 0.1) / 2) and "midpoint" in rec["mark_rule"]
    assert rec["timeline_cost"] == {"runs": 2, "median_s": 1.0, "median_share": 0.05}
    assert "launch_wait" not in json.dumps(rec) and ex.grade_from_recording(ANSWERS["reference"], rec).passed
    assert "Pass mark 0.45" in (tmp_path / ex.RECORDING.with_suffix(".md").name).read_text()
    # answers the overlap cannot tell apart: no mark, nothing written
    assert record_main(["--out", str(tmp_path / "no"), "--repeats", "1"],
                       evaluator=_ScriptedEvaluator(separation=0.05)) == 1
    assert not (tmp_path / "no" / "recording.json").exists()
