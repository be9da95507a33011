"""`--record DIR` / `--replay DIR` of LLM calls from `cuco search`, `cuco fastpath` and the workbench: a short run
is recorded against the fake OpenAI-compatible server (real HTTP on 127.0.0.1, SCRIPTED answers labelled as
fixtures, written as a model answers: a header, a rationale, edits or a fenced file), then replayed with the server
stopped, and the replay must make the same proposals. A replay that runs out of recorded answers fails with one
line naming the call."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cuco_kit import workbench
from cuco_kit.cli import main
from cuco_kit.commands import fastpath as fastpath_command
from cuco_kit.evaluate.build import BuildResult
from cuco_kit.evaluate.simulated import SimulatedEvaluator
from cuco_kit.fastpath import FastPath
from cuco_kit.llm import CallLog, OpenAICompatibleClient
from cuco_kit.llm.fake_server import FakeOpenAIServer, Scripted, answer
from cuco_kit.llm.replay import RECORDING_FILE
from cuco_kit.search.synthetic import BASELINE, write_synthetic_workload
from cuco_kit.store import Store

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "cuco_kit" / "llm" / "fixtures"
FASTPATH_WORKLOAD = ROOT / "sample_kernels" / "gemm_allgather"
LAUNCH = "    gather_chunks<<<64, kThreads, 0, stream>>>(x, y, n, c);"

DIFF = """NAME: streaming stores
RATIONALE: y is not read again, so bypass L1 and keep L2 for the peers.
TAGS: memory
<<<<<<< SEARCH
    y[j] = x[j];
=======
    float v = __ldg(&x[j]);
    __stcs(&y[j], v);
