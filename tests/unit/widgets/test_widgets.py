"""Widget state without a browser: clicks, trait changes and queue decisions."""
from __future__ import annotations

import json
import threading
import time
from types import SimpleNamespace

import pytest

from cuco_kit.evaluate.api import EvalRequest, EvalResult
from cuco_kit.events import EventBus
from cuco_kit.store import Store
from cuco_kit.widgets import (
    AnalysisView,
    DesignSpaceMap,
    DiffReview,
    EvalCell,
    LatencyPlot,
    LedgerView,
    LineageTree,
    RunDashboard,
    TimelineView,
    banner,
    notebook,
    review_attempts,
)
from cuco_kit.widgets._common import BADGE_STYLE, Throttle
from cuco_kit.workbench import Note

EVIL = "<script>alert('x')</script>"


def _result(verdict: str, ms: float | None, level: str = "L3", **kw) -> dict:
    return EvalResult(level_reached=level, verdict=verdict, median_ms=ms, seed_median_ms=2.0,
                      speedup=(2.0 / ms) if ms else None, badge="simulated",
                      provenance={"gpu": "SIM", "date": "2026-12-02"}, **kw).to_dict()


@pytest.fixture()
def run_store():
    st = Store(":memory:")
    rid = st.create_run(workload="toy", config={}, seed=0, badge="simulated")
    seed = st.add_program(run_id=rid, code="int a;\n", parent_id=None, source="seed", name="seed")
    kids = []
    for i, (verdict, ms, level) in enumerate([("pass", 1.5, "L3"), ("fail", None, "L2"), ("pass", 1.0, "L3")]):
        pid = st.add_program(run_id=rid, code=f"int a{i};\n", parent_id=seed, source="design_space",
                             name=f"c{i}", generation=1, cell=f"cell{i % 2}")
        eid = st.start_evaluation(pid, world_size=2, backend="symm", badge="simulated", request={})
        st.finish_evaluation(eid, _result(verdict, ms, level, reason="" if verdict == "pass" else "wrong output"))
        kids.append(pid)
    yield st, rid, seed, kids
    st.close()


def test_diff_review_approve_once_and_escapes():
    got = []
    prop = {"id": 7, "name": EVIL, "rationale": EVIL, "source": "llm_diff", "tags": [EVIL],
            "parent_code": "int x = 1;\n", "code": f"int x = 2; // {EVIL}\n"}
    w = DiffReview(prop, on_decision=lambda *a: got.append(a))
    assert "<script>" not in w.header.value and "&lt;script&gt;" in w.header.value
    assert "<script>" not in w.diff.value
    w.approve.click()
    w.reject.click()  # ignored: one decision per proposal
    assert got == [(7, "approved", None)]
    assert w.approve.disabled and w.reject.disabled and w.decision == "approved"


def test_diff_review_edit_becomes_edited_code():
    got = []
    w = DiffReview({"id": 3, "parent_code": "a\n", "code": "b\n"}, on_decision=lambda *a: got.append(a))
    w.edit.click()
    assert w.editor.layout.display == ""
    w.editor.value = "c\n"
    w.submit_edit.click()
    assert got == [(3, "edited", "c\n")]


def test_diff_review_freeze_shows_a_decision_taken_elsewhere():
    got = []
    w = DiffReview({"id": 4, "parent_code": "a\n", "code": "b\n"}, on_decision=lambda *a: got.append(a))
    w.freeze(EVIL)
    assert all(b.disabled for b in (w.approve, w.reject, w.edit, w.submit_edit))
    assert "&lt;script&gt;" in w.status.value and "<script>" not in w.status.value
    w.approve.click()
    assert got == [] and w.decision == EVIL


def test_banner_draws_a_note_in_its_badge_colour_and_escapes():
    b = banner(Note(EVIL, "replayed"))
    assert BADGE_STYLE["replayed"][0] in b._repr_html_() and "<script>" not in b._repr_html_()
    assert str(b) == repr(b) == EVIL
    assert BADGE_STYLE["info"][0] in banner("plain text")._repr_html_()
    assert BADGE_STYLE["info"][0] in banner("x", "no-such-badge")._repr_html_()


