"""The fast path's fixtures through the REAL nvcc (the unit tier uses a build test double): the scripted Stage A,
Stage B (LSA) and GIN answers build for the backends the fast path asks for, and the whole path run headless
through the fake OpenAI-compatible server reaches an annotated candidate with L1 real and L2 honestly absent."""
from __future__ import annotations

from pathlib import Path

import pytest

from cuco_kit.fastpath import NO_GPU, FastPath, FastPathConfig
from cuco_kit.llm import OpenAICompatibleClient
from cuco_kit.llm.fake_server import FakeOpenAIServer, answer
from cuco_kit.source import markers

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "fastpath"
FIXTURES = ROOT / "cuco_kit" / "llm" / "fixtures"  # the recorded answers the notebooks use ship with the kit
WORKLOAD = ROOT / "sample_kernels" / "gemm_allgather"


def cuda(code: str) -> str:
    return f"```cuda\n{code}```\n"


def test_fastpath_end_to_end_with_real_builds(tmp_path: Path) -> None:
    a, b, ann = ((FIXTURES / n).read_text() for n in ("gemm_stage_a.cu", "gemm_stage_b_lsa.cu", "gemm_annotated.cu"))
    script = [answer("stage-a", cuda(a)), answer("stage-b", cuda(b)), answer("annotate", cuda(ann))]
    with FakeOpenAIServer(script) as srv:
        client = OpenAICompatibleClient(srv.config(max_retries=0), sleep=lambda s: None)
        fp = FastPath((WORKLOAD / "seed_nccl.cu").read_text(), WORKLOAD, client, None, None,
                      FastPathConfig(gpu=False, max_attempts=1, cache_dir=str(tmp_path)))
        res = fp.run()
    assert res.status == "passed_l1", res.message
    assert NO_GPU in res.message or "L2 not evaluated" in res.message
    assert res.outcomes["A"].attempts[0].builds == {"nccl": True}
    assert res.outcomes["B"].attempts[0].builds == {"nccl": True, "symm": True}
    assert all(Path(p).is_file() for p in res.outcomes["B"].attempts[0].so_paths.values())
    assert markers.strip_markers(res.code) == b


@pytest.mark.parametrize("name,backend", [("gemm_stage_b_gin.cu", "nccl"),
                                          ("gemm_stage_b_drop_peers.cu", "symm")])
def test_fixture_builds(tmp_path: Path, name: str, backend: str) -> None:
    from cuco_kit.evaluate.build import build, for_workload

    r = build((DATA / name).read_text(), backend, for_workload(None, WORKLOAD), cache_dir=tmp_path)
    assert r.ok, r.log[-3000:]
