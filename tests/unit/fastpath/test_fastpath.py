"""The fast path against the fake OpenAI-compatible server (real HTTP on 127.0.0.1, the real `openai` client
through OpenAICompatibleClient) serving SCRIPTED answers labelled as fixtures (tests/data/fastpath/*.cu).

Builds: one test runs the real nvcc on code that does not compile (it fails in nvcc's front end, ~5 s); the
others use `RecordingBuilder`, a test double that compiles nothing and says so. L2 on this CPU machine goes
through `ScriptedEvaluator`, a typed fake whose verdicts are scripted (badge "simulated"): it never measured
anything. The real L2 checks are tests/gpu/test_fastpath_gpu.py.
"""
from __future__ import annotations

import argparse
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cuco_kit.commands import fastpath as fastpath_command
from cuco_kit.errors import CucoError
from cuco_kit.evaluate.api import EvalRequest, EvalResult
from cuco_kit.evaluate.build import BuildResult
from cuco_kit.fastpath import NO_GPU, FastPath, FastPathConfig, sanitize, steps
from cuco_kit.fastpath.sanitizer import parse_sanitizer
from cuco_kit.llm import OpenAICompatibleClient
from cuco_kit.llm.fake_server import FakeOpenAIServer, answer, rate_limit, server_error, slow, truncated
from cuco_kit.prompts import nccl_api
from cuco_kit.source import markers, static_check
from cuco_kit.store import Store

ROOT = Path(__file__).resolve().parents[3]
DATA = ROOT / "tests" / "data" / "fastpath"
FIXTURES = ROOT / "cuco_kit" / "llm" / "fixtures"  # the recorded answers the notebooks use ship with the kit
WORKLOAD = ROOT / "sample_kernels" / "gemm_allgather"
SEED = (WORKLOAD / "seed_nccl.cu").read_text()
STAGE_A = (FIXTURES / "gemm_stage_a.cu").read_text()
STAGE_B = (FIXTURES / "gemm_stage_b_lsa.cu").read_text()
DROP_PEERS = (DATA / "gemm_stage_b_drop_peers.cu").read_text()
NOCOMPILE = (DATA / "gemm_stage_b_nocompile.cu").read_text()
GIN = (DATA / "gemm_stage_b_gin.cu").read_text()
ANNOTATED = (FIXTURES / "gemm_annotated.cu").read_text()
EDIT_OUTSIDE = (DATA / "gemm_annotated_edit_outside.cu").read_text()
JUDGE = "Diagnose the failure"  # a phrase only the judge prompt's user message carries


def cuda(code: str, note: str = "Rewritten as asked.") -> str:
    return f"{note}\n\n```cuda\n{code}```\n"


@dataclass
class RecordingBuilder:
    """Test double for L1: compiles nothing; fails code containing one of `fail_on` with a fake log."""

    fail_on: tuple[str, ...] = ()
    calls: list[tuple[str, str]] = field(default_factory=list)

    def __call__(self, code: str, backend: str, cfg: object = None, cache_dir: object = None) -> BuildResult:
        self.calls.append((backend, code))
        bad = next((s for s in self.fail_on if s in code), None)
        if bad:
            return BuildResult(False, None, f"TEST DOUBLE (nothing compiled): error: identifier \"{bad}\" is "
                               "undefined", 0.0, False, "fake")
        return BuildResult(True, Path("/nonexistent/fake.so"), "TEST DOUBLE: nothing compiled", 0.0, False, "fake")


@dataclass
class ScriptedEvaluator:
    """A typed fake Evaluator with SCRIPTED verdicts (badge simulated): code containing `fail_marker` fails at
    world sizes >= `fail_from_world` with `fail_log` in its rank log. It measures nothing."""

    fail_marker: str | None = None
    fail_from_world: int = 2
    fail_log: str = "SIMULATED: rank 1 y mismatch, max_rel_err 1.0"
    sanitizer_log: str | None = None
    requests: list[EvalRequest] = field(default_factory=list)
    sanitized: list[EvalRequest] = field(default_factory=list)

    def evaluate(self, request: EvalRequest, progress: object = None) -> EvalResult:
        self.requests.append(request)
        prov = {"world_size": request.world_size, "note": "SIMULATED: scripted verdict, nothing ran"}
        if self.fail_marker and self.fail_marker in request.candidate_code and \
                request.world_size >= self.fail_from_world:
            return EvalResult("L2", "fail", "SIMULATED: verification failed", badge="simulated",
                              logs={"rank1": self.fail_log}, provenance=prov)
        return EvalResult("L2", "pass", "SIMULATED: scripted pass", badge="simulated", provenance=prov)