def test_review_attempts_freezes_decided_attempts(monkeypatch):
    shown = []
    monkeypatch.setattr(notebook, "display", lambda *objs: shown.extend(objs))

    def attempt(number, verdict):
        return SimpleNamespace(proposal_id=None, number=number, stage="B", source="llm", verdict=verdict,
                               level="L1", reason="built", llm_model="fixture-stage-b", fixture=True, code="b\n")

    fp = SimpleNamespace(seed_code="seed\n", outcomes={"A": SimpleNamespace(code="a\n")})
    outcome = SimpleNamespace(stage="B", status="done", message="ok", ok=True,
                              attempts=[attempt(1, "fail"), attempt(2, "pending")])
    review_attempts(fp, outcome)
    head, failed, pending = shown
    assert str(head) == "stage B: done - ok"
    assert failed.approve.disabled and failed.decision == "fail" and "fail" in failed.status.value
    assert not pending.approve.disabled and pending.decision is None
    assert pending.proposal["parent_code"] == "a\n" and "FIXTURE answer" in pending.proposal["rationale"]


def test_lineage_latency_cells_from_store(run_store):
    st, rid, seed, kids = run_store
    tree = LineageTree(st, rid)
    names = [t.name for t in tree.fig.data]
    assert "passed" in names and "failed (symbol = level)" in names
    passed = [t for t in tree.fig.data if t.name == "passed"][0]
    assert sorted(passed.customdata) == sorted([kids[0], kids[2]])
    assert "SIMULATED" in tree.badge.value
    picked = []
    tree.on_select(picked.append)
    assert {v for _, v in tree.picker.options} == {None, *kids}  # every program evaluated
    tree.refresh()  # a redraw keeps the menu and selects nothing
    assert picked == [] and tree.picker.value is None
    assert tree.detail.value == ""
    tree.picker.value = passed.customdata[0]
    assert picked == [passed.customdata[0]]
    # the menu's promise: the chosen program's numbers and its diff against its parent, under the menu
    assert f"program {passed.customdata[0]}:" in tree.detail.value and "cuco-diff" in tree.detail.value
    assert "speed-up over the seed" in tree.detail.value
    shown = tree.fig.outputs[0]["data"]["application/vnd.plotly.v1+json"]  # strict JSON, as the browser gets it
    assert shown["layout"]["title"]["text"].startswith("Lineage") and json.dumps(shown, allow_nan=False)

    lat = LatencyPlot(st, rid, baselines={"cuBLAS alone": 0.9})
    best = [t for t in lat.fig.data if t.name == "best so far"][0]
    assert list(best.y)[-1] == pytest.approx(1.0)
    assert len(lat.fig.layout.shapes) == 2  # cuBLAS line + the seed measured in the same run

    cells = DesignSpaceMap(st, rid)
    assert set(cells.cells["cell"]) == {"cell0", "cell1"}
    assert cells.cells.iloc[0]["best_ms"] == pytest.approx(1.0)


def test_ledger_view_totals(run_store):
    st, rid, *_ = run_store
    st.add_llm_call(run_id=rid, model="m", purpose="diff", prompt_tokens=10, completion_tokens=5, latency_s=0.1,
                    dollars=0.25, ok=True)
    st.add_llm_call(run_id=rid, model="x", purpose="diff", prompt_tokens=1, completion_tokens=1, latency_s=0.1,
                    dollars=None, ok=False, error=EVIL)
    v = LedgerView(st, rid)
    assert "2</b> calls" in v.summary.value and "$0.2500" in v.summary.value and "1 failed" in v.summary.value
    assert "<script>" not in v.table.value


def test_analysis_and_timeline_views():
    report = {"filename": "x.cu", "collectives": [{"call": "ncclAllGather", "line": 3}], "launches": [],
              "kernels": [], "allocations": [],
              "graph": {"nodes": [{"id": 0, "kind": "kernel", "name": "k", "stream": "s", "line": 1},
                                  {"id": 1, "kind": "collective", "name": "ncclAllGather", "stream": "s", "line": 3}],
                        "edges": [{"src": 0, "dst": 1, "buffer": "x", "kind": "produce", "order": "stream"}]}}
    v = AnalysisView(report)
    assert {t.name for t in v.fig.data if t.name} == {"kernel", "collective"}
    t = TimelineView([{"rank": 0, "stream": 7, "name": "gemm", "start_us": 10.0, "dur_us": 5.0},
                      {"rank": 1, "stream": 7, "name": "put", "start_us": 11.0, "dur_us": 2.0}])
    # one bar trace per kernel name (sorted), each starting at its offset from the first kernel
    assert [(b.name, list(b.base), list(b.x)) for b in t.fig.data] == [("gemm", [0.0], [5.0]), ("put", [1.0], [2.0])]


