"""The local slot executor: GPU sets from NVLink domains, one warm (SIMULATED) evaluator per set with its own
CUDA_VISIBLE_DEVICES, slots refilled as results return, lost evaluations retried on another slot then recorded
as infrastructure errors, a driver killed with kill -9 resumed with nothing lost or repeated, and the CLI's
--gpus with its one-line refusals and per-slot log lines."""
from __future__ import annotations

import os
import re
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import tomllib

from cuco_kit import workbench
from cuco_kit.cli import main
from cuco_kit.errors import BadInput
from cuco_kit.evaluate.api import EvalRequest, EvalResult, EvaluatorLost, Progress
from cuco_kit.evaluate.simulated import SimulatedEvaluator
from cuco_kit.evaluate.spec import EvaluatorSpec
from cuco_kit.events import EventBus
from cuco_kit.search import gpu_sets
from cuco_kit.search.budget import BudgetConfig
from cuco_kit.search.config import SearchConfig
from cuco_kit.search.design_space import DesignSpaceSource
from cuco_kit.search.engine import SearchEngine
from cuco_kit.search.gpu_sets import GpuSet
from cuco_kit.search.population import Population
from cuco_kit.search.slot_board import SlotBoard
from cuco_kit.search.slots import LocalSlot, SlotExecutor, local_executor
from cuco_kit.search.synthetic import write_synthetic_workload
from cuco_kit.store import Store
from cuco_kit.workload import load_workload

# Two NVLink pairs, as `nvidia-smi topo -p2p n` prints them.
TOPO = """ \tGPU0\tGPU1\tGPU2\tGPU3\t
 GPU0\tX\tOK\tNS\tNS\t
 GPU1\tOK\tX\tNS\tNS\t
 GPU2\tNS\tNS\tX\tOK\t
 GPU3\tNS\tNS\tOK\tX\t

Legend:
  X    = Self
  OK   = Status Ok
"""


@pytest.fixture(scope="module")
def wl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic_workload(tmp_path_factory.mktemp("wl") / "synthetic")


def _request(wl: Path, label: str = "r", world: int = 1) -> EvalRequest:
    w = load_workload(wl)
    return EvalRequest(candidate_code=w.path(w.baseline).read_text(), workload_dir=str(wl), world_size=world,
                       label=label, iters=3)


def test_gpu_sets_follow_nvlink_domains_and_refuse_what_cannot_fit() -> None:
    assert gpu_sets.parse_p2p_matrix(TOPO) == {"0": {"1"}, "1": {"0"}, "2": {"3"}, "3": {"2"}}
    p = gpu_sets.plan(["0", "1", "2", "3"], 2, "nccl", matrix=TOPO)
    assert [s.gpus for s in p.sets] == [("0", "1"), ("2", "3")] and not p.idle
    p = gpu_sets.plan(["0", "1", "2"], 2, "nccl", matrix=TOPO)
    assert [s.gpus for s in p.sets] == [("0", "1")] and p.idle == ["2"]
    # symm: the ranks of a world share one GPU, so every GPU is a slot
    assert [s.gpus for s in gpu_sets.plan(["0", "1", "2", "3"], 4, "symm", matrix=TOPO).sets] == \
        [("0",), ("1",), ("2",), ("3",)]
    # no topology (no nvidia-smi): one domain
    assert [s.gpus for s in gpu_sets.plan(["0", "1", "2", "3"], 4, "nccl", matrix="").sets] == [("0", "1", "2", "3")]
    with pytest.raises(BadInput, match="needs 4 GPUs of one NVLink domain; the largest domain .* has 2"):
        gpu_sets.plan(["0", "1", "2", "3"], 4, "nccl", matrix=TOPO)
    with pytest.raises(BadInput, match="named twice"):
        gpu_sets.parse_gpu_list("0,1,1")


