"""GIN on one GPU (symm ranks under MPS, runtime/gin_compat.h): correctness, not network speed.

  - the MoE GIN variant (sample_kernels/moe_dispatch_combine/device_gin.cu) passes L2 at 2 and 4 symm ranks at the
    small preset (and with 5:1 skew and 8-bit dispatch, slow);
  - the three wrong GIN candidates of the adversarial set (EXPECTED.json entries with `gin`: a missing signal wait,
    a wrong signal value, a missing flush) fail L2 at 2 symm ranks with the reason their entry names;
  - the fast path's GIN branch, given scripted answers (Stage A, then a GIN Stage B that builds for both backends),
    reaches L2 under symm at 1 and 2 ranks and passes.
L2 at two ranks and more runs the stress build, where the compat layer pauses around a put's data and signal and
holds puts back (what makes a missing wait or flush show on one GPU). Each wrong candidate is evaluated with more
trials than the default, as the race amplification does for the LSA race classes.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from cuco_kit.evaluate.api import EvalRequest
from cuco_kit.evaluate.device import gpu_present
from cuco_kit.fastpath import FastPath, FastPathConfig
from cuco_kit.llm import OpenAICompatibleClient
from cuco_kit.llm.fake_server import FakeOpenAIServer, answer
from cuco_kit.workload import load_workload

ROOT = Path(__file__).resolve().parents[2]
MOE = ROOT / "sample_kernels" / "moe_dispatch_combine"
GEMM = ROOT / "sample_kernels" / "gemm_allgather"
ADV = ROOT / "tests" / "data" / "adversarial"
FIXTURES = ROOT / "cuco_kit" / "llm" / "fixtures"
DATA = ROOT / "tests" / "data" / "fastpath"
ENTRIES = {k: v for k, v in json.loads((ADV / "EXPECTED.json").read_text()).items() if not k.startswith("_")}
GIN_WRONG = sorted(name for name, e in ENTRIES.items() if e.get("gin"))
L2_TRIALS = 3
WRONG_TRIALS = 8  # fresh-input trials per wrong candidate: each draws another stress seed and late rank

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not gpu_present(), reason="needs an NVIDIA GPU (nvidia-smi)")]


def _params(preset: str) -> dict[str, int]:
    wl = load_workload(MOE)
    return wl.resolve(wl.size_presets[preset])


@pytest.mark.timeout(600)
@pytest.mark.parametrize("preset", ["small", pytest.param("small_skew5_fp8", marks=pytest.mark.slow)])
@pytest.mark.parametrize("world", [2, 4])
def test_the_gin_variant_passes_l2_at_2_and_4_symm_ranks(evaluator, preset: str, world: int) -> None:
    wl = load_workload(MOE)
    assert wl.gin_baseline == "device_gin.cu"
    r = evaluator.evaluate(EvalRequest(candidate_code=(MOE / wl.gin_baseline).read_text(), workload_dir=str(MOE),
                                       params=_params(preset), world_size=world, backend="symm", iters=2,
                                       trials=L2_TRIALS, measure_seed=False, label=f"device_gin {preset}"))
    assert r.verdict == "pass", f"{r.verdict} at {r.level_reached}: {r.reason}"


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", GIN_WRONG)
def test_each_wrong_gin_candidate_fails_l2_at_two_ranks_with_its_reason(evaluator, name: str) -> None:
    e = ENTRIES[name]
    wl_dir = ROOT / e["workload"]
    wl = load_workload(wl_dir)
    params = wl.resolve(wl.size_presets[e["preset"]])
    code = (ADV / name).read_text()
    for world, verdict in ((1, "pass"), (e["min_world"], "fail")):  # honest at one rank, wrong from two on
        r = evaluator.evaluate(EvalRequest(candidate_code=code, workload_dir=str(wl_dir), params=params,
                                           world_size=world, backend="symm", iters=2,
                                           trials=L2_TRIALS if world == 1 else WRONG_TRIALS, measure_seed=False,
                                           label=name))
        assert r.verdict == verdict, f"{name} at {world} rank(s): {r.verdict} at {r.level_reached}: {r.reason}"
    assert r.level_reached == e["level"], r.reason
    assert e["reason_contains"] in r.reason.lower(), r.reason
    assert r.median_ms is None  # a rejection is never scored


def _cuda(code: str) -> str:
    return f"```cuda\n{code}```\n"


@pytest.mark.timeout(420)
def test_the_fast_paths_gin_branch_reaches_l2_under_symm_with_fixture_answers(evaluator) -> None:
    a = (FIXTURES / "gemm_stage_a.cu").read_text()
    b = (DATA / "gemm_stage_b_gin_both.cu").read_text()
    with FakeOpenAIServer([answer("stage-a", _cuda(a)), answer("stage-b-gin", _cuda(b))]) as srv:
        client = OpenAICompatibleClient(srv.config(max_retries=0), sleep=lambda s: None)
        fp = FastPath((GEMM / "seed_nccl.cu").read_text(), GEMM, client, evaluator, None,
                      FastPathConfig(gpu=True, max_attempts=1, annotate_attempts=0, backend="gin"))
        res = fp.run()
    (att,) = res.outcomes["B"].attempts
    assert att.verdict == "pass" and att.level == "L2", att.reason
    assert [(r.provenance.get("world_size"), r.provenance.get("backend"), r.verdict) for r in att.eval_result] == [
        (1, "symm", "pass"), (2, "symm", "pass")]
    assert res.status == "passed", res.message
