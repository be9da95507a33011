"""`cuco search` through the real CLI dispatcher: a simulated offline run, its resume, and a replayed run."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from cuco_kit.cli import main
from cuco_kit.search.synthetic import write_synthetic_workload
from cuco_kit.store import Store


def test_cuco_search_simulated_json_and_resume(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    wl = write_synthetic_workload(tmp_path / "wl")
    db = tmp_path / "s.db"
    args = ["search", str(wl), "--mutator", "offline", "--generations", "2", "--db", str(db), "--ranks", "2",
            "--backend", "symm", "--seed", "4", "--evaluator", "simulated", "--json"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["state"] == "finished" and out["generations"] == 2 and out["badge"] == "simulated"
    assert out["evaluations"] == len(Store(db).programs(out["run_id"]))
    # the same command with a larger budget resumes the run in the database
    args[args.index("--generations") + 1] = "3"
    assert main(args) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["run_id"] == out["run_id"] and again["generations"] == 3
    assert again["evaluations"] > out["evaluations"]
    with Store(db) as s:
        assert len(s.runs()) == 1
        evs = s.evaluations(run_id=out["run_id"])
        assert all(e["world_size"] == 2 and e["backend"] == "symm" for e in evs)


def test_cuco_search_replay_needs_a_database_and_never_invents_numbers(tmp_path: Path, monkeypatch,
                                                                       capsys: pytest.CaptureFixture) -> None:
    wl = write_synthetic_workload(tmp_path / "wl")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CUCO_REPLAY_DB", raising=False)
    args = ["search", str(wl), "--generations", "1", "--db", str(tmp_path / "r.db"), "--evaluator", "replay",
            "--json"]
    assert main(args) == 2
    assert "replay database" in capsys.readouterr().err
    # a database of real rows holding only the baseline: everything else is "unavailable", never a number
    src = tmp_path / "real.db"
    with Store(src) as s:
        rid = s.create_run(workload="synthetic_gemm_allgather", config={}, badge="real")
        pid = s.add_program(run_id=rid, code=(wl / "baseline.cu").read_text(), parent_id=None, source="baseline")
        eid = s.start_evaluation(pid, world_size=1, backend="nccl", badge="real", request={})
        s.finish_evaluation(eid, {"level_reached": "L3", "verdict": "pass", "median_ms": 0.8, "speedup": 1.25,
                                  "badge": "real", "provenance": {"gpu": "NVIDIA H200", "date": "2025-05-01"}})
    monkeypatch.setenv("CUCO_REPLAY_DB", str(src))
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["badge"] == "replayed" and out["best_speedup"] == pytest.approx(1.25)
    with Store(tmp_path / "r.db") as s:
        evs = s.evaluations(run_id=out["run_id"])
        served = [e for e in evs if e["verdict"] == "pass"]
        assert len(served) == 1 and served[0]["gpu"] == "NVIDIA H200" and served[0]["badge"] == "replayed"
        others = [e for e in evs if e["verdict"] != "pass"]
        assert others and all(e["verdict"] == "unavailable" and e["median_ms"] is None for e in others)
