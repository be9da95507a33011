"""The teaching notebook's maths and readers: the overlap bound, its model schedule, the workload's counts and
the committed benchmark JSON."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from cuco_kit.errors import BadInput
from cuco_kit.evaluate import manifest
from cuco_kit.workbench import teaching


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


def test_benchmark_readers_read_what_the_manifest_lists(tmp_path: Path, monkeypatch):
    rec = tmp_path / "recordings"
    rec.mkdir()
    (rec / "a.json").write_text(json.dumps({"gpu": "H200", "results": [{"ms": 1.0}, {"ms": 2.0}]}))
    (rec / "b.json").write_text(json.dumps([{"ms": 3.0}]))
    (rec / "other.json").write_text(json.dumps([{"ms": 9.0}]))  # another workload's
    (rec / "unlisted.json").write_text(json.dumps([{"ms": 7.0}]))  # no manifest entry: never shown
    (rec / "timeline-x.json").write_text(json.dumps({"events": [{"rank": 0}], "gpu": "H200", "date": "d"}))
    for name, kind, workload in (("a.json", "benchmark", "gemm_allgather"), ("b.json", "benchmark", "gemm_allgather"),
                                 ("other.json", "benchmark", "kv_transfer"), ("timeline-x.json", "timeline", None)):
        manifest.record(rec, name, kind, workload=workload, written_by="test")
    monkeypatch.setenv("CUCO_RECORDINGS", str(rec))

    frame = teaching.benchmark_frame(teaching.load_benchmarks("gemm_allgather"))
    assert list(frame["ms"]) == [1.0, 2.0, 3.0] and list(frame["gpu"].fillna("")) == ["H200", "H200", ""]
    assert list(frame["file"]) == ["a.json", "a.json", "b.json"]
    [tl] = teaching.recorded_timelines()
    assert tl["events"] == [{"rank": 0}] and tl["badge"] == "real" and tl["detail"] == "H200, d"

    (rec / "b.json").write_text("{")
    with pytest.raises(BadInput, match="b.json: not readable JSON"):
        teaching.load_benchmarks()