def test_timeline_labels_are_escaped():
    # rank and stream come from the rank processes' profile, i.e. from a candidate: never markup in the plot
    xss = '<img src=x onerror="alert(1)">'
    t = TimelineView([{"rank": xss, "stream": "<b>7</b>", "name": f"<script>{xss}</script>", "start_us": 1.0,
                       "dur_us": 2.0}])
    (bar,) = t.fig.data
    shown = " ".join([*map(str, bar.y), bar.name, *map(str, bar.hovertext)])
    assert "<" not in shown and ">" not in shown
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in bar.y[0] and "&lt;b&gt;7&lt;/b&gt;" in bar.y[0]


class _FakeEvaluator:
    """Typed fake of the Evaluator protocol: reports progress, then waits for the test to release it."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.requests: list[EvalRequest] = []

    def evaluate(self, request, progress=None):
        self.requests.append(request)
        for r in range(request.world_size):
            progress({"level": "L2", "rank": r, "step": "verify", "done": 1, "total": 3})
        self.release.wait(10)
        return EvalResult(level_reached="L3", verdict="pass", median_ms=1.25, badge="simulated",
                          timeline=[{"rank": 0, "stream": 7, "name": "gemm", "start_us": 1.0, "dur_us": 2.0}])


def test_eval_cell_returns_at_once_and_tabulates(repo_root):
    ev = _FakeEvaluator()
    cell = EvalCell(ev, repo_root / "tests" / "data" / "toy_workload",
                    candidates={"a.cu": "code"}, ranks=(2,), backends=("symm",), interval=0.01)
    t0 = time.monotonic()
    th = cell.button.click() or cell._thread
    assert time.monotonic() - t0 < 1.0 and th is not None and th.is_alive()
    time.sleep(0.05)
    cell._refresh.flush()
    assert len(cell.bars.children) == 2 and "L2" in cell.level.value
    ev.release.set()
    cell.join(5)
    assert not th.is_alive()
    df = cell.frame()
    assert df.loc[0, "verdict"] == "pass" and df.loc[0, "median_ms"] == 1.25 and df.loc[0, "ranks"] == 2
    assert ev.requests[0].backend == "symm" and ev.requests[0].world_size == 2 and ev.requests[0].timeline
    assert len(cell.timeline_box.children) == 1  # the evaluation's kernel timeline is drawn
    cell.close()


class _FakeGate:
    def __init__(self) -> None:
        self.decisions: list[tuple] = []
        self.mode = "manual"

    def decide(self, proposal_id, decision, code=None):
        self.decisions.append((proposal_id, decision, code))

    def set_mode(self, mode):
        self.mode = mode


class _FakeEngine:
    def __init__(self, store, run_id) -> None:
        self.store, self.run_id, self.events, self.gate = store, run_id, EventBus(), _FakeGate()
        self.state, self.reason, self.population = "running", "", None
        self.calls: list[str] = []

    def pause(self):
        self.calls.append("pause")

    def resume(self):
        self.calls.append("resume")

    def stop(self):
        self.calls.append("stop")


def test_run_dashboard_queue_buttons_and_throttle(run_store):
    st, rid, seed, kids = run_store
    pid = st.add_proposal(run_id=rid, parent_id=seed, source="llm_diff", name="p", rationale=EVIL, diff="",
                          code="int b;\n")
    eng = _FakeEngine(st, rid)
    dash = RunDashboard(eng, interval=0.2)
    assert len(dash.queue.list.children) == 1 and EVIL not in dash.queue.list.children[0].summary.value
    dash.queue.list.children[0].approve.click()
    assert eng.gate.decisions == [(pid, "approved", None)]
    dash.pause_b.click()
    eng.state = "paused"
    dash._refresh.flush()
    dash.resume_b.click()
    dash.stop_b.click()
    assert eng.calls == ["pause", "resume", "stop"]
    before = dash._refresh.calls
    for _ in range(50):
        eng.events.publish("log", run_id=rid, message="tick")
    time.sleep(0.5)
    assert dash.events_seen == 50
    assert 1 <= dash._refresh.calls - before <= 3  # throttled: not once per event
    dash.lineage.select(kids[2])
    assert f"program {kids[2]}:" in dash.detail.value and dash.lineage.detail.value == ""  # shown once
    dash.close()


def test_throttle_coalesces_and_last_call_lands():
    hits = []
    th = Throttle(lambda: hits.append(time.monotonic()), interval=0.1)
    for _ in range(20):
        th()
    time.sleep(0.25)
    assert len(hits) == 2
    th.close()
