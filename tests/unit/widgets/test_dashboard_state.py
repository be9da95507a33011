"""The dashboard's state is enforced: after the search ends every control is off and says why, running the cell
again stops the search it replaces, and the approval queue scales (one line each, bulk decisions, a mode
switch, a history with outcomes)."""
from __future__ import annotations

import threading

import pytest

from cuco_kit.events import EventBus
from cuco_kit.search.gate import ApprovalGate
from cuco_kit.store import Store
from cuco_kit.widgets import RunDashboard
from cuco_kit.widgets.approval_queue import ApprovalQueue


class _Engine:
    def __init__(self, store: Store, run_id: int) -> None:
        self.store, self.run_id, self.events = store, run_id, EventBus()
        self.gate = ApprovalGate("manual")
        self.state, self.reason, self.population = "running", "", None
        self.stopped = 0

    def pause(self) -> None:
        self.state = "paused"

    def resume(self) -> None:
        self.state = "running"

    def stop(self) -> None:
        self.stopped += 1
        self.state, self.reason = "stopped", "stopped by the user"


@pytest.fixture()
def run():
    st = Store(":memory:")
    rid = st.create_run(workload="toy", config={}, seed=0, badge="simulated")
    seed = st.add_program(run_id=rid, code="int a;\n", parent_id=None, source="seed", name="seed")
    yield st, rid, seed
    RunDashboard.live.clear()
    st.close()


def _propose(st: Store, rid: int, parent: int, gate: ApprovalGate, n: int) -> list[int]:
    out = []
    for i in range(n):
        pid = st.add_proposal(run_id=rid, parent_id=parent, source="design_space", name=f"knobs {i}",
                              rationale=f"try chunks {i}", diff="", code=f"int b{i};\n")
        gate.submit(pid, object())  # type: ignore[arg-type]
        out.append(pid)
    return out


def test_after_stop_every_control_is_disabled_and_says_why(run):
    st, rid, seed = run
    eng = _Engine(st, rid)
    _propose(st, rid, seed, eng.gate, 2)
    dash = RunDashboard(eng, interval=0.05)
    assert not dash.pause_b.disabled and dash.resume_b.disabled  # running: only Pause and Stop mean something
    dash.stop_b.click()
    assert eng.state == "stopped"
    assert dash.controls and all(w.disabled for w in dash.controls)
    assert all("stopped" in w.tooltip for w in dash.controls)
    assert "controls are off" in dash.reason.value
    row = dash.queue.list.children[0]
    row.approve.click()
    dash.queue.approve_all.click()
    assert eng.gate.pending_ids() == sorted(dash.queue.rows)  # nothing was decided after Stop
    assert "approved" not in row.status.value
    dash.close()


def test_running_the_cell_again_stops_the_search_it_replaces(run):
    st, rid, _ = run
    first, second = _Engine(st, rid), _Engine(st, rid)
    old = RunDashboard(first, interval=0.05)
    new = RunDashboard(second, interval=0.05)
    assert first.stopped == 1 and second.stopped == 0
    assert all(w.disabled for w in old.controls) and "replaced" in old.reason.value
    assert not new.stop_b.disabled and RunDashboard.live["search"] is new
    other = RunDashboard(_Engine(st, rid), interval=0.05, key="another")  # another key leaves it alone
    assert second.stopped == 0 and not other.stop_b.disabled
    for d in (old, new, other):
        d.close()


def test_queue_is_collapsed_bulk_decides_switches_mode_and_keeps_history(run):
    st, rid, seed = run
    gate = ApprovalGate("manual")
    pids = _propose(st, rid, seed, gate, 9)
    q = ApprovalQueue(st, rid, gate)
    assert len(q.list.children) == 9
    assert all(r.review is None and r.detail.children == () for r in q.list.children)  # one line each
    first = q.list.children[0]
    first.expand.value = True
    assert first.review is not None and first.detail.children == (first.review,)  # the diff, on demand
    first.expand.value = False
    assert first.detail.children == ()
    first.reject.click()
    assert q.decide_all("approved") == 8
    decided = {d.proposal_id: d.decision for d, _ in gate.drain()}
    assert decided == {pids[0]: "rejected", **{p: "approved" for p in pids[1:]}}
    for p in pids:  # what the engine does when it drains the decisions
        st.decide(p, decided[p], by="user")
    prog = st.add_program(run_id=rid, code="int b1;\n", parent_id=seed, source="design_space", name="knobs 1")
    st.link_program(pids[1], prog)
    ev = st.start_evaluation(prog, world_size=2, backend="symm", badge="simulated", request={})
    st.finish_evaluation(ev, {"level_reached": "L3", "verdict": "pass", "median_ms": 1.5, "speedup": 1.333,
                              "badge": "simulated"})
    q.refresh()
    assert q.list.children == () and "waiting: <b>0</b>" in q.count.value
    assert "pass, 1.33x the seed" in q.history.value and "rejected" in q.history.value
    assert "latest 12 of" not in q.history.value
    _propose(st, rid, seed, gate, 1)
    q.mode.value = "auto"
    assert gate.mode == "auto" and gate.pending_ids() == []  # automatic approves what waits


def test_a_mode_set_elsewhere_is_shown_without_a_deadlock(run):
    # The smoke run sets the gate to "auto" from a cell while the search thread redraws the dashboard: showing
    # that mode must not call back into the redraw that is running (it once hung Run All of 02_search).
    st, rid, seed = run
    eng = _Engine(st, rid)
    dash = RunDashboard(eng, interval=0.05)
    eng.gate.set_mode("auto")
    done = threading.Event()
    threading.Thread(target=lambda: (dash._refresh.flush(), done.set()), daemon=True).start()
    assert done.wait(5), "the redraw hung"
    assert dash.queue.mode.value == "auto"
    dash.close()
