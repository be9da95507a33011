"""Model roles and the single-stage mode of the fast path, against the fake OpenAI-compatible server (real HTTP on
127.0.0.1) serving SCRIPTED answers labelled as fixtures. The server records the model each request named, so
the tests can tell which role asked which model. Builds go through `RecordingBuilder`, a test double that
compiles nothing and says so."""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from cuco_kit.commands import fastpath as fastpath_command
from cuco_kit.evaluate.build import BuildResult
from cuco_kit.fastpath import FastPath, FastPathConfig
from cuco_kit.llm import OpenAICompatibleClient
from cuco_kit.llm.fake_server import FakeOpenAIServer, answer
from cuco_kit.store import Store

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "cuco_kit" / "llm" / "fixtures"
WORKLOAD = ROOT / "sample_kernels" / "gemm_allgather"
SEED = (WORKLOAD / "seed_nccl.cu").read_text()
STAGE_A = (FIXTURES / "gemm_stage_a.cu").read_text()
STAGE_B = (FIXTURES / "gemm_stage_b_lsa.cu").read_text()
ANNOTATED = (FIXTURES / "gemm_annotated.cu").read_text()
NOCOMPILE = (ROOT / "tests" / "data" / "fastpath" / "gemm_stage_b_nocompile.cu").read_text()
JUDGE = "Diagnose the failure"  # a phrase only the judge prompt's user message carries


def cuda(code: str, note: str = "Rewritten as asked.") -> str:
    return f"{note}\n\n```cuda\n{code}```\n"


@dataclass
class RecordingBuilder:
    """Test double for L1: compiles nothing; fails code containing one of `fail_on` with a fake log."""

    fail_on: tuple[str, ...] = ()
    calls: list[str] = field(default_factory=list)

    def __call__(self, code: str, backend: str, cfg: object = None, cache_dir: object = None) -> BuildResult:
        self.calls.append(backend)
        bad = next((s for s in self.fail_on if s in code), None)
        if bad:
            return BuildResult(False, None, f"TEST DOUBLE (nothing compiled): error: identifier \"{bad}\" is "
                               "undefined", 0.0, False, "fake")
        return BuildResult(True, Path("/nonexistent/fake.so"), "TEST DOUBLE: nothing compiled", 0.0, False, "fake")


def client_for(srv: FakeOpenAIServer, **cfg: object) -> OpenAICompatibleClient:
    opts: dict[str, Any] = {"max_retries": 0, "timeout_s": 10.0, **cfg}
    return OpenAICompatibleClient(srv.config(**opts))


def user_messages(srv: FakeOpenAIServer) -> list[str]:
    return [r.body["messages"][-1]["content"] for r in srv.chat_requests()]


REWRITER, JUDGE_MODEL = "big-coder", "cheap-judge"
SINGLE = "ONE rewrite"  # a phrase only the single-stage prompt carries


def asked(srv: FakeOpenAIServer) -> list[tuple[str, bool]]:
    """(model named in the request, whether it was the judge's prompt) for every chat request, in order."""
    return [(r.body["model"], JUDGE in r.body["messages"][-1]["content"]) for r in srv.chat_requests()]


def test_rewrite_and_judge_calls_go_to_their_own_models_through_one_ledger(tmp_path: Any) -> None:
    script = [answer("stage-b-nocompile", cuda(NOCOMPILE)),
              answer("judge", "The barrier session type is misspelled (ncclLsaBarierSession); fix the name.",
                     match=JUDGE),
              answer("stage-b", cuda(STAGE_B))]
    with Store(tmp_path / "roles.db") as store, FakeOpenAIServer(script) as srv:
        cfg = FastPathConfig(gpu=False, max_attempts=2, rewrite_model=REWRITER, judge_model=JUDGE_MODEL)
        fp = FastPath(SEED, WORKLOAD, client_for(srv, model=REWRITER), None, store, cfg,
                      builder=RecordingBuilder(fail_on=("ncclLsaBarierSession",)), seed_name="seed_nccl.cu",
                      judge_llm=client_for(srv, model=JUDGE_MODEL))
        fp.current_code = STAGE_A
        out = fp.stage_b()
        calls = store.llm_calls(fp.run_id)
        run_cfg = store.run(fp.run_id)["config"]["fastpath"]
    assert [a.verdict for a in out.attempts] == ["fail", "pass_l1"]
    assert out.attempts[0].diagnosis.startswith("The barrier session type is misspelled")
    assert asked(srv) == [(REWRITER, False), (JUDGE_MODEL, True), (REWRITER, False)]
    # Both roles spend from the same ledger (one budget), each call under its purpose.
    assert [c["purpose"] for c in calls] == ["fastpath.stage_b", "fastpath.judge", "fastpath.stage_b"]
    assert fp.judge_llm.ledger is fp.ledger
    assert (run_cfg["rewrite_model"], run_cfg["judge_model"]) == (REWRITER, JUDGE_MODEL)


def test_without_a_judge_client_the_rewrite_model_judges() -> None:
    script = [answer("stage-b-nocompile", cuda(NOCOMPILE)), answer("judge", "Misspelled type.", match=JUDGE)]
    with FakeOpenAIServer(script) as srv:
        fp = FastPath(SEED, WORKLOAD, client_for(srv, model=REWRITER), None, None,
                      FastPathConfig(gpu=False, max_attempts=1),
                      builder=RecordingBuilder(fail_on=("ncclLsaBarierSession",)))
        fp.current_code = STAGE_A
        fp.stage_b()
    assert asked(srv) == [(REWRITER, False), (REWRITER, True)]


