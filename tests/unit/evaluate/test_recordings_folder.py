"""The data the notebooks replay lives in recordings/, listed in its MANIFEST.json; the engine and the widgets
name no benchmark folder, so tidying benchmarks/ changes nothing a newcomer sees."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from cuco_kit import workbench as wb
from cuco_kit.errors import BadInput
from cuco_kit.evaluate import manifest
from cuco_kit.evaluate.recordings import recording_files
from cuco_kit.store import Store

ROOT = Path(__file__).resolve().parents[3]
RECORDINGS = ROOT / "recordings"


def test_nothing_in_the_engine_or_the_widgets_names_benchmarks():
    offenders = [f"{p.relative_to(ROOT)}:{n}" for folder in ("cuco_kit", "widgets") for p in (ROOT / folder).rglob("*")
                 if p.suffix in (".py", ".md", ".cu", ".h", ".txt", ".json") and p.is_file()
                 for n, line in enumerate(p.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
                 if re.search(r"\bbenchmarks/", line)]
    assert not offenders, offenders


def test_the_manifest_lists_every_recording_and_each_exists():
    entries = manifest.read_manifest(RECORDINGS)
    files = {e["file"] for e in entries}
    assert all((RECORDINGS / f).is_file() for f in files), files
    assert {p.relative_to(RECORDINGS).as_posix() for p in recording_files(RECORDINGS)} <= files
    assert all(e["kind"] in manifest.KINDS and e.get("written_by") for e in entries)
    searches = [e for e in entries if e["kind"] == "search"]
    assert searches and all(e["gpu"] and e["date"] and e["configs"] for e in searches)  # recorded on a real GPU
    assert manifest.listed(RECORDINGS, "benchmark", "gemm_allgather")  # the teaching notebook's table


def test_the_notebooks_find_their_recordings_here(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(wb.RECORDINGS_ENV, raising=False)
    assert wb.recordings_dir() == RECORDINGS
    assert wb.recorded_searches() and all(p.parent == RECORDINGS for p in wb.recorded_searches())


def test_record_describes_a_store_and_replaces_its_entry(tmp_path: Path):
    with Store(tmp_path / "toy-symm2-search-seed0.sqlite") as st:
        rid = st.create_run(workload="toy", config={}, seed=0, badge="real")
        pid = st.add_program(run_id=rid, code="int a;\n", parent_id=None, source="seed", name="seed")
        eid = st.start_evaluation(pid, world_size=2, backend="symm", badge="real", request={})
        st.finish_evaluation(eid, {"level_reached": "L2", "verdict": "pass", "reason": "",
                                   "provenance": {"gpu": "NVIDIA H200", "date": "2026-12-05T08:00:00"}})
    entry = manifest.record(tmp_path, "toy-symm2-search-seed0.sqlite", "search", written_by="a script")
    assert entry == {"file": "toy-symm2-search-seed0.sqlite", "kind": "search", "workload": "toy",
                     "configs": ["symm-2"], "evaluations": 1, "gpu": "NVIDIA H200", "date": "2026-12-05",
                     "written_by": "a script"}
    manifest.record(tmp_path, tmp_path / "toy-symm2-search-seed0.sqlite", "search", written_by="again")
    [only] = manifest.read_manifest(tmp_path)
    assert only["written_by"] == "again"
    assert manifest.listed(tmp_path, "search", "toy") == [tmp_path / "toy-symm2-search-seed0.sqlite"]
    assert manifest.listed(tmp_path, "search", "other") == [] and manifest.listed(tmp_path, "timeline") == []


def test_a_broken_manifest_is_one_line(tmp_path: Path):
    (tmp_path / manifest.MANIFEST).write_text(json.dumps({"entries": [{"kind": "search"}]}))
    with pytest.raises(BadInput, match="MANIFEST.json: needs"):
        manifest.read_manifest(tmp_path)
    with pytest.raises(BadInput, match="recording kind 'notes'"):
        manifest.record(tmp_path, "x.json", "notes", written_by="t")  # type: ignore[arg-type]
