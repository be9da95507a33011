"""Programs measured again beside the seed before they are promoted (search/remeasure.py): the run's best
announced over the seed and every migrant. Searches run on the SIMULATED evaluator (a made-up landscape, badged
SIMULATED): a NOISY one, where true differences (a few per cent) are smaller than one evaluation's noise, so the
best measured program is often only the luckiest."""
from __future__ import annotations

import logging
from pathlib import Path

import pytest

from cuco_kit.errors import BadInput
from cuco_kit.evaluate.simulated import SimulatedEvaluator
from cuco_kit.events import EventBus
from cuco_kit.search import remeasure
from cuco_kit.search.budget import BudgetConfig
from cuco_kit.search.config import SearchConfig
from cuco_kit.search.design_space import DesignSpaceConfig, DesignSpaceSource
from cuco_kit.search.engine import SearchEngine
from cuco_kit.search.islands import IslandConfig
from cuco_kit.search.population import Population, ProgramView
from cuco_kit.search.synthetic import write_synthetic_workload
from cuco_kit.store import Store

SEEDS = range(6)


@pytest.fixture(scope="module")
def workload(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic_workload(tmp_path_factory.mktemp("remeasure") / "wl")


def noisy(seed: int) -> SimulatedEvaluator:
    """Knob effects of ~3% against 10% noise per timed iteration; the baseline as fast as the seed."""
    return SimulatedEvaluator(seed=seed, noise=0.10, effect=0.03, interaction=0.01, baseline_factor=1.0,
                              fail_rate=0.0)


def config(seed: int, on: bool, **kw: object) -> SearchConfig:
    cfg = SearchConfig(seed=seed, proposals_per_generation=6, timeline="off", **kw)  # type: ignore[arg-type]
    if "budget" not in kw:
        cfg.budget = BudgetConfig(generations=6)
    if "islands" not in kw:
        cfg.islands = IslandConfig(islands=3, migration_interval=1)
    cfg.phases.explore.mix = {"design_space": 1.0}
    cfg.phases.exploit.mix = {"design_space": 1.0}
    cfg.remeasure.bests = cfg.remeasure.migrants = on
    return cfg


def search(workload: Path, store: Store, cfg: SearchConfig, evaluator: SimulatedEvaluator,
           bus: EventBus | None = None) -> SearchEngine:
    # The random sampler keeps these runs short (the GP sampler's fits dominate otherwise).
    source = DesignSpaceSource(DesignSpaceConfig(sampler="random"))
    eng = SearchEngine(workload, store, evaluator, [source], cfg, bus if bus is not None else EventBus())
    eng.run()
    return eng


def false_elites(workload: Path, seed: int, on: bool) -> tuple[int, int]:
    """(programs announced as faster than the seed or migrated whose TRUE time is not below the seed's, the
    run's re-measures)."""
    ev = noisy(seed)
    bus = EventBus()
    with Store(":memory:") as store:
        eng = search(workload, store, config(seed, on), ev, bus)
        moves = store.get_meta(eng._rid, "state")["migrations"]
        remeasures = eng.summary().remeasures
    promoted = {e.data["program_id"] for e in bus.history("new_best") if e.data["speedup"] > 1.0}
    promoted |= {m["program_id"] for m in moves}
    seed_ms = ev.true_ms({}, "", 1)
    progs = eng.population.programs
    false = [pid for pid in promoted if ev.true_ms(progs[pid].knobs, progs[pid].code, 1) >= seed_ms]
    return len(false), remeasures


def test_measuring_again_promotes_fewer_false_elites_on_a_noisy_landscape(workload: Path) -> None:
    logging.disable(logging.WARNING)  # every refused promotion logs a warning; not the point here
    try:
        off = [false_elites(workload, s, on=False) for s in SEEDS]
        on = [false_elites(workload, s, on=True) for s in SEEDS]
    finally:
        logging.disable(logging.NOTSET)
    f_off, f_on = sum(f for f, _ in off), sum(f for f, _ in on)
    assert all(n == 0 for _, n in off) and all(n > 0 for _, n in on)  # re-measures happen only when on
    assert f_off >= len(SEEDS)  # the landscape is noisy enough to fool a single measurement
    assert f_on * 4 <= f_off, (off, on)  # and measuring again catches most of it


def test_a_remeasure_is_an_evaluation_of_the_run_counted_in_its_budget(workload: Path) -> None:
    bus = EventBus()
    cfg = config(2, True, budget=BudgetConfig(generations=100, evaluations=30))
    with Store(":memory:") as store:
        eng = search(workload, store, cfg, noisy(2), bus)
        s = eng.summary()
        evs = store.evaluations(run_id=eng._rid)
        tagged = [e for e in evs if "remeasure" in e["request"]]
        state = store.get_meta(eng._rid, "state")
    assert "evaluation budget reached" in s.reason and 30 <= s.evaluations < 30 + cfg.proposals_per_generation
    assert s.remeasures == len(tagged) > 0 and s.evaluations == len(evs)
    for e in tagged:  # measured beside the seed, on inputs and noise of its own
        tag = e["request"]["remeasure"]
        assert tag["purpose"] in ("best", "migrant") and tag["claimed"] > 1.0
        assert e["request"]["measure_seed"] and e["request"]["seed"] != cfg.seed
        assert e["result"]["speedup_ci"] is not None
    started = [e.data for e in bus.history("evaluation_started") if e.data.get("remeasure")]
    finished = [e.data for e in bus.history("evaluation_finished") if e.data.get("remeasure")]
    assert len(started) == len(finished) == s.remeasures
    logs = [e.data["message"] for e in bus.history("log")]
    assert sum("measured again before" in m for m in logs) == s.remeasures
    # The state keeps each verdict; a program held back is never the best nor a migrant.
    verdicts = {v["program_id"]: v for v in state["remeasures"]}
    assert set(verdicts) == {e["program_id"] for e in tagged}
    held_back = {pid for pid, v in verdicts.items() if not v["held"]}
    assert held_back == eng.population.held_back
    assert s.held_back == len(held_back)
    assert not held_back & {m["program_id"] for m in state["migrations"]}
    best = eng.population.best()
    assert best is None or best.id not in held_back
    for m in state["refused_migrations"]:
        assert m["reason"] and m["program_id"] not in {x["program_id"] for x in state["migrations"]
                                                       if x["to"] == m["to"]}


def test_an_announced_best_over_the_seed_held_when_measured_again(workload: Path) -> None:
    bus = EventBus()
    with Store(":memory:") as store:
        eng = search(workload, store, config(4, True), noisy(4), bus)
        evs = store.evaluations(run_id=eng._rid)
    for e in bus.history("new_best"):
        if e.data["speedup"] > 1.0:
            pid = e.data["program_id"]
            (check,) = [x for x in evs if x["program_id"] == pid and "remeasure" in x["request"]]
            assert e.data["evaluation_id"] == check["id"]  # announced on the re-measured numbers
            assert check["result"]["speedup_ci"][0] > 1.0  # the interval rule of search/target.py


def test_a_migrant_that_does_not_hold_is_not_copied_and_the_log_says_so(workload: Path) -> None:
    bus = EventBus()
    with Store(":memory:") as store:
        eng = search(workload, store, config(5, True), noisy(5), bus)
        state = store.get_meta(eng._rid, "state")
    refused = state["refused_migrations"]
    assert refused, "this landscape's islands always have a migrant that does not hold"
    logs = [e.data["message"] for e in bus.history("log")]
    for m in refused:
        assert any(f"program {m['program_id']} island {m['from']}->{m['to']} not copied" in line for line in logs)
        assert m["program_id"] not in eng.population.extra_members.get(m["to"], set())


def test_resume_rebuilds_the_verdicts_and_measures_no_program_twice(workload: Path, tmp_path: Path) -> None:
    db = tmp_path / "resume.db"
    with Store(db) as store:
        first = search(workload, store, config(3, True, budget=BudgetConfig(generations=3)), noisy(3))
        held_back = set(first.population.held_back)
        verdicts = set(first._verdicts)
    assert verdicts
    with Store(db) as store:
        eng = SearchEngine(workload, store, noisy(3), [DesignSpaceSource(DesignSpaceConfig(sampler="random"))],
                           config(3, True, budget=BudgetConfig(generations=6)), EventBus())
        eng._setup()
        assert eng.population.held_back == held_back and set(eng._verdicts) == verdicts
        eng.run()
        evs = store.evaluations(run_id=eng._rid)
    again = [e["program_id"] for e in evs if "remeasure" in e["request"]]
    assert len(again) == len(set(again))  # a verdict stands: no program is measured again twice


def test_the_replay_evaluator_cannot_measure_again_so_promotions_go_as_before() -> None:
    assert not remeasure.supported("replayed") and not remeasure.supported("unmeasured")
    assert remeasure.supported("real") and remeasure.supported("simulated")


def test_the_rule_is_the_interval_clear_of_the_seed() -> None:
    def view(result: dict, fitness: float | None) -> ProgramView:
        return ProgramView(id=7, code="", parent_id=None, source="design_space", result=result, fitness=fitness)

    ok = remeasure.judge(view({"verdict": "pass", "speedup_ci": [1.01, 1.2]}, 1.1), purpose="best", claimed=1.15,
                         evaluation_id=3)
    assert ok.held and "clear of the seed" in ok.reason and "claimed 1.150x" in ok.reason
    close = remeasure.judge(view({"verdict": "pass", "speedup_ci": [0.99, 1.2]}, 1.1), purpose="migrant",
                            claimed=1.15, evaluation_id=3)
    assert not close.held and "not clear of the seed" in close.reason
    no_ci = remeasure.judge(view({"verdict": "pass"}, 1.05), purpose="best", claimed=None, evaluation_id=None)
    assert no_ci.held and "no interval" in no_ci.reason
    failed = remeasure.judge(view({"verdict": "fail", "level_reached": "L2"}, None), purpose="best", claimed=1.2,
                             evaluation_id=4)
    assert not failed.held and "did not pass" in failed.reason
    pop = Population()
    pop.add(view({"verdict": "pass"}, 1.3))
    assert remeasure.claims(pop.programs[7])
    pop.held_back.add(7)
    assert pop.best() is None and pop.top(3) == [] and pop.scored()  # still a possible parent
    with pytest.raises(BadInput, match="remeasure.iters"):
        remeasure.RemeasureConfig(iters=1)
