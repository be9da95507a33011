"""The benchmark plumbing that decides which rows a results table shows: merging GPU runs (a later run
supersedes a row and the superseded one is kept), references going with their own run's rows, and the --only
filter of a targeted re-run."""
from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str, path: Path) -> Any:
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def merge_runs() -> Any:
    return _load("merge_runs_under_test", ROOT / "benchmarks" / "merge_runs.py")


def _row(phase: str, name: str, world: int, preset: str, verdict: str = "pass", ms: float | None = 1.0) -> dict:
    return {"phase": phase, "name": name, "world": world, "backend": "nccl" if world == 1 else "symm",
            "preset": preset, "verdict": verdict, "reason": "" if verdict == "pass" else "timeout: hang",
            "median_ms": ms}


def _run(rows: list[dict], skipped: list[str] = (), **refs: dict) -> dict:
    return {"meta": {"date": "2026-12-03", "skipped": list(skipped)}, **refs, "rows": rows}


@pytest.mark.timeout(60)
def test_a_later_run_supersedes_a_failed_row_and_keeps_it(merge_runs: Any) -> None:
    first = _run([_row("bench", "v1", 4, "paper", "fail", None), _row("bench", "v2", 4, "paper")])
    fix = _run([_row("bench", "v1", 4, "paper", "pass", 3.6)])
    merged = merge_runs.merge([(first, "first"), (fix, "after the fix")])
    by_name = {r["name"]: r for r in merged["rows"]}
    assert by_name["v1"]["verdict"] == "pass" and by_name["v1"]["run"] == "after the fix"
    assert by_name["v2"]["run"] == "first"
    assert [(r["name"], r["verdict"], r["superseded_by"]) for r in merged["superseded"]] == [
        ("v1", "fail", "after the fix")]


@pytest.mark.timeout(60)
def test_references_follow_the_run_that_measured_rows_beside_them(merge_runs: Any) -> None:
    old = _run([_row("bench", "v", 1, "8192")], cublas_alone={"8192-W1": {"median_ms": 1.37}, "8192-W4": {"x": 0}})
    new = _run([_row("bench", "v", 4, "8192")], cublas_alone={"8192-W1": {"median_ms": 1.40},
                                                               "8192-W4": {"median_ms": 0.34}})
    ref = merge_runs.merge([(old, "old"), (new, "new")])["cublas_alone"]
    assert ref["8192-W1"]["median_ms"] == 1.37  # the new run measured no world-1 rows at 8192
    assert ref["8192-W4"]["median_ms"] == 0.34
    # an L2-only run (no benchmark rows) never replaces a preset-keyed reference
    l2_only = _run([_row("L2", "v", 1, "small")], torch={"paper": {"kernel_us": 1.0}})
    bench = _run([_row("bench", "v", 1, "paper")], torch={"paper": {"kernel_us": 2.0}})
    assert merge_runs.merge([(bench, "b"), (l2_only, "l2")])["torch"]["paper"]["kernel_us"] == 2.0


@pytest.mark.timeout(60)
def test_a_row_skipped_in_one_run_and_measured_in_another_is_not_skipped(merge_runs: Any) -> None:
    cut = _run([], skipped=["bench v nccl-1 paper", "bench w nccl-1 paper"])
    later = _run([_row("bench", "v", 1, "paper")])
    assert merge_runs.merge([(cut, "cut"), (later, "later")])["meta"]["skipped"] == ["bench w nccl-1 paper"]


