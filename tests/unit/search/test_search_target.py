"""Stop at a target (`SearchConfig.target_ratio`, `cuco search --target`): the search ends once a program's
speed-up over the seed beats the target with its 95% interval clear of it. On the simulated evaluator (a
synthetic landscape, badged SIMULATED), whose results carry bootstrap intervals of the speed-up."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from cuco_kit.cli import main
from cuco_kit.errors import BadInput
from cuco_kit.evaluate.simulated import SimulatedEvaluator
from cuco_kit.events import EventBus
from cuco_kit.search import target
from cuco_kit.search.budget import BudgetConfig
from cuco_kit.search.config import SearchConfig
from cuco_kit.search.design_space import DesignSpaceSource
from cuco_kit.search.engine import SearchEngine, SearchSummary
from cuco_kit.search.population import ProgramView
from cuco_kit.search.synthetic import write_synthetic_workload
from cuco_kit.store import Store

GENERATIONS = 6


def search(tmp_path: Path, name: str, target_ratio: float | None) -> tuple[SearchSummary, list[dict]]:
    wl = tmp_path / "wl"
    if not wl.exists():
        write_synthetic_workload(wl)
    cfg = SearchConfig(seed=3, budget=BudgetConfig(generations=GENERATIONS), target_ratio=target_ratio)
    cfg.phases.explore.mix = {"design_space": 1.0}
    cfg.phases.exploit.mix = {"design_space": 1.0}
    with Store(tmp_path / f"{name}.db") as store:
        summary = SearchEngine(wl, store, SimulatedEvaluator(seed=3), [DesignSpaceSource()], cfg, EventBus()).run()
        evals = [e for e in store.evaluations(run_id=summary.run_id) if e["verdict"] == "pass"]
        programs = {p["id"]: p["source"] for p in store.programs(summary.run_id)}
    return summary, [{**e, "source": programs[e["program_id"]]} for e in evals if programs[e["program_id"]] != "seed"]


@pytest.fixture(scope="module")
def free_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, SearchSummary, list[dict]]:
    """A search with no target (its results show where the landscape's intervals lie), shared by the tests."""
    tmp = tmp_path_factory.mktemp("target")
    summary, evals = search(tmp, "free", None)
    return tmp, summary, evals


def interval(e: dict) -> tuple[float, float, float]:
    res = e["result"]
    return res["speedup"], res["speedup_ci"][0], res["speedup_ci"][1]


def test_a_program_clearing_the_target_ends_the_search_and_the_reason_says_so(free_run: tuple) -> None:
    tmp_path, free, evals = free_run
    assert free.generations == GENERATIONS and "target" not in free.reason
    best_lo = max(interval(e)[1] for e in evals)
    goal = round(best_lo - 0.1, 2)
    assert goal > 1.0
    first = next(e for e in evals if interval(e)[1] > goal)  # the first program (in evaluation order) to clear it
    stopped, _ = search(tmp_path, "stopped", goal)
    assert stopped.generations < GENERATIONS and stopped.state == "finished"
    assert stopped.reason.startswith(f"target reached: program {first['program_id']} ")
    assert f"clear of the target {goal:g}x" in stopped.reason and "95% interval" in stopped.reason


def test_a_ratio_above_the_target_whose_interval_is_not_clear_does_not_stop_it(free_run: tuple) -> None:
    tmp_path, _, evals = free_run
    # A program whose point estimate beats a target that its interval's lower bound does not.
    sp, lo, hi = max((interval(e) for e in evals), key=lambda t: t[0])
    goal = (sp + lo) / 2
    assert lo < goal < sp
    others = [e for e in evals if interval(e)[1] > goal]
    run, _ = search(tmp_path, "unclear", goal)
    if others:  # another program clears it: the reason names that one, never the unclear one
        assert run.reason.startswith(f"target reached: program {others[0]['program_id']} ")
    else:
        assert run.generations == GENERATIONS and "target" not in run.reason


def view(fitness: float | None, ci: list[float] | None) -> ProgramView:
    result = {"verdict": "pass", "speedup": fitness, "speedup_ci": ci}
    return ProgramView(7, "code", None, "design_space", name="p", result=result, fitness=fitness)


def test_clears_needs_the_lower_bound_above_the_target() -> None:
    assert target.clears(view(1.3, [1.15, 1.45]), 1.1) == 1.15
    assert target.clears(view(1.3, [1.15, 1.45]), 1.2) is None  # ratio above, interval not clear
    assert target.clears(view(1.3, None), 1.1) is None  # no interval: a median alone is no claim
    assert target.clears(view(None, [1.15, 1.45]), 1.1) is None  # failed or flagged: no fitness
    assert target.clears(view(1.05, [1.02, 1.08]), 1.1) is None


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf"), True])
def test_target_ratio_must_be_a_positive_number(bad: float) -> None:
    with pytest.raises(BadInput, match="target_ratio"):
        SearchConfig(target_ratio=bad)


def test_cli_target_stops_the_search_and_refuses_nonsense(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    wl = write_synthetic_workload(tmp_path / "wl")
    args = ["search", str(wl), "--generations", "6", "--db", str(tmp_path / "t.db"), "--seed", "3",
            "--evaluator", "simulated", "--json", "--target", "1.1"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["reason"].startswith("target reached: program ") and out["generations"] < 6
    with Store(tmp_path / "t.db") as s:
        assert s.runs()[0]["config"]["target_ratio"] == 1.1
    bad = args[:-1] + ["-1"]
    bad[bad.index("--db") + 1] = str(tmp_path / "bad.db")
    assert main(bad) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--target -1" in err and not (tmp_path / "bad.db").exists()
