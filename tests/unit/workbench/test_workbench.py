"""The notebooks' facade over the engine: finding samples and recordings, choosing an evaluator honestly, and
wiring runs and the fast path (smoke mode: the fake LLM with the packaged fixture answers)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from cuco_kit import workbench as wb
from cuco_kit.errors import BadInput, CucoError
from cuco_kit.evaluate.replay import ReplayEvaluator
from cuco_kit.evaluate.simulated import SimulatedEvaluator
from cuco_kit.fastpath import FastPath
from cuco_kit.llm import fixtures
from cuco_kit.workbench import smoke
from cuco_kit.workbench.badges import label
from cuco_kit.workbench.report import run_badge


@pytest.fixture()
def no_recordings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    empty = tmp_path / "recordings"
    empty.mkdir()
    monkeypatch.setenv(wb.RECORDINGS_ENV, str(empty))
    monkeypatch.setenv(smoke.SMOKE_ENV, "1")
    monkeypatch.delenv(wb.EVALUATOR_ENV, raising=False)
    monkeypatch.chdir(tmp_path)  # run databases go to ./runs
    return empty


def test_samples(repo_root: Path):
    assert wb.repo_root() == repo_root
    assert wb.main_sample() == repo_root / "sample_kernels" / "gemm_allgather"
    with pytest.raises(BadInput, match="no sample workload 'nope'; available: .*gemm_allgather"):
        wb.sample("nope")


def test_recordings_are_found_in_one_place(repo_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(wb.RECORDINGS_ENV, raising=False)
    assert wb.recordings_dir() == repo_root / "recordings"
    assert wb.recorded_runs() and all(p.parent == wb.recordings_dir() for p in wb.recorded_runs())
    (tmp_path / "deep").mkdir()
    for name in ("b.sqlite", "deep/a.db", "c.sqlite3", "notes.txt"):
        (tmp_path / name).write_text("")
    monkeypatch.setenv(wb.RECORDINGS_ENV, str(tmp_path))
    assert wb.recordings_dir() == tmp_path
    assert [p.relative_to(tmp_path).as_posix() for p in wb.recorded_runs()] == ["b.sqlite", "c.sqlite3", "deep/a.db"]


def test_smoke_run_replays_the_newest_recording(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(smoke.SMOKE_ENV, "1")
    monkeypatch.delenv(wb.EVALUATOR_ENV, raising=False)
    newest = wb.recorded_runs()[-1]
    copy = tmp_path / newest.name
    shutil.copy(newest, copy)
    monkeypatch.setenv(wb.RECORDINGS_ENV, str(tmp_path))
    choice = wb.pick_evaluator()
    try:
        assert isinstance(choice.evaluator, ReplayEvaluator) and choice.recorded is not None
        assert choice.recorded.path == copy and choice.recorded.evaluations > 0
        assert choice.note == wb.Note(choice.message, "replayed") and str(choice) == choice.message
        assert choice.message.startswith("smoke run: replaying real measurements")
        cfg = wb.replay_config(choice)
        assert cfg is not None and "workload_dir" not in cfg
    finally:
        choice.close()


def test_without_recordings_the_evaluator_is_simulated_and_says_so(no_recordings: Path):
    choice = wb.pick_evaluator()
    assert isinstance(choice.evaluator, SimulatedEvaluator) and choice.badge == "simulated"
    assert "no recorded real run exists yet" in choice.message and "SIMULATED" in choice.message
    assert wb.replay_config(choice) is None
    with pytest.raises(BadInput, match="no recorded run exists yet"):
        wb.pick_evaluator("replay")
    with pytest.raises(BadInput, match="use gpu, replay or simulated"):
        wb.pick_evaluator("tpu")


def test_finished_run_of_a_given_database_and_what_won(tmp_path: Path):
    db = tmp_path / "mine.sqlite"
    shutil.copy(wb.recorded_runs()[-1], db)
    store, run_id, note = wb.finished_run(wb.main_sample(), db=db)
    try:
        assert note.badge == "info" and note.text.startswith(f"run {run_id} of ")
        won = wb.what_won(store, run_id)
        assert won.program is not None and won.note.text.startswith(f"best candidate: #{won.program['id']}")
        assert won.note.text.endswith(f"[{label(won.note.badge, run_badge(store, run_id)[1])}]")
        assert won.note.badge == "replayed" and "changed" in won.knobs.columns
    finally:
        store.close()


def test_finished_run_without_recordings_runs_a_simulated_search(no_recordings: Path):
    store, run_id, note = wb.finished_run(wb.main_sample(), generations=1)
    try:
        assert note.badge == "simulated" and "SIMULATED search run" in str(note)
        assert wb.what_won(store, run_id).note.badge == "simulated"
    finally:
        store.close()


def test_fastpath_fixtures_come_from_the_package():
    script = wb.fastpath_fixtures()
    assert [f.name for f in script] == ["stage-a", "stage-a-retry", "stage-b", "stage-b-retry", "annotate",
                                        "annotate-retry", "judge"]
    assert fixtures.load("gemm_stage_a.cu") in script[0].text and "FIXTURE answer" in script[0].text
    assert "FIXTURE retry answer" in script[1].text
    with pytest.raises(CucoError, match="no fixture answer 'nope.cu'.*gemm_stage_a.cu"):
        fixtures.load("nope.cu")


def test_fast_path_in_a_smoke_run_uses_the_fake_llm(no_recordings: Path):
    choice = wb.pick_evaluator()
    fp, note = wb.fast_path(wb.main_sample(), choice)
    try:
        assert isinstance(fp, FastPath) and note.badge == "fixture" and "smoke run" in note.text
        assert len(smoke.running_fake_servers()) == 1
    finally:
        assert smoke.cleanup() == 1
        fp.store.close()