@dataclass
class SanitizingEvaluator(ScriptedEvaluator):
    def sanitize(self, request: EvalRequest, so_path: str | Path | None = None, *, timeout_s: float = 300.0) -> str:
        self.sanitized.append(request)
        return self.sanitizer_log or ""


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store(tmp_path / "fp.db")
    yield s
    s.close()


def client_for(srv: FakeOpenAIServer, **cfg: object) -> OpenAICompatibleClient:
    opts = {"max_retries": 2, "backoff_base_s": 0.0, "timeout_s": 10.0}
    opts.update(cfg)
    return OpenAICompatibleClient(srv.config(**opts), sleep=lambda s: None)


def make_fp(srv: FakeOpenAIServer, store: Store | None = None, *, evaluator: object = None,
            builder: RecordingBuilder | None = None, client: object = None, **cfg: object) -> FastPath:
    config = FastPathConfig(**{"gpu": False, "max_attempts": 2, **cfg})
    return FastPath(SEED, WORKLOAD, client or client_for(srv), evaluator, store, config,
                    builder=builder or RecordingBuilder(), seed_name="seed_nccl.cu")


def user_messages(srv: FakeOpenAIServer) -> list[str]:
    return [r.body["messages"][-1]["content"] for r in srv.chat_requests()]


# ---- the whole path ---------------------------------------------------------------------------------------

def test_correct_rewrites_reach_an_annotated_candidate_and_say_l2_was_not_evaluated(store: Store) -> None:
    script = [answer("stage-a", cuda(STAGE_A)), answer("stage-b", cuda(STAGE_B)), answer("annotate", cuda(ANNOTATED))]
    builder = RecordingBuilder()
    with FakeOpenAIServer(script) as srv:
        fp = make_fp(srv, store, builder=builder)
        rep = fp.analyze()
        assert [c.call for c in rep.collectives] == ["ncclAllGather"]
        res = fp.run()
    assert res.status == "passed_l1" and res.ok
    assert NO_GPU in res.message
    assert [o.status for o in res.outcomes.values()] == ["passed_l1", "passed_l1", "passed"]
    assert res.code == ANNOTATED and markers.strip_markers(res.code) == STAGE_B
    # This Stage A answer names `// cuco: backends=nccl`; Stage B builds for both backends.
    assert [b for b, c in builder.calls] == ["nccl", "nccl", "symm"]
    a = res.outcomes["A"].attempts[0]
    assert a.fixture and a.llm_model == "fixture-stage-a" and "+#include \"cuco_lsa.h\"" in a.diff
    calls = store.llm_calls(fp.run_id)
    assert [c["purpose"] for c in calls] == ["fastpath.stage_a", "fastpath.stage_b", "fastpath.annotate"]
    assert all(c["ok"] for c in calls) and all(c["model"].startswith("fixture-") for c in calls)
    props = store.proposals(fp.run_id)
    assert [p["status"] for p in props] == ["approved"] * 3 and props[1]["code"] == STAGE_B
    evals = store.evaluations(fp.run_id)
    assert {e["verdict"] for e in evals} == {"unavailable", "pass"}  # L1-only stages, then the annotation
    # The prompts carry the analysis, the header-derived API context and the cookbook.
    first = user_messages(srv)[0]
    assert "ncclAllGather" in first and "ncclDevCommCreate(ncclComm_t" in first and "Cookbook" in first


@pytest.mark.skipif(shutil.which("nvcc") is None and not Path("/usr/local/bin/nvcc").exists(),
                    reason="needs nvcc")