def test_search_assigns_each_evaluation_a_gpu_set_of_its_own(wl: Path, tmp_path: Path) -> None:
    spec = EvaluatorSpec("simulated", {"seed": 2, "delay_s": 0.05})  # a slot stays busy while the next is given
    ex = local_executor(spec, ["0", "1", "2", "3"], 2, "nccl", matrix=TOPO)
    assert ex.slots == 2
    bus = EventBus()
    cfg = SearchConfig(seed=1, world_size=2, proposals_per_generation=4, budget=BudgetConfig(generations=1))
    with Store(tmp_path / "s.db") as st:
        eng = SearchEngine(wl, st, ex, [DesignSpaceSource()], cfg, bus, executor=ex)
        summary = eng.run()
        evs = st.evaluations(run_id=eng.run_id)
    assert summary.state == "finished" and summary.badge == "simulated"
    assert len(evs) == summary.programs + summary.remeasures  # a program promoted over the seed is measured again
    seen = {(e["result"]["provenance"]["slot"], e["result"]["provenance"]["cuda_visible_devices"]) for e in evs}
    assert seen == {("slot 0 [GPU 0,1]", "0,1"), ("slot 1 [GPU 2,3]", "2,3")}
    starts = [e.data for e in bus.history("evaluation_progress") if e.data.get("step") == "slot_start"]
    assert len(starts) == len(evs) and {d["gpus"] for d in starts} == {"0,1", "2,3"}
    assert sum(r["evaluations"] for r in ex.slot_table()) == len(evs)


class _Counting:
    """A simulated evaluator that records how many evaluations run at once across all slots."""

    live = 0
    most = 0
    lock = threading.Lock()

    def __init__(self, gpus: str) -> None:
        self.inner = SimulatedEvaluator(0, delay_s=0.15, visible_devices=gpus, check_l0=False)

    def evaluate(self, request: EvalRequest, progress: Progress | None = None) -> EvalResult:
        with _Counting.lock:
            _Counting.live += 1
            _Counting.most = max(_Counting.most, _Counting.live)
        try:
            return self.inner.evaluate(request, progress)
        finally:
            with _Counting.lock:
                _Counting.live -= 1


def test_slots_run_at_once_and_are_refilled_as_results_return(wl: Path) -> None:
    ex = SlotExecutor([LocalSlot(GpuSet(i, (str(i),)), _Counting) for i in range(4)], badge="simulated")
    futures = [ex.submit(_request(wl, f"r{i}")) for i in range(12)]
    results = [f.result(timeout=30) for f in futures]
    ex.shutdown()
    assert _Counting.most == 4 and all(r.passed for r in results)
    rows = ex.slot_table()
    assert sum(r["evaluations"] for r in rows) == 12 and all(r["evaluations"] >= 1 for r in rows)
    assert all(r["per_hour"] > 0 and r["current"] == "" for r in rows)


class _Losing:
    """Loses (EvaluatorLost) the evaluations whose label is in ``lose`` on the slots whose GPU is in ``on``, the
    first ``times`` such calls across all slots; records which GPU sets evaluators were made for."""

    made: list[str] = []
    losses = 0

    def __init__(self, gpus: str, lose: set[str], on: set[str], times: int = 99) -> None:
        _Losing.made.append(gpus)
        self.gpus, self.lose, self.on, self.times = gpus, lose, on, times
        self.inner = SimulatedEvaluator(0, visible_devices=gpus, check_l0=False)

    def evaluate(self, request: EvalRequest, progress: Progress | None = None) -> EvalResult:
        if request.label in self.lose and self.gpus in self.on and _Losing.losses < self.times:
            _Losing.losses += 1
            raise EvaluatorLost(f"GPU {self.gpus} fell off the bus")
        return self.inner.evaluate(request, progress)


def _losing(n: int, lose: set[str], on: set[str], times: int = 99, **kw: Any) -> SlotExecutor:
    _Losing.made, _Losing.losses = [], 0
    return SlotExecutor([LocalSlot(GpuSet(i, (str(i),)), lambda g: _Losing(g, lose, on, times)) for i in range(n)],
                        badge="simulated", **kw)


def test_a_lost_evaluation_is_retried_on_another_slot(wl: Path) -> None:
    ex = _losing(3, {"x"}, {"0", "1", "2"}, times=1)  # lost on whichever slot takes it first, once
    seen: list[dict[str, Any]] = []
    res = ex.submit(_request(wl, "x"), seen.append).result(timeout=30)
    ex.shutdown()
    first = next(d for d in seen if d["step"] == "slot_lost")
    assert res.passed and res.provenance["lost_before"] == [f"{first['slot_label']}: GPU {first['gpus']} fell off "
                                                            "the bus"]
    assert res.provenance["slot"] != first["slot_label"] and first["retry"] is True
    assert [d["attempt"] for d in seen if d["step"] == "slot_start"] == [1, 2]
    assert _Losing.made.count(first["gpus"]) == 2  # the slot that lost its evaluator made a fresh one


