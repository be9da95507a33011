"""The fast path on a real GPU (H200): scripted answers for the GEMM + AllGather host seed, L2 through the
GpuEvaluator at 1 and 2 ranks under `symm` (+ lsa_compat.h). A correct Stage B passes at 2 ranks; a rewrite
that drops the stores to peers passes at 1 rank and is caught at 2."""
from __future__ import annotations

from pathlib import Path

import pytest

from cuco_kit.evaluate.device import gpu_present
from cuco_kit.fastpath import FastPath, FastPathConfig
from cuco_kit.llm import OpenAICompatibleClient
from cuco_kit.llm.fake_server import FakeOpenAIServer, answer

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "fastpath"
FIXTURES = ROOT / "cuco_kit" / "llm" / "fixtures"  # the recorded answers the notebooks use ship with the kit
WORKLOAD = ROOT / "sample_kernels" / "gemm_allgather"

pytestmark = pytest.mark.skipif(not gpu_present(), reason="needs an NVIDIA GPU (nvidia-smi)")


def cuda(code: str) -> str:
    return f"```cuda\n{code}```\n"


@pytest.mark.timeout(300)
def test_fastpath_reaches_l2_at_two_ranks_and_catches_dropped_peer_stores(evaluator) -> None:
    a, b = ((FIXTURES / n).read_text() for n in ("gemm_stage_a.cu", "gemm_stage_b_lsa.cu"))
    drop = (DATA / "gemm_stage_b_drop_peers.cu").read_text()
    script = [answer("stage-a", cuda(a)), answer("drop-peers", cuda(drop)),
              answer("judge", "Stores go only to the local xg.", match="Diagnose the failure"),
              answer("stage-b", cuda(b))]
    with FakeOpenAIServer(script) as srv:
        client = OpenAICompatibleClient(srv.config(max_retries=0), sleep=lambda s: None)
        fp = FastPath((WORKLOAD / "seed_nccl.cu").read_text(), WORKLOAD, client, evaluator, None,
                      FastPathConfig(gpu=True, max_attempts=2, annotate_attempts=0))
        res = fp.run()
    bad, good = res.outcomes["B"].attempts
    assert bad.verdict == "fail" and bad.level == "L2", bad.reason
    assert [r.provenance.get("world_size") for r in bad.eval_result] == [1, 2]
    assert bad.eval_result[0].verdict == "pass" and bad.eval_result[1].verdict == "fail"
    assert good.verdict == "pass", good.reason
    assert [(r.provenance.get("world_size"), r.verdict) for r in good.eval_result] == [(1, "pass"), (2, "pass")]
    assert res.status == "passed" and res.outcomes["annotate"].status == "fallback"


@pytest.mark.timeout(420)
def test_sanitizer_names_the_kernel_behind_an_illegal_memory_access(evaluator, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from cuco_kit.evaluate.api import EvalRequest
    from cuco_kit.fastpath.sanitizer import has_illegal_access, sanitize

    # The fault is on purpose: its ranks (world 1, nccl) stay out of any MPS daemon, as they are when none runs, so
    # it stays in their own context and cannot reach the clients of a daemon the gpu tier shares between tests.
    (tmp_path / "no-mps").mkdir()
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path / "no-mps"))

    code = (ROOT / "tests" / "data" / "adversarial" / "out_of_bounds.cu").read_text()
    req = EvalRequest(candidate_code=code, workload_dir=str(ROOT / "sample_kernels" / "allgather"), world_size=2,
                      backend="nccl", trials=1, iters=2, measure_seed=False)
    res = evaluator.evaluate(EvalRequest(**{**req.__dict__, "world_size": 1}))
    assert res.verdict == "fail" and has_illegal_access([res.reason, res.logs]), res.reason
    report = sanitize(evaluator, req, timeout_s=240)  # the fast path's call: world 1 whatever the request said
    assert report.available, report.message
    assert report.kernel is not None and "allgather_push" in report.kernel, report.log[-3000:]