def test_code_that_does_not_compile_fails_at_l1_with_the_real_compiler_log(store: Store, tmp_path: Path) -> None:
    script = [answer("stage-b-nocompile", cuda(NOCOMPILE)),
              answer("judge", "The barrier type is misspelled: use ncclLsaBarrierSession.", match=JUDGE)]
    with FakeOpenAIServer(script) as srv:
        fp = FastPath(SEED, WORKLOAD, client_for(srv), None, store,
                      FastPathConfig(gpu=False, max_attempts=1, cache_dir=str(tmp_path / "builds")))
        fp.current_code = STAGE_A
        out = fp.stage_b()
    assert out.status == "failed"
    (att,) = out.attempts
    assert att.verdict == "fail" and att.level == "L1" and att.builds == {"nccl": False}
    assert "ncclLsaBarierSession" in att.build_log and "error" in att.build_log  # nvcc's own words
    assert att.diagnosis.startswith("The barrier type is misspelled")
    assert [c["purpose"] for c in store.llm_calls(fp.run_id)] == ["fastpath.stage_b", "fastpath.judge"]
    (ev,) = store.evaluations(fp.run_id)
    assert ev["level_reached"] == "L1" and ev["verdict"] == "fail" and "ncclLsaBarierSession" in ev["logs"]["build"]


def test_a_failed_build_is_retried_with_the_diagnosis_and_log_in_the_prompt(store: Store) -> None:
    script = [answer("stage-b-nocompile", cuda(NOCOMPILE)),
              answer("judge", "Misspelled barrier type on the session line.", match=JUDGE),
              answer("stage-b", cuda(STAGE_B))]
    with FakeOpenAIServer(script) as srv:
        fp = make_fp(srv, store, builder=RecordingBuilder(fail_on=("ncclLsaBarierSession",)))
        fp.current_code = STAGE_A
        out = fp.stage_b()
        prompts = user_messages(srv)
    assert out.status == "passed_l1" and [a.verdict for a in out.attempts] == ["fail", "pass_l1"]
    retry = prompts[2]
    assert "Previous attempts that failed" in retry and "Misspelled barrier type" in retry
    assert 'identifier "ncclLsaBarierSession" is undefined' in retry
    assert len(store.llm_calls(fp.run_id)) == 3


def test_truncated_answer_is_an_error_attempt_and_the_next_prompt_asks_for_less(store: Store) -> None:
    script = [truncated("cut", cuda(STAGE_B)[:400]), answer("stage-b", cuda(STAGE_B))]
    builder = RecordingBuilder()
    with FakeOpenAIServer(script) as srv:
        fp = make_fp(srv, store, builder=builder)
        fp.current_code = STAGE_A
        out = fp.stage_b()
        prompts = user_messages(srv)
    first, second = out.attempts
    assert first.verdict == "error" and first.level == "LLM" and "truncated" in first.reason
    assert first.code is None and first.proposal_text.startswith("Rewritten")
    assert second.verdict == "pass_l1" and len(builder.calls) == 2  # nothing was built for the cut answer
    assert "cut off" in prompts[1]
    calls = store.llm_calls(fp.run_id)
    assert [c["ok"] for c in calls] == [False, True] and calls[0]["error"].startswith("truncated")
    assert calls[0]["completion_tokens"] > 0  # a truncated answer was paid for


@pytest.mark.parametrize("hiccup", [rate_limit("busy", retry_after_s=0.01), server_error("boom", status=503),
                                    slow("late", "too late", delay_s=3.0)])
def test_transient_server_failures_are_retried_inside_one_ledgered_call(store: Store, hiccup: object) -> None:
    with FakeOpenAIServer([hiccup, answer("stage-b", cuda(STAGE_B))]) as srv:
        fp = make_fp(srv, store, client=client_for(srv, timeout_s=0.5))
        fp.current_code = STAGE_A
        out = fp.stage_b()
        n_requests = len(srv.chat_requests())
    assert out.status == "passed_l1" and len(out.attempts) == 1
    assert n_requests == 2  # the failure, then the retry
    (call,) = store.llm_calls(fp.run_id)
    assert call["ok"] and call["purpose"] == "fastpath.stage_b"


def test_a_server_that_keeps_failing_stops_the_stage_with_a_clear_message(store: Store) -> None:
    with FakeOpenAIServer([server_error("down", times=0)]) as srv:
        fp = make_fp(srv, store)
        res = fp.run()
        n_requests = len(srv.chat_requests())
    assert res.status == "llm_error" and not res.ok
    assert "Stage A" in res.message and "failed 3 time(s)" in res.message and "OPENAI_BASE_URL" in res.message
    assert n_requests == 3 and "B" not in res.outcomes  # nothing after the failed stage
    (call,) = store.llm_calls(fp.run_id)
    assert not call["ok"] and "LLMUnavailable" in call["error"]


