"""`cuco fastpath --manual`: decisions read from the terminal; a rejection's note reaches the next prompt, an
edit is evaluated as a human attempt, and an answer's control characters never reach the terminal."""
from __future__ import annotations

import io
from pathlib import Path

import pytest

from cuco_kit.commands.manual_review import run_manual
from cuco_kit.errors import BadInput
from cuco_kit.evaluate.build import BuildResult
from cuco_kit.fastpath import FastPath, FastPathConfig
from cuco_kit.llm import OpenAICompatibleClient, fixtures
from cuco_kit.llm.fake_server import FakeOpenAIServer, answer

ROOT = Path(__file__).resolve().parents[3]
WORKLOAD = ROOT / "sample_kernels" / "gemm_allgather"
STAGE_A, STAGE_B, ANNOTATED = (fixtures.load(n) for n in ("gemm_stage_a.cu", "gemm_stage_b_lsa.cu",
                                                            "gemm_annotated.cu"))


def no_build(code, backend, cfg=None, cache_dir=None):
    return BuildResult(True, Path("/nonexistent/fake.so"), "TEST DOUBLE: nothing compiled", 0.0, False, "fake")


def cuda(code: str) -> str:
    return f"FIXTURE \x1b[2J answer\n```cuda\n{code}```\n"


def test_reject_with_note_then_edit_then_approve(tmp_path):
    edited = tmp_path / "mine.cu"
    edited.write_text(STAGE_B.replace("kBlocks = 32;", "kBlocks = 16;"))
    script = [answer("a-bad", cuda(STAGE_A.replace("\n", "\n// \x1b]0;title\x07\n", 1))), answer("a", cuda(STAGE_A)),
              answer("b", cuda(STAGE_B)), answer("annotate", cuda(ANNOTATED))]
    with FakeOpenAIServer(script) as srv:
        client = OpenAICompatibleClient(srv.config(max_retries=0), sleep=lambda s: None)
        fp = FastPath((WORKLOAD / "seed_nccl.cu").read_text(), WORKLOAD,
                      client, None, None, FastPathConfig(gpu=False, manual=True, max_attempts=2), builder=no_build)
        out = io.StringIO()
        res = run_manual(fp, io.StringIO(f"r keep the seed's stream\na\ne {edited}\na\n"), out)
        prompts = [r.body["messages"][-1]["content"] for r in srv.chat_requests()]
    assert res.ok, res.message
    assert "keep the seed's stream" in prompts[1]
    assert [a.verdict for a in res.outcomes["A"].attempts] == ["rejected", "pass_l1"]
    assert res.outcomes["B"].attempts[0].source == "human"
    shown = out.getvalue()
    assert "stage A, attempt 1" in shown and "\x1b" not in shown and "\x07" not in shown


def test_end_of_input_is_one_clear_error():
    with FakeOpenAIServer([answer("a", cuda(STAGE_A))]) as srv:
        client = OpenAICompatibleClient(srv.config(max_retries=0), sleep=lambda s: None)
        fp = FastPath((WORKLOAD / "seed_nccl.cu").read_text(), WORKLOAD, client, None, None,
                      FastPathConfig(gpu=False, manual=True, max_attempts=1), builder=no_build)
        with pytest.raises(BadInput, match="no decision"):
            run_manual(fp, io.StringIO(""), io.StringIO())
