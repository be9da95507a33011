"""cuco init's importer on the two test programs (cuco_kit/importer/examples/, written for these tests): the plan, the
deterministic port, workload.py, the LLM port and reference checked against FIXTURE answers, and bad input."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cuco_kit.errors import BadInput
from cuco_kit.importer.check import check_workload
from cuco_kit.importer.derive import make_plan
from cuco_kit.importer.plan import ImportPlan, InconsistentPlan, check_plan, require_consistent
from cuco_kit.importer.session import ImportSession
from cuco_kit.importer.size_expr import Untranslatable, evaluate, translate
from cuco_kit.llm import Completion, fixtures
from cuco_kit.workload import workload_fingerprint

ROOT = Path(__file__).resolve().parents[3]
OWN = ROOT / "tests" / "data" / "own_kernel"  # programs cuco init refuses
EXAMPLES = ROOT / "cuco_kit" / "importer" / "examples"  # the two test programs, shipped for the notebook


class Scripted:
    """An LLMClient answering with labelled FIXTURE texts, in order."""

    def __init__(self, *texts: str) -> None:
        self.texts = list(texts)
        self.prompts: list[str] = []

    def complete(self, messages, *, purpose, temperature=None, max_tokens=None):
        self.prompts.append(messages[-1]["content"])
        return Completion(self.texts.pop(0), "fixture-import", 1, 1, 0.0, "stop", fixture=True)


def _ok_build(code, backend, cfg=None, cache_dir=None):
    class R:
        ok, log = True, ""
    return R()


def roles(plan: ImportPlan) -> dict[str, str]:
    return {b.name: b.role for b in plan.buffers}


def test_plan_of_the_allreduce_norm_program():
    plan = make_plan((EXAMPLES / "allreduce_norm.cu").read_text(), "allreduce_norm.cu")
    assert roles(plan) == {"partial_sums": "input", "summed": "scratch", "gamma": "input", "normed": "output"}
    assert plan.sizes == {"kRows": 512, "kCols": 1024}  # kSteps only bounds the loop: not a size
    assert (plan.comm, plan.rank, plan.world, plan.main_stream) == ("comm", "rank", "nranks", "stream")
    assert plan.locals == ["n", "eps"] and plan.side_streams == []
    assert evaluate(plan.count_python(plan.buffers[0]), plan.sizes, 2) == 512 * 1024
    assert check_plan(plan, (EXAMPLES / "allreduce_norm.cu").read_text()) == []


def test_plan_of_the_ring_program_keeps_send_recv_on_a_side_stream():
    plan = make_plan((EXAMPLES / "ring_attention.cu").read_text(), "ring_attention.cu")
    assert [b.name for b in plan.tensors()] == ["q", "kv_local", "out"]
    assert roles(plan)["kv_remote"] == "scratch"  # received, then read by the kernel
    assert plan.main_stream == "compute" and plan.side_streams == ["comm_stream"]
    assert plan.events == ["arrived"] and plan.locals == ["next", "prev", "kv_elems"]


def test_deterministic_seed_binds_harness_names_and_keeps_the_step(tmp_path):
    s = ImportSession(EXAMPLES / "ring_attention.cu", tmp_path / "wl")
    seed = s.skeleton
    assert "#include <mpi.h>" not in seed and "int main(" not in seed
    assert 'float* kv_local = (float*)cuco_tensor(ctx, "kv_local")->local;' in seed
    assert "ncclComm_t ring = (ncclComm_t)ctx->nccl_comm;" in seed
    assert "cudaStream_t compute = ctx->stream;" in seed
    assert "ncclSend(kv_local, kv_elems, ncclFloat, next, ring, comm_stream)" in seed
    # the side stream is a cuco_side_stream_t: it forks from and joins the harness stream (the ABI)
    assert "cudaStream_t comm_stream = st->comm_stream.stream;" in seed
    assert seed.index("cuco_side_stream_fork(&st->comm_stream, ctx->stream)") < seed.index("ncclGroupStart")
    assert seed.index("ncclGroupEnd") < seed.index("cuco_side_stream_join(&st->comm_stream, ctx->stream)")
    assert s.port_problems(seed, compile_seed=False) == []


def test_written_folder_has_todo_places_until_a_reference_is_approved(tmp_path):
    d = tmp_path / "wl"
    s = ImportSession(EXAMPLES / "allreduce_norm.cu", d)
    s.write()
    first = check_workload(d, compile_seed=False)
    assert not first.ok
    assert [f.what for f in first.problems()] == ["reference", "tolerance"], first.text()
    assert "the seed's outputs (differential) until a reference is approved" in first.text()
    before = workload_fingerprint(d)
    s.accept_reference(fixtures.load("own_norm_reference.txt"))
    after = check_workload(d, compile_seed=False)
    assert after.ok, after.text()
    # warm rank workers hold the workload they loaded: approving a reference must be seen as a change
    assert workload_fingerprint(d) != before
    with pytest.raises(BadInput, match="already holds a workload.py"):
        s.write()


def test_llm_port_that_drops_a_buffer_is_refused_and_a_correct_one_accepted(tmp_path):
    d = tmp_path / "wl"
    llm = Scripted(f"FIXTURE\n```cuda\n{fixtures.load('own_norm_port_drops_buffer.cu')}```",
                   f"FIXTURE\n```cuda\n{fixtures.load('own_norm_port.cu')}```")
    s = ImportSession(EXAMPLES / "allreduce_norm.cu", d, llm=llm, builder=_ok_build)
    s.write()
    bad = s.propose_port()
    assert not bad.ok and bad.fixture
    assert any("'gamma'" in p and "dropped" in p for p in bad.problems)
    with pytest.raises(BadInput, match="gamma"):
        s.accept_port(bad.code or "")
    good = s.propose_port(note="you dropped gamma")
    assert "you dropped gamma" in llm.prompts[-1]
    assert good.ok, good.problems
    assert "--- allreduce_norm.cu" in good.diff  # reviewed as a diff against the original
    s.accept_port(good.code or "")


def test_reference_drafts_run_on_the_cpu_before_approval(tmp_path):
    d = tmp_path / "wl"
    raising = ("def reference(inputs, params, world):\n    raise ValueError('boom')\n\n\n"
               "TOLERANCE = Tolerance(rel=1e-4)\n")
    llm = Scripted(f"```python\n{raising}```", f"```python\n{fixtures.load('own_norm_reference.txt')}```")
    s = ImportSession(EXAMPLES / "allreduce_norm.cu", d, llm=llm)
    s.write()
    draft = s.propose_reference()
    assert draft.problems and "raised ValueError: boom" in draft.problems[0]
    with pytest.raises(BadInput, match="raised ValueError"):
        s.accept_reference(draft.code or "")
    ok = s.propose_reference()
    assert ok.ok, ok.problems
    # the disagreeing fixture runs and has the right shapes: only L2 against the seed (GPU) can catch it
    assert s.reference_problems(fixtures.load("own_norm_reference_wrong.txt")) == []


def test_inconsistent_plans_are_one_line_each():
    code = (EXAMPLES / "allreduce_norm.cu").read_text()
    plan = make_plan(code, "allreduce_norm.cu")
    d = json.loads(plan.to_json())
    d["buffers"][3]["role"] = "scratch"  # nothing left to verify
    d["buffers"][0]["count"] = "kRows * mystery"
    bad = ImportPlan.from_json(json.dumps(d))
    problems = check_plan(bad, code)
    assert any("no buffer is an output" in p for p in problems)
    assert any("'mystery'" in p for p in problems)
    with pytest.raises(InconsistentPlan, match="the import plan is not ready: .*and 1 more") as info:
        require_consistent(bad, code)
    assert info.value.problems == problems  # every problem travels with the one-line message
    for version in (1, 99):
        with pytest.raises(BadInput, match=f"plan version {version}; this cuco_kit reads version 2"):
            ImportPlan.from_json(json.dumps({**d, "version": version}))


def test_a_program_without_nccl_gets_one_clear_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "cuco_kit", "init", str(OWN / "no_nccl.cu"), "--workload",
                           str(tmp_path / "wl")], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "no NCCL collectives" in proc.stderr
    assert not (tmp_path / "wl").exists()


def test_what_the_analysis_cannot_decide_is_a_todo_in_a_written_plan(tmp_path):
    # the communicator comes from a function of another file: the plan is written with a TODO saying so
    d = tmp_path / "wl"
    proc = subprocess.run([sys.executable, "-m", "cuco_kit", "init", str(OWN / "untraced_comm.cu"), "--workload",
                           str(d)], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    plan = ImportPlan.load(d / "cuco_plan.json")
    assert len(plan.todo) == 1 and "communicator 'c' is not created by an ncclCommInitRank" in plan.todo[0]
    errors = proc.stderr.strip().splitlines()
    assert errors[0] == f"cuco init: TODO: {plan.todo[0]}" and "1 problem(s) in the plan" in errors[-1]
    assert not (d / "workload.py").exists()
    # the person decides (the harness's communicator has no rank or world variable here) and runs it again
    plan.todo, plan.rank, plan.world = [], "", ""
    plan.save(d / "cuco_plan.json")
    again = subprocess.run([sys.executable, "-m", "cuco_kit", "init", str(OWN / "untraced_comm.cu"), "--workload",
                            str(d)], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert again.returncode == 0, again.stderr
    assert 'ncclComm_t c = (ncclComm_t)ctx->nccl_comm;' in (d / "seed_nccl.cu").read_text()


def test_size_expressions_translate_only_arithmetic():
    names = {"N": 'p["N"]', "world": "w"}
    assert evaluate(translate("(size_t)N * 2 / world", names), {"N": 8}, 2) == 8
    with pytest.raises(Untranslatable):
        translate("getenv(N)", names)
    with pytest.raises(Untranslatable):
        evaluate("__import__('os')", {}, 1)


def test_plan_only_then_the_corrected_plan_is_used(tmp_path):
    d = tmp_path / "wl"

    def cuco(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "cuco_kit", *args], capture_output=True, text=True,
                              timeout=60, cwd=ROOT)

    first = cuco("init", str(EXAMPLES / "allreduce_norm.cu"), "--workload", str(d), "--plan-only")
    assert first.returncode == 0 and "scratch  summed" in first.stdout
    assert (d / "cuco_plan.json").is_file() and not (d / "workload.py").exists()
    plan = json.loads((d / "cuco_plan.json").read_text())
    plan["name"] = "my_norm"
    (d / "cuco_plan.json").write_text(json.dumps(plan))
    second = cuco("init", str(EXAMPLES / "allreduce_norm.cu"), "--workload", str(d))
    assert second.returncode == 0 and "using the plan in" in second.stdout
    assert "loads: my_norm" in check_workload(d, compile_seed=False).text()


def test_a_plan_with_problems_is_written_alone_and_every_problem_listed(tmp_path):
    d = tmp_path / "wl"
    s = ImportSession(EXAMPLES / "allreduce_norm.cu", d)
    s.plan.todo = ["which loop is the step"]
    s.plan.buffers[3].role = "scratch"
    with pytest.raises(InconsistentPlan) as info:
        s.write()
    assert info.value.problems[0] == "TODO: which loop is the step" and len(info.value.problems) == 2
    assert ImportPlan.load(d / "cuco_plan.json").todo == ["which loop is the step"]
    assert not (d / "workload.py").exists() and not (d / "seed_nccl.cu").exists()