# ---- annotate -----------------------------------------------------------------------------------------------

def test_an_annotation_that_edits_outside_the_blocks_is_rejected_and_the_fallback_is_used(store: Store) -> None:
    with FakeOpenAIServer([answer("annotate-bad", cuda(EDIT_OUTSIDE))]) as srv:
        fp = make_fp(srv, store)
        fp.current_code = STAGE_B
        out = fp.annotate()
    llm, fb = out.attempts
    assert llm.verdict == "fail" and "does not give back the input byte for byte" in llm.reason
    assert "cublas == nullptr" in llm.reason  # names the line that changed
    assert fb.source == "fallback" and fb.verdict == "pass" and out.status == "fallback" and out.ok
    assert markers.strip_markers(out.code) == STAGE_B
    assert [b.name for b in markers.blocks(out.code)] == ["knobs", "kernel_push_shard", "step"]
    assert static_check.check_candidate(out.code).ok
    assert [c["purpose"] for c in store.llm_calls(fp.run_id)] == ["fastpath.annotate"]


def test_fallback_annotator_only_inserts_marker_lines() -> None:
    annotated, notes = steps.fallback_annotate(STAGE_B)
    assert notes == [] and annotated == ANNOTATED
    added = [ln for ln in annotated.split("\n") if ln not in STAGE_B.split("\n")]
    assert all("EVOLVE-BLOCK" in ln for ln in added) and len(added) == 6
    # scattered knob lines cannot form one knob block: said, not silently half-done
    scattered = STAGE_B.replace("constexpr int kThreads = 512;  // knob: {128, 256, 512, 1024}\n", "") + \
        "constexpr int kThreads = 512;  // knob: {128, 256, 512, 1024}\n"
    _, notes = steps.fallback_annotate(scattered)
    assert any("separate groups" in n for n in notes)


# ---- L2 through a typed fake evaluator ------------------------------------------------------------------------

def test_dropping_peer_stores_passes_l1_on_cpu_but_is_caught_by_l2_at_two_ranks(store: Store) -> None:
    script = [answer("drop-peers", cuda(DROP_PEERS)),
              answer("judge", "Only the local xg is written; store to every peer.", match=JUDGE),
              answer("stage-b", cuda(STAGE_B))]
    ev = ScriptedEvaluator(fail_marker="only this rank's own xg")
    with FakeOpenAIServer(script) as srv:
        fp = make_fp(srv, store, evaluator=ev, gpu=True)
        fp.current_code = STAGE_A
        out = fp.stage_b()
        prompts = user_messages(srv)
    bad, good = out.attempts
    assert bad.verdict == "fail" and bad.level == "L2" and "2 rank(s)" in bad.reason
    assert [r.verdict for r in bad.eval_result] == ["pass", "fail"]  # world 1 cannot see it
    assert good.verdict == "pass" and out.status == "passed"
    assert [(r.world_size, r.backend) for r in ev.requests] == [(1, "symm"), (2, "symm")] * 2
    assert ev.requests[0].params == {"M": 1024, "N": 1024, "K": 1024}  # the small preset
    assert "rank1" in prompts[2] and "store to every peer" in prompts[2]
    assert {e["badge"] for e in store.evaluations(fp.run_id)} == {"simulated"}


def test_the_same_drop_peers_rewrite_without_a_gpu_stops_after_l1() -> None:
    with FakeOpenAIServer([answer("drop-peers", cuda(DROP_PEERS))]) as srv:
        fp = make_fp(srv, evaluator=ScriptedEvaluator(fail_marker="only this rank's own xg"), gpu=False)
        fp.current_code = STAGE_A
        out = fp.stage_b()
    assert out.status == "passed_l1" and out.attempts[0].eval_result is None
    assert NO_GPU in out.attempts[0].reason