def _cli_args(*extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    fastpath_command.add_arguments(parser)
    return parser.parse_args([str(WORKLOAD / "seed_nccl.cu"), "--max-attempts", "2", *extra])


def test_cli_model_flags_send_each_role_to_its_model(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    script = [answer("stage-a", cuda(STAGE_A)), answer("stage-b-nocompile", cuda(NOCOMPILE)),
              answer("judge", "Misspelled barrier type.", match=JUDGE), answer("stage-b", cuda(STAGE_B)),
              answer("annotate", cuda(ANNOTATED))]
    builder = RecordingBuilder(fail_on=("ncclLsaBarierSession",))

    def with_test_builder(*a: Any, **kw: Any) -> FastPath:
        return FastPath(*a, **kw, builder=builder)

    monkeypatch.setattr(fastpath_command, "FastPath", with_test_builder)
    monkeypatch.setattr(fastpath_command, "gpu_present", lambda: False)
    with FakeOpenAIServer(script) as srv:
        for k, v in srv.env().items():
            monkeypatch.setenv(k, v)
        rc = fastpath_command.run(_cli_args("--rewrite-model", REWRITER, "--judge-model", JUDGE_MODEL,
                                            "--db", str(tmp_path / "cli.db")))
    assert rc == 0
    assert asked(srv) == [(REWRITER, False), (REWRITER, False), (JUDGE_MODEL, True), (REWRITER, False),
                          (REWRITER, False)]
    with Store(tmp_path / "cli.db") as st:
        cfg = st.runs()[0]["config"]["fastpath"]
    assert (cfg["rewrite_model"], cfg["judge_model"], cfg["single_stage"]) == (REWRITER, JUDGE_MODEL, False)


def test_cli_model_alone_takes_both_roles(monkeypatch: pytest.MonkeyPatch) -> None:
    script = [answer("stage-a", cuda(STAGE_A)), answer("stage-b-nocompile", cuda(NOCOMPILE)),
              answer("judge", "Misspelled barrier type.", match=JUDGE), answer("stage-b", cuda(STAGE_B)),
              answer("annotate", cuda(ANNOTATED))]
    monkeypatch.setattr(fastpath_command, "FastPath",
                        lambda *a, **kw: FastPath(*a, **kw, builder=RecordingBuilder(
                            fail_on=("ncclLsaBarierSession",))))
    monkeypatch.setattr(fastpath_command, "gpu_present", lambda: False)
    with FakeOpenAIServer(script) as srv:
        for k, v in srv.env().items():
            monkeypatch.setenv(k, v)
        assert fastpath_command.run(_cli_args("--model", "only-one")) == 0
    assert {m for m, _ in asked(srv)} == {"only-one"} and sum(j for _, j in asked(srv)) == 1


# ---- single stage -------------------------------------------------------------------------------------------

def test_single_stage_rewrites_the_seed_in_one_stage_then_annotates(tmp_path: Any) -> None:
    script = [answer("single", cuda(STAGE_B, "Here is the seed with the all-gather done by LSA stores."),
                     match=SINGLE),
              answer("annotate", cuda(ANNOTATED))]
    with Store(tmp_path / "single.db") as store, FakeOpenAIServer(script) as srv:
        fp = FastPath(SEED, WORKLOAD, client_for(srv), None, store,
                      FastPathConfig(gpu=False, max_attempts=2, single_stage=True),
                      builder=RecordingBuilder(), seed_name="seed_nccl.cu")
        res = fp.run()
        prompts = user_messages(srv)
        purposes = [c["purpose"] for c in store.llm_calls(fp.run_id)]
    assert res.status == "passed_l1", res.message
    assert list(res.outcomes) == ["single", "annotate"] and res.code == ANNOTATED
    assert purposes == ["fastpath.single_stage", "fastpath.annotate"]
    # The one prompt carries the seed itself (host all-gather and all) and both stages' instructions.
    assert SINGLE in prompts[0] and "cuco_devcomm_create" in prompts[0] and "ncclGetLsaPointer" in prompts[0]
    assert "ncclAllGather" in prompts[0] and "Stage A output" in prompts[0]


def test_single_stage_answer_that_keeps_host_collectives_fails_l0_and_is_retried() -> None:
    script = [answer("single-kept-host", cuda(STAGE_A, "Added the devComm; the all-gather stays for now."),
                     match=SINGLE),
              answer("judge", "The host ncclAllGather is still there; replace it with LSA stores.", match=JUDGE),
              answer("single", cuda(STAGE_B), match=SINGLE)]
    with FakeOpenAIServer(script) as srv:
        fp = FastPath(SEED, WORKLOAD, client_for(srv), None, None,
                      FastPathConfig(gpu=False, max_attempts=2, single_stage=True), builder=RecordingBuilder())
        out = fp.single_stage()
        prompts = user_messages(srv)
    first, second = out.attempts
    assert first.verdict == "fail" and first.level == "L0" and "host NCCL communication is still called" in \
        first.reason
    assert second.verdict == "pass_l1" and out.status == "passed_l1"
    assert "Previous attempts that failed" in prompts[2] and "replace it with LSA stores" in prompts[2]