@pytest.mark.timeout(60)
def test_an_earlier_merge_is_a_run_whose_notes_and_superseded_rows_carry_over(merge_runs: Any) -> None:
    first = _run([_row("bench", "v1", 4, "paper", "fail", None), _row("bench", "v2", 4, "paper")])
    fix = _run([_row("bench", "v1", 4, "paper", "pass", 3.6)])
    earlier = merge_runs.merge([(first, "first"), (fix, "fix")])
    again = _run([_row("bench", "v2", 4, "paper", "pass", 2.0)])
    merged = merge_runs.merge([(earlier, "ignored: an earlier merge keeps its own notes"), (again, "again")])
    assert [m["note"] for m in merged["meta"]["runs"]] == ["first", "fix", "again"]
    assert {(r["name"], r["run"]) for r in merged["rows"]} == {("v1", "fix"), ("v2", "again")}
    assert [(r["name"], r["superseded_by"]) for r in merged["superseded"]] == [("v1", "fix"), ("v2", "again")]


@pytest.mark.timeout(60)
def test_bench_presets_narrow_the_scripts_presets_and_name_unknown_ones() -> None:
    common = _load("bench_common_under_test", ROOT / "benchmarks" / "common.py")
    args = common.base_args("x", ROOT).parse_args(["--bench-presets", "b", "--worlds", "1", "--only", "^$"])
    bench = common.SampleBench("attention_cp", args)
    try:
        assert bench.bench_labels(["a", "b", "c"]) == ["b"]
        with pytest.raises(SystemExit, match="'zz'"):
            bench.args.bench_presets = "b,zz"
            bench.bench_labels(["a", "b"])
    finally:
        bench.close()


@pytest.mark.timeout(120)
def test_only_keeps_the_matching_seeds_and_variants() -> None:
    common = _load("bench_common_under_test", ROOT / "benchmarks" / "common.py")
    args = argparse.Namespace(smoke=False, worlds="4", only="Overlapped/ChunkFlags/Cta/InKernel", budget_s=1.0,
                              l2_presets=None)
    bench = common.SampleBench("attention_cp", args)
    try:
        assert bench.seeds == {}
        assert [common.short(kv) for kv, _ in bench.variants] == ["Overlapped/ChunkFlags/Cta/InKernel/4"]
    finally:
        bench.close()


def _shape(m: int, k: int, p: int, c: int, ratio: float, ok: bool = True) -> dict:
    return {"m_tiles": m, "block_k": k, "prefetch_k": p, "min_ctas": c, "vs_sdpa": ratio, "ok": ok}


@pytest.mark.timeout(60)
def test_tile_shapes_chooses_the_best_worst_case_correct_shape_and_rewrites_only_its_line(tmp_path: Path) -> None:
    ts = _load("tile_shapes_under_test", ROOT / "benchmarks" / "attention_cp" / "tile_shapes.py")
    rows = [  # D 64 at two presets: (1,64,1,1) is best causal but worst non-causal; (2,64,0,1) is wrong once
        {"D": 64, "shapes": [_shape(1, 64, 1, 1, 0.70), _shape(1, 128, 0, 4, 0.62), _shape(2, 64, 0, 1, 0.9)]},
        {"D": 64, "shapes": [_shape(1, 64, 1, 1, 0.55), _shape(1, 128, 0, 4, 0.61),
                             _shape(2, 64, 0, 1, 0.9, ok=False)]},
        {"D": 128, "shapes": [_shape(1, 64, 0, 1, 0.66)]},
    ]
    best = ts.choose(rows)
    assert (best[64]["block_k"], best[64]["prefetch_k"], best[64]["min_ctas"]) == (128, 0, 4)
    assert best[64]["worst_vs_sdpa"] == pytest.approx(0.61)
    header = tmp_path / "attention_kernel.cuh"
    original = (ROOT / "sample_kernels" / "attention_cp" / "attention_kernel.cuh").read_text()
    header.write_text(original)
    ts.apply(best, header)
    text = header.read_text()
    assert "template <> struct TileShape<64> : TileConfig<1, 128, false, 4> {};" in text
    assert "template <> struct TileShape<128> : TileConfig<1, 64, false, 1> {};" in text
    line32 = next(x for x in original.splitlines() if x.startswith("template <> struct TileShape<32>"))
    assert line32 in text  # D 32 was not measured: untouched
    assert len(text.splitlines()) == len(original.splitlines())