def test_an_evaluation_lost_twice_is_an_infrastructure_error_not_a_candidate_failure(wl: Path) -> None:
    ex = _losing(2, {"bad"}, {"0", "1"})
    seen: list[dict[str, Any]] = []
    bad = ex.submit(_request(wl, "bad"), seen.append).result(timeout=30)
    good = ex.submit(_request(wl, "good")).result(timeout=30)
    ex.shutdown()
    assert good.passed
    assert bad.verdict == "error" and bad.provenance["infrastructure_error"] is True
    assert "infrastructure error, not the candidate" in bad.reason and len(bad.provenance["lost"]) == 2
    lost = [d for d in seen if d["step"] == "slot_lost"]
    assert [d["retry"] for d in lost] == [True, False] and {d["slot"] for d in lost} == {0, 1}
    # what the LLM is shown as failures of earlier candidates leaves it out
    pop = Population()
    pop.add_row({"id": 1, "code": "x", "source": "design_space", "name": "n", "parent_id": None, "island": 0,
                 "generation": 1})
    pop.set_result(1, bad.to_dict(), 1)
    assert pop.failures(5) == []


def test_a_slot_lost_again_and_again_is_retired(wl: Path) -> None:
    class Patient(_Losing):  # slot 1 waits until slot 0 has lost twice, so slot 0 is sure to take work
        def evaluate(self, request: EvalRequest, progress: Progress | None = None) -> EvalResult:
            deadline = time.monotonic() + 10
            while _Losing.losses < 2 and time.monotonic() < deadline:
                time.sleep(0.005)
            return super().evaluate(request, progress)

    _Losing.made, _Losing.losses = [], 0
    lose = {f"r{i}" for i in range(6)}
    ex = SlotExecutor([LocalSlot(GpuSet(0, ("0",)), lambda g: _Losing(g, lose, {"0"})),
                       LocalSlot(GpuSet(1, ("1",)), lambda g: Patient(g, lose, {"0"}))], badge="simulated",
                      retire_after=2)
    results = [f.result(timeout=30) for f in [ex.submit(_request(wl, f"r{i}")) for i in range(6)]]
    ex.shutdown()
    assert all(r.passed and r.provenance["cuda_visible_devices"] == "1" for r in results)
    rows = ex.slot_table()
    assert rows[0]["retired"] and rows[0]["lost"] == 2 and rows[1]["evaluations"] == 6


def _engine(wl: Path, db: Path) -> SearchEngine:
    ex = local_executor(EvaluatorSpec("simulated", {"seed": 4, "delay_s": 0.02}), ["0", "1", "2"], 1, "nccl")
    cfg = SearchConfig(seed=7, proposals_per_generation=4, budget=BudgetConfig(generations=3))
    return SearchEngine(wl, Store(db), ex, [DesignSpaceSource()], cfg, executor=ex)


def _record(db: Path) -> dict[str, Any]:
    with Store(db, readonly=True) as st:
        programs = [(p["id"], p["code_hash"], p["generation"], p["parent_id"]) for p in st.programs(1)]
        evs = st.evaluations(run_id=1)
        done = sorted((e["program_id"], e["median_ms"]) for e in evs if e["status"] == "done")
        return {"programs": programs, "done": done, "runs": len(st.runs()), "state": st.run(1)["state"]}


def test_driver_killed_with_kill_9_resumes_with_nothing_lost_or_repeated(wl: Path, tmp_path: Path) -> None:
    ref = tmp_path / "ref.db"
    _engine(wl, ref).run()
    expected = _record(ref)
    db = tmp_path / "run.db"
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the driver, stopped just before its 6th commit (slots busy) and killed there
        try:
            os.close(r)
            finish, calls = Store.finish_evaluation, [0]

            def pause(self: Store, *a: Any, **k: Any) -> Any:
                calls[0] += 1
                if calls[0] == 6:
                    os.write(w, b"P")
                    time.sleep(60)
                return finish(self, *a, **k)

            Store.finish_evaluation = pause  # type: ignore[method-assign]
            _engine(wl, db).run()
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        assert f.read(1) == b"P", "the driver ended before the kill point"
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    before = _record(db)
    assert before["state"] == "running" and len(before["done"]) == 5 < len(expected["done"])
    _engine(wl, db).run()
    after = _record(db)
    assert after == expected  # every program evaluated exactly once, the same results as without the kill
    with Store(db, readonly=True) as st:
        reruns = [e for e in st.evaluations(run_id=1) if e["status"] == "interrupted"]
    assert reruns, "the kill left no evaluation in flight: nothing was tested"


