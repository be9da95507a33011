"""Overlap from a kernel timeline and the cost of a proposal: the numbers, the undefined cases, the budget pick,
and the queue's "approve up to a budget" button."""
from __future__ import annotations

import pytest

from cuco_kit.errors import BadInput
from cuco_kit.evaluate import overlap
from cuco_kit.evaluate.api import EvalRequest, EvalResult
from cuco_kit.evaluate.simulated import SimulatedEvaluator
from cuco_kit.search.config import SearchConfig
from cuco_kit.search.cost import (
    Cost,
    expected_gpu,
    proposal_cost,
    record_proposal_llm,
    within_budget,
)
from cuco_kit.store import Store
from cuco_kit.widgets.approval_queue import ApprovalQueue

pytestmark = pytest.mark.unit


def _row(rank, name, start, dur, it=0):
    return {"rank": rank, "iteration": it, "stream": 7, "name": name, "start_us": start, "dur_us": dur}


def test_fraction_follows_the_model():
    # compute 100, comm 60: serial 160, ideal 100. Measured 130 hides half of the 60.
    f, _ = overlap.fraction(100.0, 60.0, 130.0)
    assert f == pytest.approx(0.5)
    assert overlap.fraction(100.0, 60.0, 160.0)[0] == pytest.approx(0.0)
    assert overlap.fraction(100.0, 60.0, 100.0)[0] == pytest.approx(1.0)
    assert overlap.fraction(100.0, 60.0, 200.0)[0] == 0.0  # gaps: clipped, and said so
    assert "gaps" in overlap.fraction(100.0, 60.0, 200.0)[1]
    assert overlap.fraction(100.0, 0.0, 100.0) == (None, "no communication kernel: nothing to overlap")
    assert overlap.fraction(0.0, 50.0, 50.0)[0] is None


def test_from_timeline_unions_classifies_and_skips_harness():
    rows = [_row(0, "barrier_kernel", 0, 5),  # the harness's: not the program's work
            _row(0, "sm90_xmma_gemm_f16", 10, 60), _row(0, "sm90_xmma_gemm_f16", 50, 50),  # union 10..100 = 90
            _row(0, "ncclDevKernel_AllGather_RING", 40, 80),  # 40..120: comm 80
            _row(1, "sm90_xmma_gemm_f16", 0, 90), _row(1, "ncclDevKernel_AllGather_RING", 90, 80)]  # serial
    ov = overlap.from_timeline(rows)
    assert ov is not None
    # rank 0: C 90, M 80, T 110 -> (170 - 110) / (170 - 90) = 0.75; rank 1: T 170 -> 0.0; median 0.375
    assert ov.fraction == pytest.approx(0.375)
    assert ov.samples == 2 and ov.badge == "real"
    assert "38%" in ov.text()


def test_timeline_without_communication_is_undefined_not_zero():
    ov = overlap.from_timeline([_row(0, "gemm", 0, 10), _row(0, "gemm", 10, 10)], badge="replayed")
    assert ov is not None and ov.fraction is None and "no communication" in ov.why
    assert "n/a" in ov.text() and "[replayed]" in ov.text()
    assert overlap.from_timeline([_row(0, "spin_kernel", 0, 10)]) is None


def test_input_preparation_before_the_device_barrier_is_left_out():
    rows = [_row(0, "direct_copy_kernel_cuda", 0, 50), _row(0, "normal_kernel", 50, 50),  # the harness's inputs
            _row(0, "cuco_h::barrier_kernel", 100, 5),
            _row(0, "gemm", 110, 100), _row(0, "ncclDevKernel", 110, 50)]
    ov = overlap.from_timeline(rows)
    assert ov is not None and ov.compute_us == 100 and ov.comm_us == 50 and ov.fraction == pytest.approx(1.0)


def test_overlap_text_of_evaluations():
    assert overlap.overlap_text(None) == "overlap: not evaluated"
    assert "did not pass" in overlap.overlap_text({"verdict": "fail", "result": {}})
    assert "no timeline" in overlap.overlap_text({"verdict": "pass", "result": {"timeline": None}})