def test_illegal_memory_access_triggers_the_sanitizer_hook() -> None:
    san = ("========= Invalid __global__ write of size 16 bytes\n"
           "=========     at push_shard(ncclDevComm, ncclWindow_vidmem *, const uint4 *, unsigned long)+0x3f0 "
           "in /tmp/candidate.cu:64\n=========     by thread (3,0,0) in block (0,0,0)\n")
    ev = SanitizingEvaluator(fail_marker="only this rank's own xg", fail_from_world=1,
                             fail_log="rank 0: CUDA error 700: an illegal memory access was encountered",
                             sanitizer_log=san)
    script = [answer("drop-peers", cuda(DROP_PEERS)), answer("judge", "Out-of-bounds store.", match=JUDGE)]
    with FakeOpenAIServer(script) as srv:
        fp = make_fp(srv, evaluator=ev, gpu=True, max_attempts=1)
        fp.current_code = STAGE_A
        out = fp.stage_b()
        judge_prompt = user_messages(srv)[1]
    (att,) = out.attempts
    assert att.sanitizer is not None and att.sanitizer.kernel == "push_shard"
    assert att.sanitizer.location == "/tmp/candidate.cu:64" and "push_shard" in att.reason
    assert [r.world_size for r in ev.sanitized] == [1] and "compute-sanitizer" in judge_prompt


def test_sanitize_without_a_hook_says_unavailable() -> None:
    rep = sanitize(ScriptedEvaluator(), EvalRequest("x", "w", world_size=2))
    assert not rep.available and "sanitizer unavailable" in rep.message


def test_parse_sanitizer_reads_both_frame_formats() -> None:
    old = "========= Invalid __global__ read of size 4 bytes\n=========     at 0x70 in /a/k.cu:12:gather(int *)\n"
    new = "========= Invalid __global__ read of size 4 bytes\n=========     at gather(int *)+0x70 in /a/k.cu:12\n"
    assert parse_sanitizer(old) == ("gather", "/a/k.cu:12")
    assert parse_sanitizer(new) == ("gather", "/a/k.cu:12")
    assert parse_sanitizer("no error here") == (None, None)


# ---- GIN, manual mode, L0 ------------------------------------------------------------------------------------

def test_gin_is_built_for_nccl_only_and_reported_unavailable_not_failed() -> None:
    builder = RecordingBuilder()
    ev = ScriptedEvaluator()
    with FakeOpenAIServer([answer("stage-b-gin", cuda(GIN))]) as srv:
        fp = make_fp(srv, builder=builder, evaluator=ev, gpu=True, backend="gin")
        fp.current_code = STAGE_A
        out = fp.stage_b()
        prompt = user_messages(srv)[0]
    assert out.status == "compile_only" and out.ok
    assert "unavailable to run" in out.attempts[0].reason and "not a failure" in out.attempts[0].reason
    assert [b for b, _ in builder.calls] == ["nccl"] and ev.requests == []
    assert "ncclGin_BackendMask" in prompt and "waitSignal" in prompt  # GIN API context from the headers


def test_manual_mode_pauses_and_continues_on_reject_edit_and_approve(store: Store) -> None:
    edited_code = STAGE_B.replace("kBlocks = 32;", "kBlocks = 16;")
    script = [answer("drop-peers", cuda(DROP_PEERS)), answer("stage-b", cuda(STAGE_B)),
              answer("annotate", cuda(steps.fallback_annotate(edited_code)[0]))]
    with FakeOpenAIServer(script) as srv:
        fp = make_fp(srv, store, manual=True, max_attempts=3)
        fp.current_code = STAGE_A
        snap = fp.stage_b()
        assert snap.status == "pending" and fp.pending is not None and fp.pending.code == DROP_PEERS
        with pytest.raises(CucoError):
            fp.stage_b()  # one decision at a time
        snap = fp.reject("stores only to its own rank")
        assert snap.status == "pending" and fp.pending.code == STAGE_B  # the next proposal
        out = fp.edit(edited_code)
        assert out.status == "passed_l1" and fp.pending is None
        snap = fp.annotate()
        assert snap.status == "pending" and snap.stage == "annotate"
        done = fp.approve()
        prompts = user_messages(srv)
    rej, edited = out.attempts
    assert rej.verdict == "rejected" and "stores only to its own rank" in prompts[1]
    assert edited.source == "human" and "kBlocks = 16;" in edited.code
    assert done.status == "passed" and markers.strip_markers(done.code) == edited_code
    props = store.proposals(fp.run_id)
    assert [p["status"] for p in props] == ["rejected", "edited", "approved"]
    assert props[1]["original_code"] == STAGE_B and "kBlocks = 16;" in props[1]["code"]
    assert store.program(edited.program_id)["source"] == "human"
    with pytest.raises(CucoError):
        fp.approve()  # nothing pending