def test_cli_gpus_with_the_simulated_evaluator_and_its_refusals(wl: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture) -> None:
    args = ["search", str(wl), "--generations", "1", "--db", str(tmp_path / "c.db"), "--evaluator", "simulated",
            "--gpus", "0,1,2,3", "--ranks", "2", "--backend", "symm"]
    assert main(args) == 0
    out = capsys.readouterr().out
    starts = re.findall(r"^slot (\d) \[GPU (\d)\] evaluates program \d+ .*\[\d+ done, \d+/h\]$", out, re.M)
    with Store(tmp_path / "c.db", readonly=True) as st:
        evs = st.evaluations(run_id=1)
    assert len(starts) == len(evs) > 1 and all(a == b for a, b in starts)
    assert {e["result"]["provenance"]["cuda_visible_devices"] for e in evs} == {b for _, b in starts}
    for bad, why in ((["--gpus", "0,0"], "named twice"), (["--executor", "ray", "--gpus", "0"], "--gpus applies"),
                     (["--ray-address", "auto"], "needs --executor ray")):
        assert main(args[:8] + bad) == 2
        err = capsys.readouterr().err
        assert why in err and len(err.strip().splitlines()) == 1


def test_slot_board_lines_and_rows() -> None:
    bus = EventBus()
    board = SlotBoard()
    lines: list[str | None] = []
    bus.subscribe(lambda e: lines.append(board.on_event(e)))
    bus.publish("evaluation_started", evaluation_id=1, program_id=5, world_size=1, backend="nccl", badge="real",
                name="two-stream")
    base = {"slot": 1, "slot_label": "slot 1 [GPU 2]", "gpus": "2"}
    bus.publish("evaluation_progress", evaluation_id=1, program_id=5, step="slot_start", attempt=1, **base)
    assert board.rows()[0]["program_id"] == 5
    bus.publish("evaluation_progress", evaluation_id=1, program_id=5, step="slot_done", seconds=0.4,
                slot_evaluations=1, per_hour=9000.0, **base)
    bus.publish("evaluation_progress", evaluation_id=2, program_id=5, step="slot_lost", reason="actor died",
                retry=True, **base)
    assert [x for x in lines if x] == ["slot 1 [GPU 2] evaluates program 5 (two-stream) [0 done, 0/h]",
                                       "slot 1 [GPU 2] LOST program 5 (two-stream): actor died; retried on another "
                                       "slot"]
    row = board.rows()[0]
    assert row["evaluations"] == 1 and row["per_hour"] == 9000.0 and row["lost"] == 1 and row["program_id"] is None
    assert board.total_per_hour() == 9000.0


def test_notebook_search_with_slots(wl: Path, tmp_path: Path) -> None:
    ex = local_executor(EvaluatorSpec("simulated", {"seed": 5}), ["0", "1"], 2, "symm")
    engine, store = workbench.new_search(wl, ex, db=tmp_path / "nb.db", gate="auto", generations=1, executor=ex)
    try:
        summary = engine.run()
        slots = {e["result"]["provenance"]["slot"] for e in store.evaluations(run_id=summary.run_id)}
    finally:
        store.close()
    assert summary.state == "finished" and summary.badge == "simulated" and slots <= {"slot 0 [GPU 0]",
                                                                                       "slot 1 [GPU 1]"}


def test_ray_is_the_optional_cluster_extra_and_in_dev() -> None:
    root = Path(__file__).resolve().parents[3]
    extras = tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(r.startswith("ray") for r in extras["cluster"]) and any(r.startswith("ray") for r in extras["dev"])
    assert '".[${extras}]"' in (root / "scripts" / "setup-env.sh").read_text()  # setup-env.sh cluster
