"""GIN on one GPU, the CPU side: the MoE GIN variant is found by its file name and classified as GIN, the three
wrong GIN candidates say what L2 must answer, gin_compat.h covers NCCL's GIN context API (or says what it leaves
out), and the fast path's GIN branch goes on to L2 under symm when its output builds for symm (scripted answers,
a builder that compiles nothing and a scripted evaluator: the real runs are tests/gpu/test_gin_gpu.py)."""
from __future__ import annotations

import json
import re
from pathlib import Path

from cuco_kit.evaluate.build import BuildConfig, supported_backends
from cuco_kit.fastpath import FastPath, FastPathConfig
from cuco_kit.fastpath.pipeline import gin_runnable
from cuco_kit.llm import OpenAICompatibleClient
from cuco_kit.llm.fake_server import FakeOpenAIServer, answer
from cuco_kit.search.api_type import api_type
from cuco_kit.workload import GIN_BASELINE_FILE, load_workload, sample_workloads
from tests.unit.fastpath.test_fastpath import RecordingBuilder, ScriptedEvaluator, cuda

ROOT = Path(__file__).resolve().parents[3]
MOE = ROOT / "sample_kernels" / "moe_dispatch_combine"
ADV = ROOT / "tests" / "data" / "adversarial"
ENTRIES = {k: v for k, v in json.loads((ADV / "EXPECTED.json").read_text()).items() if not k.startswith("_")}
GIN_WRONG = {name: e for name, e in ENTRIES.items() if e.get("gin")}
GEMM = ROOT / "sample_kernels" / "gemm_allgather"
GIN_BOTH = (ROOT / "tests" / "data" / "fastpath" / "gemm_stage_b_gin_both.cu").read_text()
GIN_NCCL_ONLY = (ROOT / "tests" / "data" / "fastpath" / "gemm_stage_b_gin.cu").read_text()
STAGE_A = (ROOT / "cuco_kit" / "llm" / "fixtures" / "gemm_stage_a.cu").read_text()


def test_the_moe_workload_finds_its_gin_variant_by_name_and_the_others_have_none() -> None:
    assert load_workload(MOE).gin_baseline == GIN_BASELINE_FILE == "device_gin.cu"
    for d in sample_workloads(ROOT):
        wl = load_workload(d)
        assert (wl.gin_baseline is not None) == (d / GIN_BASELINE_FILE).is_file(), d.name


def test_api_type_says_gin_for_the_gin_variant_and_its_wrong_twins_and_lsa_for_the_lsa_one() -> None:
    assert api_type((MOE / "device_gin.cu").read_text()) == "gin"
    assert api_type((MOE / "device_lsa.cu").read_text()) == "lsa"
    for name in GIN_WRONG:
        assert api_type((ADV / name).read_text()) == "gin", name


def test_the_gin_variant_builds_for_both_backends() -> None:
    assert supported_backends((MOE / "device_gin.cu").read_text()) == ("nccl", "symm")


def test_the_three_wrong_gin_candidates_say_why_l2_rejects_them() -> None:
    assert {e["gin"] for e in GIN_WRONG.values()} == {"omits signal wait", "wrong signal value", "missing flush"}
    sample = (MOE / "device_gin.cu").read_text()
    for name, e in GIN_WRONG.items():
        assert (e["level"], e["reason_contains"], e["min_world"], e["backends"]) == ("L2", "verification", 2,
                                                                                   ["symm"]), name
        assert e["workload"] == "sample_kernels/moe_dispatch_combine" and e["preset"] == "small", name
        code = (ADV / name).read_text()
        header = code[: code.index("#include")]
        assert "'verification'" in header and "L2 must reject it" in header, name
        assert code.count("BUG") >= 1 and code != sample, name


NCCL_GIN = BuildConfig().nccl_include


def test_gin_compat_has_every_method_of_nccls_gin_context_or_says_it_does_not() -> None:
    """The public methods of NCCL's ncclGin_BackendMask (the installed 2.28 header), against the compat layer's."""
    if NCCL_GIN is None or not (NCCL_GIN / "nccl_device" / "gin.h").is_file():
        import pytest

        pytest.skip("nvidia-nccl wheel headers not installed")
    real = (NCCL_GIN / "nccl_device" / "gin.h").read_text()
    real = real[real.index("struct ncclGin_BackendMask {"):real.index("// internal:")]
    names = set(re.findall(r"NCCL_DEVICE_INLINE\s+[\w:<>\*\s]*?\b(\w+)\s*\(", real)) - {"ncclGin_BackendMask"}
    assert {"put", "putValue", "signal", "flush", "waitSignal", "waitCounter", "readSignal"} <= names, names
    compat = (ROOT / "cuco_kit" / "runtime" / "gin_compat.h").read_text()
    doc = compat[: compat.index("#ifndef CUCO_GIN_COMPAT_H_")]
    not_provided = doc[doc.index("Not provided"):]
    missing = [n for n in sorted(names)
               if not re.search(rf"CUCO_DEVICE_INLINE [^;{{]*\b{n}\(", compat) and n not in not_provided]
    assert not missing, f"gin_compat.h neither serves nor lists {missing}"


def test_gin_output_is_runnable_only_where_it_builds_for_symm() -> None:
    assert gin_runnable(["nccl", "symm"]) and gin_runnable(("symm",)) and not gin_runnable(["nccl"])


def _fastpath(srv: FakeOpenAIServer, builder: RecordingBuilder, ev: ScriptedEvaluator) -> FastPath:
    client = OpenAICompatibleClient(srv.config(max_retries=0, backoff_base_s=0.0, timeout_s=10.0),
                                    sleep=lambda s: None)
    fp = FastPath((GEMM / "seed_nccl.cu").read_text(), GEMM, client, ev, None,
                  FastPathConfig(gpu=True, max_attempts=1, backend="gin"), builder=builder, seed_name="seed_nccl.cu")
    fp.current_code = STAGE_A
    return fp


def test_the_fast_paths_gin_branch_runs_l2_under_symm_when_its_output_builds_for_symm() -> None:
    builder, ev = RecordingBuilder(), ScriptedEvaluator()
    with FakeOpenAIServer([answer("stage-b-gin", cuda(GIN_BOTH))]) as srv:
        out = _fastpath(srv, builder, ev).stage_b()
        prompt = srv.chat_requests()[0].body["messages"][-1]["content"]
    att = out.attempts[0]
    assert out.status == "passed" and att.verdict == "pass", att.reason
    assert sorted(b for b, _ in builder.calls) == ["nccl", "symm"]
    assert [(r.backend, r.world_size) for r in ev.requests] == [("symm", 1), ("symm", 2)]
    assert "under symm" in att.reason
    assert "cuco_devcomm_create_gin" in prompt and "runs under the `nccl` backend only" not in prompt


def test_a_gin_answer_that_builds_for_nccl_only_is_still_compile_only() -> None:
    builder, ev = RecordingBuilder(), ScriptedEvaluator()
    with FakeOpenAIServer([answer("stage-b-gin", cuda(GIN_NCCL_ONLY))]) as srv:
        out = _fastpath(srv, builder, ev).stage_b()
    assert out.status == "compile_only" and "unavailable to run" in out.attempts[0].reason
    assert [b for b, _ in builder.calls] == ["nccl"] and ev.requests == []