def test_simulated_evaluator_records_a_badged_timeline(repo_root):
    code = (repo_root / "sample_kernels/gemm_allgather/seed_nccl.cu").read_text()
    req = EvalRequest(candidate_code=code, workload_dir=str(repo_root / "sample_kernels/gemm_allgather"),
                      world_size=2, timeline=True)
    res = SimulatedEvaluator(seed=3).evaluate(req)
    ov = overlap.from_timeline(res.timeline or [], badge=res.badge)
    assert ov is not None and ov.fraction is not None and 0.0 <= ov.fraction <= 1.0
    assert "SIMULATED" in ov.text()
    req.timeline = False
    assert SimulatedEvaluator(seed=3).evaluate(req).timeline is None


def test_search_config_timeline_option():
    assert SearchConfig().timeline == "every"
    assert SearchConfig.from_dict({"timeline": "off"}).timeline == "off"
    with pytest.raises(BadInput, match="timeline"):
        SearchConfig(timeline="sometimes")


# ---- cost -----------------------------------------------------------------------------------------------------

def _evaluate(st, program_id, *, seconds, verdict="pass", level="L3", world=2, badge="real"):
    eid = st.start_evaluation(program_id, world_size=world, backend="symm", badge=badge, request={})
    st.finish_evaluation(eid, EvalResult(level_reached=level, verdict=verdict, median_ms=1.0 if verdict == "pass"
                                         else None, badge=badge).to_dict())
    st._write("UPDATE evaluations SET started_at = 100.0, finished_at = ? WHERE id = ?", (100.0 + seconds, eid))
    return eid


@pytest.fixture()
def costed():
    st = Store(":memory:")
    rid = st.create_run(workload="toy", config={}, seed=0)
    seed = st.add_program(run_id=rid, code="int s;\n", parent_id=None, source="seed", name="seed")
    _evaluate(st, seed, seconds=3.0)  # 2 ranks x 3 s = 6 GPU-s
    built = st.add_program(run_id=rid, code="int a;\n", parent_id=seed, source="llm_diff", name="a")
    _evaluate(st, built, seconds=1.0)  # 2 GPU-s
    broken = st.add_program(run_id=rid, code="int b;\n", parent_id=seed, source="llm_diff", name="b")
    _evaluate(st, broken, seconds=0.5, verdict="fail", level="L1")  # 1 GPU-s, a build failure
    props = []
    for i, model in enumerate(["gpt-4o-mini", "local-llama"]):
        pid = st.add_proposal(run_id=rid, parent_id=seed, source="llm_diff", name=f"p{i}", rationale="",
                              diff="", code=f"int p{i};\n", tags=[f"model:{model}"])
        record_proposal_llm(st, rid, pid, {"model": model, "prompt_tokens": 2000, "completion_tokens": 1000,
                                           "dollars": None})
        props.append(pid)
    yield st, rid, seed, props
    st.close()


def test_expected_cost_before_approval(costed):
    st, rid, seed, (known, unknown) = costed
    gpu, note, badge = expected_gpu(st, rid)
    assert gpu == pytest.approx((6.0 + 2.0 + 1.0) / 3) and "3 evaluation" in note and badge == "real"
    c = proposal_cost(st, rid, st.proposal(known))
    assert c.state == "expected" and c.gpu_seconds == pytest.approx(3.0)
    # 1 of 2 LLM programs failed to build; one gpt-4o-mini answer of 2000 + 1000 tokens at $0.15 / $0.60 per Mtok
    one = (2000 * 0.15 + 1000 * 0.60) / 1e6
    assert c.llm_dollars == pytest.approx(0.5 * one)
    assert c.proposed_dollars == pytest.approx(one)
    u = proposal_cost(st, rid, st.proposal(unknown))
    assert u.llm_dollars is None and "unknown price" in u.llm_note and "unknown price" in u.text()
    assert u.proposed_dollars is None and "unknown price" in u.proposed_note