def test_l0_rejects_forbidden_host_calls_and_stage_contract_breaks() -> None:
    sneaky = STAGE_B.replace("  if (ctx->cublas == nullptr) return CUCO_ERR_PARAM;\n",
                             "  if (getenv(\"X\") == nullptr) return CUCO_ERR_PARAM;\n")
    rep = steps.check_stage_output(sneaky, "B", "lsa")
    assert not rep.ok and any("getenv" in r and "in the file" in r for r in rep.reasons)
    kept_host = steps.check_stage_output(STAGE_A, "B", "lsa")
    assert not kept_host.ok and any("ncclAllGather" in r for r in kept_host.reasons)
    no_devcomm = steps.check_stage_output(SEED, "A", "lsa")
    assert not no_devcomm.ok and any("cuco_devcomm_create" in r for r in no_devcomm.reasons)
    assert steps.check_stage_output(STAGE_B, "B", "lsa").ok


def test_an_answer_without_code_is_an_error_attempt_nothing_is_built() -> None:
    builder = RecordingBuilder()
    with FakeOpenAIServer([answer("prose", "I would use LSA stores."), answer("stage-b", cuda(STAGE_B))]) as srv:
        fp = make_fp(srv, builder=builder)
        fp.current_code = STAGE_A
        out = fp.stage_b()
    assert [a.verdict for a in out.attempts] == ["error", "pass_l1"]
    assert "no ```cuda code block" in out.attempts[0].reason and len(builder.calls) == 2


# ---- CLI ----------------------------------------------------------------------------------------------------

def _args(**kw: object) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    fastpath_command.add_arguments(parser)  # the command's own defaults, LLM flags included
    args = parser.parse_args([str(WORKLOAD / "seed_nccl.cu"), "--max-attempts", "1"])
    for k, v in kw.items():
        setattr(args, k, v)
    return args


def test_cli_without_a_reachable_llm_fails_with_one_line_saying_how_to_point_it(monkeypatch: pytest.MonkeyPatch) \
        -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("OPENAI_BASE_URL", f"http://127.0.0.1:{port}/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "x")
    with pytest.raises(CucoError) as exc:
        fastpath_command.run(_args())
    msg = str(exc.value)
    assert "\n" not in msg and "no LLM server reachable" in msg
    assert "OPENAI_BASE_URL" in msg and "OPENAI_API_KEY" in msg and "Ollama" in msg


def test_cli_reports_the_llm_error_of_a_failing_server(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    with FakeOpenAIServer([server_error("down", times=0)]) as srv:
        for k, v in srv.env().items():
            monkeypatch.setenv(k, v)
        monkeypatch.setattr(fastpath_command, "OpenAICompatibleClient",
                            lambda cfg: OpenAICompatibleClient(cfg, sleep=lambda s: None))
        rc = fastpath_command.run(_args(db=str(tmp_path / "cli.db"), json=False))
    assert rc == 1
    out, err = capsys.readouterr()
    assert "llm_error" in out and "OPENAI_BASE_URL" in err
    with Store(tmp_path / "cli.db") as st:
        assert [c["purpose"] for c in st.llm_calls()] == ["fastpath.stage_a"]


# ---- NCCL API excerpts ----------------------------------------------------------------------------------------

def test_api_excerpts_are_quoted_from_the_installed_headers() -> None:
    try:
        inc = nccl_api.nccl_include_dir()
    except CucoError:
        pytest.skip("nvidia-nccl headers are not installed")
    assert nccl_api.missing_declarations("lsa") == [] and nccl_api.missing_declarations("gin") == []
    lsa = nccl_api.device_api_excerpts("lsa", use_disk_cache=False)
    header_line = next(ln for ln in (inc / "nccl_device" / "core.h").read_text().splitlines()
                       if "ncclDevCommCreate(" in ln)
    assert header_line.strip() in lsa  # quoted verbatim
    assert "struct ncclDevComm {" in lsa and "ncclLsaBarrierSession" in lsa and "ncclGin_BackendMask" not in lsa
    assert nccl_api.device_api_excerpts("lsa", use_disk_cache=False) is lsa  # cached per header version
    decls = nccl_api.extract_declarations(inc, ["ncclGetLsaPointer"])
    assert [d.header for d in decls] == ["nccl_device/core.h"] and decls[0].kind == "function"
