"""The teaching notebook's maths and readers: the overlap bound, its model schedule, the workload's counts and
the committed benchmark JSON."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from cuco_kit import teaching
from cuco_kit.errors import BadInput


def test_overlap_bound_is_at_most_two_and_grows_with_chunks():
    one = teaching.overlap_bound(1.0, 1.0, chunks=1)
    four = teaching.overlap_bound(1.0, 1.0, chunks=4)
    assert one["sequential_ms"] == one["pipelined_ms"] == 2.0 and one["speedup_pipelined"] == 1.0
    assert four["pipelined_ms"] == 1.25 and four["speedup_pipelined"] == pytest.approx(1.6)
    assert four["perfect_overlap_ms"] == 1.0 and four["speedup_bound"] == 2.0
    assert teaching.overlap_bound(1.0, 4.0, chunks=16)["speedup_bound"] == pytest.approx(1.25)
    with pytest.raises(BadInput):
        teaching.overlap_bound(1.0, 1.0, chunks=0)


@pytest.mark.parametrize("compute,comm,chunks", [(1.0, 1.0, 4), (1.0, 3.0, 2), (2.0, 0.5, 8)])
def test_model_schedule_ends_when_the_bound_says(compute, comm, chunks):
    events = teaching.model_schedule(compute, comm, chunks, ranks=2)
    assert len(events) == 2 * chunks * 2 and {e["rank"] for e in events} == {0, 1}
    end = max(e["start_us"] + e["dur_us"] for e in events)
    assert end == pytest.approx(teaching.overlap_bound(compute, comm, chunks)["pipelined_ms"])


def test_workload_counts_of_the_main_sample(repo_root: Path):
    df = teaching.workload_counts(repo_root / "sample_kernels" / "gemm_allgather", {"M": 8192, "N": 8192, "K": 8192})
    assert list(df["world"]) == [1, 2, 4, 8]
    per_rank = list(df["GFLOP per rank"])
    assert per_rank == sorted(per_rank, reverse=True)  # more ranks, less compute each


def test_benchmark_readers(tmp_path: Path, monkeypatch):
    (tmp_path / "sample_kernels").mkdir()
    bench = tmp_path / "benchmarks" / "gemm_allgather"
    bench.mkdir(parents=True)
    (bench / "a.json").write_text(json.dumps({"gpu": "H200", "results": [{"ms": 1.0}, {"ms": 2.0}]}))
    (bench / "b.json").write_text(json.dumps([{"ms": 3.0}]))
    (bench / "timeline-x.json").write_text(json.dumps({"events": [{"rank": 0}], "gpu": "H200", "date": "d"}))
    monkeypatch.setenv("CUCO_REPO_ROOT", str(tmp_path))

    frame = teaching.benchmark_frame(teaching.load_benchmarks("benchmarks/gemm_allgather/[ab].json"))
    assert list(frame["ms"]) == [1.0, 2.0, 3.0] and list(frame["gpu"].fillna("")) == ["H200", "H200", ""]
    assert list(frame["file"]) == ["a.json", "a.json", "b.json"]
    [tl] = teaching.recorded_timelines()
    assert tl["events"] == [{"rank": 0}] and tl["badge"] == "real" and tl["detail"] == "H200, d"

    (bench / "bad.json").write_text("{")
    with pytest.raises(BadInput, match="bad.json: not readable JSON"):
        teaching.load_benchmarks()