def test_actual_cost_after_evaluation_and_none_after_rejection(costed):
    st, rid, seed, (known, unknown) = costed
    prog = st.add_program(run_id=rid, code="int p0;\n", parent_id=seed, source="llm_diff", name="p0")
    st.decide(known, "approved", by="me", program_id=prog)
    assert proposal_cost(st, rid, st.proposal(known)).state == "expected"  # approved, not evaluated yet
    _evaluate(st, prog, seconds=2.5, world=4)
    c = proposal_cost(st, rid, st.proposal(known))
    assert c.state == "actual" and c.gpu_seconds == pytest.approx(10.0) and c.llm_dollars == 0.0
    st.decide(unknown, "rejected", by="me")
    assert proposal_cost(st, rid, st.proposal(unknown)).state == "none"


def test_unknown_gpu_time_before_any_evaluation():
    st = Store(":memory:")
    rid = st.create_run(workload="toy", config={}, seed=0)
    seed = st.add_program(run_id=rid, code="int s;\n", parent_id=None, source="seed", name="seed")
    pid = st.add_proposal(run_id=rid, parent_id=seed, source="design_space", name="k", rationale="", diff="",
                          code="int k;\n")
    c = proposal_cost(st, rid, st.proposal(pid))
    assert c.gpu_seconds is None and "no evaluation has finished" in c.text()
    assert c.llm_dollars == 0.0 and "no LLM call" in c.text()  # no LLM wrote it, none follows


def _c(gpu, dollars, note="unknown price"):
    return Cost("expected", gpu, "n", dollars, note)


def test_within_budget_stops_before_the_one_that_would_exceed():
    costs = [(1, _c(3.0, 0.01)), (2, _c(3.0, 0.01)), (3, _c(3.0, 0.01))]
    pick = within_budget(costs, gpu_seconds=7.0)
    assert pick.approve == [1, 2] and pick.gpu_seconds == pytest.approx(6.0) and "#3" in pick.stopped
    assert within_budget(costs, llm_dollars=0.025).approve == [1, 2]
    assert within_budget(costs, gpu_seconds=100, llm_dollars=1).approve == [1, 2, 3]
    assert within_budget(costs, gpu_seconds=100, llm_dollars=1).stopped == ""
    # what a set budget cannot count stops the pick
    stopped = within_budget([(1, _c(1.0, 0.0)), (2, _c(1.0, None)), (3, _c(1.0, 0.0))], llm_dollars=1.0)
    assert stopped.approve == [1] and "unknown price" in stopped.stopped
    assert within_budget([(1, _c(1.0, None))], gpu_seconds=5).approve == [1]  # no dollar budget: not checked


class _Gate:
    def __init__(self) -> None:
        self.mode = "manual"
        self.decisions: list[tuple] = []

    def decide(self, proposal_id, decision, code=None):
        self.decisions.append((proposal_id, decision))

    def set_mode(self, mode):
        self.mode = mode


def test_queue_approves_up_to_a_budget_and_shows_cost(costed):
    st, rid, seed, _ = costed
    more = [st.add_proposal(run_id=rid, parent_id=seed, source="design_space", name=f"k{i}", rationale="",
                            diff="", code=f"int k{i};\n") for i in range(3)]
    gate = _Gate()
    q = ApprovalQueue(st, rid, gate)
    first = q.rows[min(q.rows)]
    assert "expected: 3.0 GPU-s" in first.info.value and "parent" in first.info.value
    order = sorted(q.rows)
    q.budget.dollars.value = "$1"
    q.budget.button.click()  # the second has an unknown price: a dollar budget cannot count it, so it stops
    assert [d[0] for d in gate.decisions] == order[:1] and "unknown price" in q.budget.result.value
    q.budget.dollars.value = ""
    q.budget.gpu.value = "7"
    q.budget.button.click()  # 3 GPU-s each: the next two fit, a third would make 9
    assert [d[0] for d in gate.decisions] == order[:3] and more[0] == order[2]
    assert "approved 2" in q.budget.result.value and "stopped" in q.budget.result.value
    q.budget.gpu.value = "lots"
    q.budget.button.click()
    assert "not a number" in q.budget.result.value and len(gate.decisions) == 3
    q.refresh()
    assert "<th>overlap</th><th>cost</th>" in q.history.value or "no decisions" in q.history.value
    q.disable("search stopped")
    assert q.budget.button.disabled and q.budget.gpu.disabled
