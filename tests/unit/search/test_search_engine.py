"""The search engine end to end on the synthetic workload with the SIMULATED evaluator: seeded
reproducibility, islands and migration in a run, the manual gate not blocking, budgets, resume."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from cuco_kit.evaluate.api import EvalRequest, EvalResult
from cuco_kit.evaluate.simulated import SimulatedEvaluator
from cuco_kit.events import EventBus
from cuco_kit.llm.client import Completion
from cuco_kit.search.budget import BudgetConfig
from cuco_kit.search.config import SearchConfig
from cuco_kit.search.design_space import DesignSpaceSource
from cuco_kit.search.engine import SearchEngine
from cuco_kit.search.islands import IslandConfig
from cuco_kit.search.llm_source import LLMSource
from cuco_kit.search.synthetic import write_synthetic_workload
from cuco_kit.store import Store
from cuco_kit.workload import sample_workloads


@pytest.fixture(scope="module")
def workload(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic_workload(tmp_path_factory.mktemp("wl") / "synthetic")


def _run(workload: Path, store: Store, seed: int, generations: int = 4, **kw) -> SearchEngine:
    cfg = SearchConfig(seed=seed, budget=BudgetConfig(generations=generations), **kw)
    eng = SearchEngine(workload, store, SimulatedEvaluator(seed=7), [DesignSpaceSource()], cfg, EventBus())
    eng.run()
    return eng


def _sequence(store: Store, run_id: int) -> list[tuple]:
    return [(p["code_hash"], p["parent_id"], p["island"], p["generation"], p["source"])
            for p in store.programs(run_id)]


def test_same_seed_same_programs_other_seed_other_programs(workload: Path) -> None:
    a, b, c = Store(":memory:"), Store(":memory:"), Store(":memory:")
    ea, eb, ec = _run(workload, a, 11), _run(workload, b, 11), _run(workload, c, 12)
    assert len(_sequence(a, ea.run_id)) > 10
    assert _sequence(a, ea.run_id) == _sequence(b, eb.run_id)
    assert [e["median_ms"] for e in a.evaluations(ea.run_id)] == [e["median_ms"] for e in b.evaluations(eb.run_id)]
    assert _sequence(a, ea.run_id) != _sequence(c, ec.run_id)


def test_run_records_everything_and_crosses_placements(workload: Path) -> None:
    store = Store(":memory:")
    eng = _run(workload, store, 3, generations=5, islands=IslandConfig(islands=2, migration_interval=2))
    s = eng.summary()
    assert s.state == "finished" and s.generations == 5 and s.badge == "simulated"
    progs = store.programs(eng.run_id)
    assert [p["source"] for p in progs[:2]] == ["seed", "baseline"]
    evs = store.evaluations(run_id=eng.run_id)
    assert all(e["badge"] == "simulated" and e["status"] == "done" for e in evs)
    # every evaluated program has exactly one evaluation (and those promoted over the seed one re-measure each);
    # every proposal was decided with its program linked
    assert sorted(e["program_id"] for e in evs if "remeasure" not in e["request"]) == [p["id"] for p in progs]
    assert len({e["program_id"] for e in evs if "remeasure" in e["request"]}) == s.remeasures
    for prop in store.proposals(eng.run_id):
        assert prop["status"] in ("approved", "rejected")
        if prop["status"] == "approved":
            assert prop["program_id"] is not None and store.decisions(prop["id"])[0]["decided_by"] == "auto"
    placements = {p["knobs"].get("kPlacement") for p in progs if p["source"] == "design_space"}
    assert len(placements) >= 3  # not only chunk counts: structural variants are crossed
    assert {p["island"] for p in progs if p["source"] == "design_space"} == {0, 1}
    # children live on their parent's island unless the parent is a root or a migrant
    by_id = {p["id"]: p for p in progs}
    migrated = {m["program_id"] for m in store.get_meta(eng.run_id, "state")["migrations"]}
    assert migrated  # migration happened (generations 2 and 4)
    for p in progs:
        parent = by_id.get(p["parent_id"])
        if parent and parent["source"] == "design_space" and parent["id"] not in migrated:
            assert p["island"] == parent["island"]
    best = store.best(eng.run_id)
    assert best is not None and s.best_speedup is not None and s.best_speedup >= 1.0
    kinds = [e.kind for e in eng.events.history()]
    for k in ("proposal", "decision", "evaluation_started", "evaluation_finished", "new_best", "run_state"):
        assert k in kinds
    assert store.run(eng.run_id)["state"] == "finished"


def test_manual_gate_waits_and_engine_keeps_evaluating(workload: Path) -> None:
    store = Store(":memory:")
    cfg = SearchConfig(seed=5, gate="manual", max_pending=4, proposals_per_generation=2, idle_poll_s=0.02,
                       budget=BudgetConfig(generations=2))
    cfg.remeasure.bests = cfg.remeasure.migrants = False  # the counts below are one evaluation per approved program
    eng = SearchEngine(workload, store, SimulatedEvaluator(seed=1, delay_s=0.05), [DesignSpaceSource()], cfg,
                       EventBus())
    eng.start()
    deadline = time.time() + 20
    while len(eng.gate.pending_ids()) < 4 and time.time() < deadline:
        time.sleep(0.02)
    pending = eng.gate.pending_ids()
    assert len(pending) == 4  # two rounds proposed, nothing evaluated beyond seed and baseline
    assert len(store.evaluations(run_id=eng.run_id)) == 2
    assert all(p["status"] == "pending" for p in store.proposals(eng.run_id))
    assert eng.join(0.2) is False  # waiting for people, not finished
    first, second, third, fourth = pending
    eng.gate.decide(first, "approved")
    while len(store.evaluations(run_id=eng.run_id)) < 3 and time.time() < deadline:
        time.sleep(0.02)
    assert len(store.evaluations(run_id=eng.run_id)) == 3  # approved work is evaluated while others wait
    assert set(eng.gate.pending_ids()) == {second, third, fourth}
    edited = store.proposal(second)["code"].replace("gather_chunks<<<64,", "gather_chunks<<<128,")
    eng.gate.decide(second, "edited", code=edited)
    eng.gate.decide(third, "rejected", note="not this one")
    eng.gate.decide(fourth, "approved", by="alice")
    assert eng.join(20)
    assert eng.state == "finished", eng.reason
    props = {p["id"]: p for p in store.proposals(eng.run_id)}
    assert props[first]["status"] == "approved" and props[first]["decided_by"] == "user"
    assert props[second]["status"] == "edited" and props[second]["code"] == edited
    assert props[second]["original_code"] != edited
    assert props[third]["status"] == "rejected" and props[third]["note"] == "not this one"
    assert props[third]["program_id"] is None
    assert props[fourth]["decided_by"] == "alice"
    prog = store.program(props[second]["program_id"])
    assert prog["code"] == edited and "edited" in prog["tags"]
    assert len(store.evaluations(run_id=eng.run_id)) == 5


def test_generation_budget_and_wall_time_budget(workload: Path) -> None:
    store = Store(":memory:")
    eng = _run(workload, store, 1, generations=2, proposals_per_generation=3)
    assert eng.generation == 2 and max(p["generation"] for p in store.programs(eng.run_id)) == 2
    assert "generation budget" in eng.reason
    store2 = Store(":memory:")
    cfg = SearchConfig(seed=1, budget=BudgetConfig(generations=1000, wall_s=0.6))
    eng2 = SearchEngine(workload, store2, SimulatedEvaluator(seed=1, delay_s=0.05), [DesignSpaceSource()], cfg)
    t = time.monotonic()
    eng2.run()
    assert time.monotonic() - t < 30 and "wall-time" in eng2.reason  # 1000 generations would take far longer
    assert 0 < eng2.generation < 1000
    assert all(e["status"] == "done" for e in store2.evaluations(run_id=eng2.run_id))


class _PricedClient:
    """An LLMClient answering a valid diff at $0.40 a call (no network)."""

    def __init__(self) -> None:
        self.calls = 0

    def complete(self, messages, *, purpose, temperature=None, max_tokens=None):
        self.calls += 1
        text = (f"NAME: more blocks {self.calls}\nRATIONALE: r\nTAGS: grid\n<<<<<<< SEARCH\n    gather_chunks<<<64, "
                "kThreads, 0, stream>>>(x, y, n, c);\n=======\n"
                f"    gather_chunks<<<{64 + self.calls}, kThreads, 0, stream>>>(x, y, n, c);\n>>>>>>> REPLACE\n")
        return Completion(text=text, model="priced", prompt_tokens=10, completion_tokens=10, latency_s=0.0,
                          finish_reason="stop", dollars=0.40)


class _EvaluatorWithLLM(SimulatedEvaluator):
    """An evaluator that makes an evaluation-side LLM call ($0.25) through the ledger the engine binds."""

    def bind_ledger(self, ledger) -> None:
        self.ledger = ledger

    def evaluate(self, request: EvalRequest, progress=None) -> EvalResult:
        self.ledger.record(purpose="judge", model="priced", prompt_tokens=1, completion_tokens=1, latency_s=0.0,
                           dollars=0.25, ok=True, error=None, request_hash="x")
        return super().evaluate(request, progress)


def test_llm_dollar_budget_counts_evaluation_side_calls(workload: Path) -> None:
    store = Store(":memory:")
    client = _PricedClient()
    cfg = SearchConfig(seed=2, proposals_per_generation=1, budget=BudgetConfig(generations=50, llm_dollars=1.5))
    cfg.phases.explore.mix = cfg.phases.exploit.mix = {"diff": 1.0}
    cfg.novelty.enabled = False  # the scripted diffs differ in one number: the filter would drop them
    cfg.remeasure.bests = cfg.remeasure.migrants = False  # the sums below count one judged evaluation per program
    eng = SearchEngine(workload, store, _EvaluatorWithLLM(seed=1), [LLMSource(client)], cfg)
    eng.run()
    spent = store.llm_dollars(eng.run_id)
    # seed + baseline judged (0.50), then each generation: 0.40 proposal + 0.25 judge
    assert spent >= 1.5 and spent < 1.5 + 0.40 + 0.25 + 1e-9
    assert client.calls == 2  # the third proposal would start at $1.80 >= $1.50: refused by the budget
    assert "budget" in eng.reason and eng.generation < 50
    purposes = {c["purpose"] for c in store.llm_calls(eng.run_id)}
    assert {"search.mutate.diff", "judge"} <= purposes


@pytest.mark.parametrize("sample", sample_workloads(Path(__file__).resolve().parents[3]), ids=lambda p: p.name)
def test_offline_search_runs_on_the_real_sample_baselines(sample: Path) -> None:
    from cuco_kit.workload import load_workload

    wl = load_workload(sample)
    if not wl.baseline or not wl.path(wl.baseline).is_file():
        pytest.skip(f"{sample.name}: baseline {wl.baseline} not written yet")
    store = Store(":memory:")
    eng = _run(sample, store, 1, generations=1, backend="symm", world_size=2)
    progs = store.programs(eng.run_id)
    moved = [p for p in progs if p["source"] == "design_space"]
    assert moved and all(p["knobs"] for p in moved)
    evs = store.evaluations(run_id=eng.run_id)
    assert not [e for e in evs if e["level_reached"] == "L0" and e["verdict"] == "fail"], \
        [e["reason"] for e in evs]  # knob moves on the real baseline pass the real L0 check


def test_start_pause_resume_stop_from_another_thread(workload: Path) -> None:
    store = Store(":memory:")
    cfg = SearchConfig(seed=8, idle_poll_s=0.02, budget=BudgetConfig(generations=100))
    eng = SearchEngine(workload, store, SimulatedEvaluator(seed=1, delay_s=0.03), [DesignSpaceSource()], cfg,
                       EventBus())
    eng.start()  # returns at once
    deadline = time.time() + 20
    while len(store.evaluations(run_id=eng.run_id or 0)) < 4 and time.time() < deadline:
        time.sleep(0.02)
    eng.pause()
    while eng.state != "paused" and time.time() < deadline:
        time.sleep(0.02)
    assert eng.state == "paused" and store.run(eng.run_id)["state"] == "paused"
    n = len(store.evaluations(run_id=eng.run_id))
    time.sleep(0.3)
    assert len(store.evaluations(run_id=eng.run_id)) == n  # nothing new starts while paused
    eng.resume()
    while len(store.evaluations(run_id=eng.run_id)) <= n and time.time() < deadline:
        time.sleep(0.02)
    assert len(store.evaluations(run_id=eng.run_id)) > n
    eng.stop()
    assert eng.join(10)
    assert eng.state == "stopped" and store.run(eng.run_id)["state"] == "stopped"
    assert all(e["status"] == "done" for e in store.evaluations(run_id=eng.run_id))  # in-flight work committed
    states = [e.data["state"] for e in eng.events.history("run_state")]
    assert states[:3] == ["running", "paused", "running"] and states[-1] == "stopped"
