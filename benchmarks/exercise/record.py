"""Record the exercise's answers on a GPU (05_teaching, "place the wait"), so notebooks without a GPU can grade them.

    python benchmarks/exercise/record.py [--out recordings] [--repeats 2]

Evaluates every hidden answer of answers.py at 2 `symm` ranks at the exercise's size (cuco_kit.workbench.exercise.
ExerciseConfig) with the GPU evaluator's defaults (stress build, late rank, interference; a kernel timeline of 3
profiled iterations), each `--repeats` times in one warm world, and sets the pass mark:

    mark = (median overlap of the reference answer + median overlap of waits_for_everything_first) / 2

i.e. halfway between the answer that hides the transfer and a correct one that hides none of it, both measured in
this session on this GPU. The mark is refused (exit 1, no recording written) when the two are less than
MIN_SEPARATION apart: then the overlap cannot tell a placed wait from a serial one at this size. Every answer must
also grade as answers.EXPECTED says (None: recorded, not checked). Writes recordings/exercise-recording.json
(answers keyed by cuco_kit.workbench.exercise.answer_key, never by their text; results without logs) and
exercise-recording.md (the table).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
from pathlib import Path
from typing import Any

# Run by path, not installed: the repository root (the kit) and this folder (answers) go first on sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from answers import ANSWERS, EXPECTED

from cuco_kit.evaluate.api import EvalResult
from cuco_kit.evaluate.gpu_evaluator import GpuEvaluator
from cuco_kit.evaluate.overlap import from_timeline
from cuco_kit.workbench import exercise as ex

MIN_SEPARATION = 0.2
REFERENCE, SERIAL = "reference", "waits_for_everything_first"


def evaluate_all(repeats: int, evaluator: Any, names: tuple[str, ...] | None = None) -> dict[str, list[dict[str, Any]]]:
    """answer name -> one result dict (no logs) per repeat, in the order run (answers interleaved); `names`: only
    those answers (a recording needs them all)."""
    out: dict[str, list[dict[str, Any]]] = {name: [] for name in (names or tuple(ANSWERS))}
    for _ in range(repeats):
        for name in out:
            res = evaluator.evaluate(ex.request(ANSWERS[name]))
            ov = from_timeline(res.timeline or [], badge=res.badge)
            d = res.to_dict()
            d["logs"] = {}
            d["overlap_fraction"] = None if ov is None else ov.fraction
            out[name].append(d)
            print(f"{name:28s} {res.verdict:5s} {res.level_reached}  overlap "
                  f"{'-' if ov is None or ov.fraction is None else f'{ov.fraction:.2f}'}  {res.reason[:80]}",
                  flush=True)
    return out


def median_fraction(results: list[dict[str, Any]]) -> float | None:
    xs = [r["overlap_fraction"] for r in results if r["verdict"] == "pass" and r["overlap_fraction"] is not None]
    return statistics.median(xs) if xs else None


def main(argv: list[str] | None = None, evaluator: Any = None) -> int:
    """`evaluator`: the GPU evaluator unless one is given (the unit test passes a scripted one)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[2] / "recordings")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args(argv)
    own = evaluator is None
    evaluator = evaluator or GpuEvaluator()
    try:
        results = evaluate_all(max(1, args.repeats), evaluator)
    finally:
        if own:
            evaluator.close()
    return write_recording(results, args.out)


def write_recording(results: dict[str, list[dict[str, Any]]], out: Path) -> int:
    """Set the mark from `results` (evaluate_all's) and write the recording and its table into `out`; 0 when
    written and every answer graded as EXPECTED says, 1 otherwise (no recording without a mark)."""
    ref, serial = median_fraction(results[REFERENCE]), median_fraction(results[SERIAL])
    if ref is None or serial is None or ref - serial < MIN_SEPARATION:
        print(f"no pass mark: reference {ref}, {SERIAL} {serial} are not {MIN_SEPARATION} apart; nothing written",
              file=sys.stderr)
        return 1
    mark = (ref + serial) / 2
    prov = results[REFERENCE][-1].get("provenance") or {}
    date = str(prov.get("date") or dt.datetime.now(dt.timezone.utc).isoformat())
    rule = (f"midpoint between the reference answer's {ref:.0%} and a correct serial answer's {serial:.0%}, "
            f"measured on {prov.get('gpu', 'the GPU')} on {date[:10]}")
    answers: dict[str, Any] = {}
    bad: list[str] = []
    lines = ["| answer | runs | verdicts | overlap (median) | grade |", "| --- | --- | --- | --- | --- |"]
    for name, runs in results.items():
        last = runs[-1]
        known = set(EvalResult.__dataclass_fields__)
        grade = ex.grade_result(EvalResult.from_dict({k: v for k, v in last.items() if k in known}), mark=mark)
        want = EXPECTED.get(name)
        if want is not None and (grade.correct, grade.passed) != want:
            bad.append(f"{name}: graded (correct, passed) = {(grade.correct, grade.passed)}, expected {want}")
        answers[ex.answer_key(ANSWERS[name])] = {"label": name, "result": last,
                                                 "verdicts": [r["verdict"] for r in runs],
                                                 "overlap_fractions": [r["overlap_fraction"] for r in runs]}
        med = median_fraction(runs)
        lines.append(f"| {name} | {len(runs)} | {', '.join(r['verdict'] for r in runs)} | "
                     f"{'-' if med is None else f'{med:.2f}'} | {grade.summary()[:90]} |")
    # What recording a timeline costs (SearchConfig.timeline): the slowest rank's profiled steps against the whole
    # evaluation, over every passing run here.
    cost = [(r["provenance"]["phases"]["rank.timeline"], r["provenance"].get("eval_seconds"))
            for runs in results.values() for r in runs
            if r["verdict"] == "pass" and "rank.timeline" in ((r.get("provenance") or {}).get("phases") or {})]
    timeline_cost = {"runs": len(cost), "median_s": statistics.median(c for c, _ in cost) if cost else None,
                     "median_share": statistics.median(c / e for c, e in cost if e) if any(e for _, e in cost)
                     else None}
    lines.append("")
    lines.append(f"Timeline cost ({timeline_cost['runs']} passing runs, {ex.ExerciseConfig().timeline_iters} profiled "
                 f"iterations each): median {timeline_cost['median_s']} s per evaluation, "
                 f"{timeline_cost['median_share']} of its time.")
    record = {"version": ex.RECORDING_VERSION, "timeline_cost": timeline_cost,
              "gpu": prov.get("gpu"), "driver": prov.get("driver"), "date": date,
              "world_size": ex.ExerciseConfig().world_size, "backend": ex.ExerciseConfig().backend,
              "preset": ex.ExerciseConfig().preset, "mark": mark, "mark_rule": rule, "answers": answers}
    out.mkdir(parents=True, exist_ok=True)
    (out / ex.RECORDING.name).write_text(json.dumps(record, indent=1, sort_keys=True))
    table = "\n".join([f"# Exercise recording ({prov.get('gpu')}, {date[:10]})", "", f"Pass mark {mark:.2f}: {rule}.",
                       "", *lines, ""])
    (out / ex.RECORDING.with_suffix(".md").name).write_text(table)
    print(table)
    for b in bad:
        print(f"UNEXPECTED: {b}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
