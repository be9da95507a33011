"""The graded exercise of 05_teaching: place the wait in a chunked transfer (sample_kernels/gemm_allgather/
exercise_wait.cu, two marked gaps), graded for correctness and overlap at 2 `symm` ranks.

A learner's answer is the text of each gap. `fill` puts it into the exercise file; `grade_result` turns an
evaluation of the filled file into a grade:
- correct: the evaluation passed L2 (fresh inputs each trial, with the stress build, the late rank and the
  interference kernel of the GPU evaluator's defaults);
- overlapped: the overlap fraction of its kernel timeline (cuco_kit.evaluate.overlap) reaches the pass mark.
The pass mark is set when the answers are recorded on a GPU (docs/review_panels.md): the midpoint between
the fraction the reference answer reached and the fraction of a correct answer that waits for everything before
any GEMM (it hides nothing), measured in the same session; `DEFAULT_MARK` stands in where no recording exists.

With a GPU, `grade_on_gpu` evaluates the answer there (real). Without one, `grade_from_recording` grades it from
the recording if that exact answer (comments and spacing ignored) was recorded there, badged replayed with the GPU
and date; any other answer cannot be graded without a GPU, and the grade says so. The recording keys answers by a
hash, so neither it nor the exercise file nor the notebook holds the answer.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cuco_kit.errors import BadInput
from cuco_kit.evaluate.api import EvalRequest, EvalResult, Evaluator
from cuco_kit.evaluate.gpu_evaluator import GpuEvaluator
from cuco_kit.evaluate.overlap import Overlap, from_timeline
from cuco_kit.workbench import repo_root
from cuco_kit.workload import load_workload

EXERCISE = Path("sample_kernels") / "gemm_allgather" / "exercise_wait.cu"
WORKLOAD = Path("sample_kernels") / "gemm_allgather"
RECORDING = Path("recordings") / "exercise-recording.json"  # written by the exercise's record script
RECORDING_VERSION = 1
GAPS = ("before_local", "per_chunk")
DEFAULT_MARK = 0.5  # only where no recording sets the mark (said so in the grade)
_GAP = re.compile(r"^(?P<indent>[ \t]*)// EXERCISE-GAP-START (?P<name>\w+)[^\n]*\n"
                  r"(?P<body>.*?)^[ \t]*// EXERCISE-GAP-END", re.MULTILINE | re.DOTALL)

HINTS = {
    "build": "It does not compile: read the first error of the build log; launch_wait's arguments are (flags, n, "
             "skip_begin, skip_end, epoch, stream) and a call that returns a status goes in CUCO_TRY(...).",
    "wrong": "A GEMM read rows of xg before they had landed: the rows of chunk c of rank src are safe to read only "
             "once that chunk's flag (the file's header says which word) has reached epoch, and the wait must sit "
             "on the stream the GEMM runs on.",
    "hang": "A wait never returned: it waited for a flag nobody raises in this step (which rank raises which word? "
            "the file's header says), or for an epoch that never comes.",
    "serial": "Correct, but the transfer is not hidden: the schedule waits for more than the next GEMM reads, so "
              "the GPU idles while data travels. Wait for exactly the chunk each GEMM reads, as late as possible.",
    "unmeasured": "Correct; its overlap could not be measured (no kernel timeline came back).",
}


@dataclass
class ExerciseConfig:
    world_size: int = 2
    backend: str = "symm"
    # The workload's size preset. At 8192 each rank moves 64 MiB under a GEMM of about a millisecond: the transfer
    # is long next to the few microseconds each wait kernel costs, so where the wait sits shows in the overlap.
    preset: str = "8192"
    iters: int = 10
    timeline_iters: int = 3


def exercise_source(root: Path | None = None) -> str:
    return ((root or repo_root()) / EXERCISE).read_text(encoding="utf-8")


def gaps(source: str) -> dict[str, str]:
    """The gaps of the exercise file, name -> current text."""
    return {m["name"]: m["body"] for m in _GAP.finditer(source)}


def fill(answer: dict[str, str], source: str | None = None) -> str:
    """The exercise file with each gap holding the learner's text (indented like the gap). Unknown gap names are
    refused; a gap not in `answer` stays empty."""
    src = exercise_source() if source is None else source
    unknown = set(answer) - set(gaps(src))
    if unknown:
        raise BadInput(f"the exercise has no gap {sorted(unknown)[0]!r}; its gaps are {', '.join(GAPS)}")

    def put(m: re.Match[str]) -> str:
        text = answer.get(m["name"], "")
        lines = [m["indent"] + ln.strip() for ln in text.splitlines() if ln.strip()]
        start = m.group(0).split("\n", 1)[0]
        return start + "\n" + "".join(ln + "\n" for ln in lines) + m["indent"] + "// EXERCISE-GAP-END"

    return _GAP.sub(put, src)


def answer_key(answer: dict[str, str]) -> str:
    """The answer's identity, whatever its comments and spacing: sha256 of each gap without comments and blanks."""
    def norm(text: str) -> str:
        text = re.sub(r"/\*.*?\*/", "", text, flags=re.DOTALL)
        text = re.sub(r"//[^\n]*", "", text)
        return re.sub(r"\s+", "", text)

    return hashlib.sha256(json.dumps({g: norm(answer.get(g, "")) for g in GAPS}, sort_keys=True).encode()).hexdigest()