>>>>>>> REPLACE
"""
FULL = "NAME: wider grid\nRATIONALE: more CTAs hide the put latency.\nTAGS: grid\n```cuda\n" + \
    BASELINE.replace(LAUNCH, "    gather_chunks<<<256, kThreads, 0, stream>>>(x, y, n, c);") + "```\n"
CROSS = "NAME: grid plus streaming\nRATIONALE: A's grid with B's stores.\nTAGS: crossover\n```cuda\n" + \
    BASELINE.replace(LAUNCH, "    gather_chunks<<<192, kThreads, 0, stream>>>(x, y, n, c);").replace(
        "    y[j] = x[j];\n", "    float w = x[j];\n    __stwt(&y[j], w);\n") + "```\n"
RESAMPLE = "NAME: smaller grid\nRATIONALE: fewer CTAs, each moving more data.\nTAGS: grid\n```cuda\n" + \
    BASELINE.replace(LAUNCH, "    gather_chunks<<<32, kThreads, 0, stream>>>(x, y, n, c);") + "```\n"
META = "- streaming stores won so far\n- wider grids help at this size"


def search_script() -> list[Scripted]:
    return [answer("diff", DIFF, match="targeted edits", times=0),
            answer("full", FULL, match="rewrite the program", times=0),
            answer("crossover", CROSS, match="combine the strengths", times=0),
            answer("meta", META, match="summarise what the search", times=0),
            answer("scratchpad", "Works: streaming stores", match="update the search's scratchpad", times=0),
            answer("recommend", "1. Try wider grids", match="rank recommendations", times=0),
            answer("diagnosis", "CAUSE: the knob left its set.\nFIX: keep it in.", match="diagnose one evaluation",
                   times=0),
            answer("repair", FULL, match="could not be applied", times=0),
            answer("resample", RESAMPLE, match="Your proposal was not used", times=0)]


def proposals(db: Path) -> list[tuple[Any, ...]]:
    with Store(db) as s:
        (run,) = s.runs()
        return [(p["source"], p["name"], p["code"], p["parent_id"], p["status"]) for p in s.proposals(run["id"])]


def search_args(wl: Path, db: Path, *extra: str) -> list[str]:
    return ["search", str(wl), "--mutator", "llm", "--generations", "3", "--db", str(db), "--seed", "1",
            "--evaluator", "simulated", "--llm-retries", "0", *extra]


def point_at(monkeypatch: pytest.MonkeyPatch, srv: FakeOpenAIServer) -> None:
    for k, v in srv.env().items():
        monkeypatch.setenv(k, v)


def test_search_replay_reproduces_the_recorded_proposals_with_the_server_stopped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    wl = write_synthetic_workload(tmp_path / "wl")
    calls = tmp_path / "calls"
    with FakeOpenAIServer(search_script()) as srv:
        point_at(monkeypatch, srv)
        assert main(search_args(wl, tmp_path / "rec.db", "--record", str(calls), "--json")) == 0
        asked = len(srv.chat_requests())
    recorded = proposals(tmp_path / "rec.db")
    llm_made = [p for p in recorded if p[0].startswith("llm_")]
    assert len(llm_made) >= 3 and asked >= 3  # the run did ask the model, and kept its answers
    lines = (calls / RECORDING_FILE).read_text().splitlines()
    assert len(lines) == asked and all(json.loads(ln)["completion"]["fixture"] for ln in lines)
    capsys.readouterr()
    # The server is stopped: its address refuses connections, so only the recording can answer.
    assert main(search_args(wl, tmp_path / "replay.db", "--replay", str(calls), "--json")) == 0
    assert proposals(tmp_path / "replay.db") == recorded
    with Store(tmp_path / "replay.db") as s:
        calls_made = s.llm_calls()
    assert len(calls_made) == asked and all(c["ok"] and c["dollars"] == 0.0 for c in calls_made)


def test_a_search_replay_that_runs_out_of_answers_fails_with_one_line_naming_the_call(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    wl = write_synthetic_workload(tmp_path / "wl")
    calls = tmp_path / "calls"
    with FakeOpenAIServer(search_script()) as srv:
        point_at(monkeypatch, srv)
        assert main(search_args(wl, tmp_path / "rec.db", "--record", str(calls), "--generations", "1")) == 0
    capsys.readouterr()
    # Replaying a longer run than was recorded: generation 2's prompts were never sent to a model.
    rc = main(search_args(wl, tmp_path / "replay.db", "--replay", str(calls)))
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("cuco search:")]
    assert rc == 1 and len(err) == 1
    assert "replay miss" in err[0] and "call 'search." in err[0] and "stopped" in err[0]


def test_record_and_replay_flags_are_checked_before_the_search_starts(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    wl = write_synthetic_workload(tmp_path / "wl")
    assert main(search_args(wl, tmp_path / "x.db", "--replay", str(tmp_path / "nothing-here"))) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--replay" in err and "no LLM recording" in err
    offline = ["search", str(wl), "--generations", "1", "--db", str(tmp_path / "y.db"), "--evaluator", "simulated",
               "--record", str(tmp_path / "calls")]
    assert main(offline) == 2
    assert "--mutator offline makes none" in capsys.readouterr().err
    assert not (tmp_path / "x.db").exists() and not (tmp_path / "y.db").exists()


def test_workbench_new_search_records_and_replays_with_one_parameter(tmp_path: Path) -> None:
    wl = write_synthetic_workload(tmp_path / "wl")
    folder = tmp_path / "calls"

    def run(db: str, llm: Any, calls: CallLog) -> list[tuple[Any, ...]]:
        cfg = {"seed": 1, "proposals_per_generation": 3, "world_size": 1, "backend": "nccl"}
        engine, store = workbench.new_search(wl, SimulatedEvaluator(seed=1), db=tmp_path / db, gate="auto",
                                             generations=2, llm=llm, config=cfg, llm_calls=calls)
        for phase in (engine.config.phases.explore, engine.config.phases.exploit):
            phase.mix = {"diff": 1.0, "full": 1.0, "crossover": 1.0}
        engine.run()
        store.close()
        return proposals(tmp_path / db)

    with FakeOpenAIServer(search_script()) as srv:
        recorded = run("rec.db", OpenAICompatibleClient(srv.config(max_retries=0)), CallLog.record(folder))
        asked = len(srv.chat_requests())
    assert asked >= 3 and any(p[0].startswith("llm_") for p in recorded)
    assert run("replay.db", None, CallLog.replay(folder)) == recorded


# ---- fast path ------------------------------------------------------------------------------------------------

def _fixture_answer(name: str) -> str:
    return f"Here is the rewritten file.\n\n```cuda\n{(FIXTURES / name).read_text()}```\n"


def _no_compile_builds(monkeypatch: pytest.MonkeyPatch) -> None:
    """L1 through a test double that compiles nothing (and says so); no GPU, so L2 is not run."""
    def builder(code: str, backend: str, cfg: object = None, cache_dir: object = None) -> BuildResult:
        return BuildResult(True, Path("/nonexistent/fake.so"), "TEST DOUBLE: nothing compiled", 0.0, False, "fake")

    monkeypatch.setattr(fastpath_command, "FastPath", lambda *a, **kw: FastPath(*a, **kw, builder=builder))
    monkeypatch.setattr(fastpath_command, "gpu_present", lambda: False)


def test_fastpath_replay_gives_the_recorded_result_without_a_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    _no_compile_builds(monkeypatch)
    script = [answer("stage-a", _fixture_answer("gemm_stage_a.cu")),
              answer("stage-b", _fixture_answer("gemm_stage_b_lsa.cu")),
              answer("annotate", _fixture_answer("gemm_annotated.cu"))]
    seed = str(FASTPATH_WORKLOAD / "seed_nccl.cu")
    calls = tmp_path / "calls"
    with FakeOpenAIServer(script) as srv:
        point_at(monkeypatch, srv)
        assert main(["fastpath", seed, "--record", str(calls), "--out", str(tmp_path / "rec.cu")]) == 0
    capsys.readouterr()
    assert main(["fastpath", seed, "--replay", str(calls), "--out", str(tmp_path / "replay.cu")]) == 0
    assert (tmp_path / "replay.cu").read_text() == (tmp_path / "rec.cu").read_text()
    assert "__stcs" in (tmp_path / "replay.cu").read_text() or "EVOLVE" in (tmp_path / "replay.cu").read_text()
    # A different request (single stage) was never recorded: one line naming the call.
    capsys.readouterr()
    assert main(["fastpath", seed, "--replay", str(calls), "--single-stage"]) == 1
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("cuco fastpath:")]
    assert len(err) == 1 and "replay miss" in err[0] and "call 'fastpath.single_stage'" in err[0]


def test_a_refused_call_is_recorded_and_replayed_as_the_same_refusal(tmp_path: Path) -> None:
    from cuco_kit.llm import LLMRequestRejected

    msgs = [{"role": "user", "content": "Task: improve the program with targeted edits"}]
    with FakeOpenAIServer([answer("diff", DIFF, match="targeted edits")]) as srv:
        rec = CallLog.record(tmp_path).wrap(OpenAICompatibleClient(srv.config(max_retries=0)))
        assert rec.complete(msgs, purpose="search.mutate.diff").text == DIFF
        with pytest.raises(LLMRequestRejected):  # the script is spent: HTTP 400
            rec.complete(msgs + [{"role": "user", "content": "again"}], purpose="search.mutate.diff")
    replay = CallLog.replay(tmp_path).wrap(None)
    assert replay.complete(msgs, purpose="search.mutate.diff").text == DIFF
    with pytest.raises(LLMRequestRejected, match=r"\(replayed\).*fixture script exhausted"):
        replay.complete(msgs + [{"role": "user", "content": "again"}], purpose="search.mutate.diff")


def test_a_fastpath_replay_whose_judge_call_was_not_recorded_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """The stages' answers are in the recording but the judge's diagnosis is not. The retry's prompt carries the
    diagnosis, so it misses too; the one line names the first call the recording could not answer, the judge's."""
    _no_compile_builds(monkeypatch)
    bad_a = "Here is the rewritten file.\n\n```cuda\n__global__ void k() {}\n```\n"  # fails L0: no ABI entry points
    script = [answer("stage-a-bad", bad_a), answer("stage-a", _fixture_answer("gemm_stage_a.cu")),
              answer("stage-b", _fixture_answer("gemm_stage_b_lsa.cu")),
              answer("annotate", _fixture_answer("gemm_annotated.cu")),
              answer("judge", "The file lost the ABI entry points and the host all-gather; start from the seed.",
                     match="Diagnose the failure")]
    seed = str(FASTPATH_WORKLOAD / "seed_nccl.cu")
    calls = tmp_path / "calls"
    with FakeOpenAIServer(script) as srv:
        point_at(monkeypatch, srv)
        assert main(["fastpath", seed, "--record", str(calls), "--max-attempts", "2"]) == 0
    lines = (calls / RECORDING_FILE).read_text().splitlines()
    judge = [ln for ln in lines if json.loads(ln)["purpose"] == "fastpath.judge"]
    assert len(judge) == 1
    (calls / RECORDING_FILE).write_text("\n".join(ln for ln in lines if ln not in judge) + "\n")
    capsys.readouterr()
    assert main(["fastpath", seed, "--replay", str(calls), "--max-attempts", "2"]) == 1
    out, err = capsys.readouterr()
    assert "fast path: llm_error" in out
    lines_err = [ln for ln in err.splitlines() if ln.startswith("cuco fastpath:")]
    assert len(lines_err) == 1 and "call 'fastpath.judge'" in lines_err[0]