def request(answer: dict[str, str], config: ExerciseConfig | None = None, root: Path | None = None) -> EvalRequest:
    cfg = config or ExerciseConfig()
    base = root or repo_root()
    wl = load_workload(base / WORKLOAD)
    params = dict(wl.size_presets[cfg.preset]) if cfg.preset else {}
    return EvalRequest(candidate_code=fill(answer, exercise_source(base)), workload_dir=str(base / WORKLOAD),
                       params=params, world_size=cfg.world_size, backend=cfg.backend, iters=cfg.iters,
                       timeline=True, timeline_iters=cfg.timeline_iters, label="exercise: place the wait")


@dataclass
class Grade:
    graded: bool  # False: nothing could grade this answer here (no GPU and not recorded)
    correct: bool = False
    overlap: Overlap | None = None
    mark: float = DEFAULT_MARK
    mark_note: str = ""
    passed: bool = False
    hint: str = ""
    badge: str = "real"  # real (graded now on this GPU) or replayed (from the recording)
    detail: str = ""  # GPU and date of the measurement
    reason: str = ""  # the evaluation's reason when it failed
    extra: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> str:
        if not self.graded:
            return self.reason
        if not self.correct:
            return f"not correct: {self.reason}"
        ov = "overlap not measured" if self.overlap is None or self.overlap.fraction is None \
            else f"overlap {self.overlap.fraction:.0%} of the ideal"
        verdict = "PASSED" if self.passed else "correct, overlap below the mark"
        return f"{verdict}: correct; {ov} (pass mark {self.mark:.0%}: {self.mark_note})"


def _failure_hint(result: EvalResult) -> str:
    reason = (result.reason or "").lower()
    if result.level_reached in ("L0", "L1"):
        return HINTS["build"]
    if "timeout" in reason or "step limit" in reason or "waited" in reason or "abort" in reason:
        return HINTS["hang"]
    return HINTS["wrong"]


def grade_result(result: EvalResult, *, mark: float = DEFAULT_MARK, mark_note: str = "",
                 badge: str = "real", detail: str = "") -> Grade:
    """The grade of one evaluation of a filled exercise."""
    note = mark_note or "the default mark: no recording set one"
    if not result.passed:
        return Grade(True, False, None, mark, note, False, _failure_hint(result), badge, detail,
                     reason=(result.reason or result.verdict)[:300])
    ov = from_timeline(result.timeline or [], badge=badge)
    if ov is None or ov.fraction is None:
        return Grade(True, True, ov, mark, note, False, HINTS["unmeasured"], badge, detail)
    passed = ov.fraction >= mark
    return Grade(True, True, ov, mark, note, passed, "" if passed else HINTS["serial"], badge, detail)


def grade_on_gpu(answer: dict[str, str], evaluator: Evaluator | None = None, *,
                 config: ExerciseConfig | None = None, recording: dict[str, Any] | None = None) -> Grade:
    """Evaluate the answer on this machine's GPU and grade it (the mark from the recording when there is one)."""
    own = evaluator is None
    if evaluator is None:
        evaluator = GpuEvaluator()
    try:
        result = evaluator.evaluate(request(answer, config))
    finally:
        if own and callable(close := getattr(evaluator, "close", None)):
            close()
    mark, note = mark_of(recording)
    prov = result.provenance or {}
    return grade_result(result, mark=mark, mark_note=note, badge=result.badge,
                        detail=", ".join(str(prov[k])[:10] if k == "date" else str(prov[k])
                                         for k in ("gpu", "date") if prov.get(k)))


def load_recording(path: Path | None = None) -> dict[str, Any] | None:
    """The recorded answers (RECORDING), None when none is committed."""
    p = path or repo_root() / RECORDING
    if not p.is_file():
        return None
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except ValueError:
        raise BadInput(f"{p}: not JSON; record it again with its record script (docs/review_panels.md)") from None
    if not isinstance(data, dict) or data.get("version") != RECORDING_VERSION:
        raise BadInput(f"{p}: recording version {data.get('version') if isinstance(data, dict) else '?'} is not "
                       f"{RECORDING_VERSION}; record it again with its record script (docs/review_panels.md)")
    return data


def mark_of(recording: dict[str, Any] | None) -> tuple[float, str]:
    if recording and isinstance(recording.get("mark"), (int, float)):
        return float(recording["mark"]), str(recording.get("mark_rule") or "set by the recording")
    return DEFAULT_MARK, "the default mark: no recording set one"


def grade_from_recording(answer: dict[str, str], recording: dict[str, Any] | None) -> Grade:
    """Grade a recorded answer without a GPU (replayed); an answer not in the recording is not graded."""
    if recording is None:
        return Grade(False, reason=f"no GPU here and no recording of this exercise ({RECORDING}): it cannot be "
                                   "graded on this machine")
    entry = (recording.get("answers") or {}).get(answer_key(answer))
    detail = ", ".join(x for x in (recording.get("gpu"), str(recording.get("date") or "")[:10]) if x)
    if entry is None:
        n = len(recording.get("answers") or {})
        return Grade(False, reason=f"no GPU here, and this answer is not among the {n} recorded on {detail} (the "
                                   "reference answer and common mistakes; comments and spacing do not matter): "
                                   "run this notebook on a GPU to grade it")
    known = set(EvalResult.__dataclass_fields__)
    result = EvalResult.from_dict({k: v for k, v in entry["result"].items() if k in known})
    mark, note = mark_of(recording)
    return grade_result(result, mark=mark, mark_note=note, badge="replayed", detail=detail)
