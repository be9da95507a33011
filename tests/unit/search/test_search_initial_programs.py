"""Several initial programs (`SearchConfig.initial_programs`, `cuco search --from A.cu --from B.cu`): each is
evaluated and placed in the population at generation 0, on an island of its own in turn. On the simulated
evaluator (a synthetic landscape, badged SIMULATED)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from cuco_kit.cli import main
from cuco_kit.errors import BadInput
from cuco_kit.evaluate.simulated import SimulatedEvaluator
from cuco_kit.events import EventBus
from cuco_kit.search.budget import BudgetConfig
from cuco_kit.search.config import SearchConfig
from cuco_kit.search.design_space import DesignSpaceSource
from cuco_kit.search.engine import SearchEngine
from cuco_kit.search.islands import IslandConfig
from cuco_kit.search.start_point import INITIAL_TAG
from cuco_kit.search.synthetic import BASELINE, write_synthetic_workload
from cuco_kit.store import Store

THREADS = "constexpr int kThreads = 256;"
PLACEMENT = "constexpr Placement kPlacement = Placement::kSequential;"


def variants(tmp_path: Path) -> tuple[Path, Path]:
    """Two starting programs a user might bring: other knob settings of the synthetic baseline."""
    b = tmp_path / "wide.cu"
    b.write_text(BASELINE.replace(THREADS, "constexpr int kThreads = 512;"))
    c = tmp_path / "fused.cu"
    c.write_text(BASELINE.replace(PLACEMENT, "constexpr Placement kPlacement = Placement::kFused;     "))
    return b, c


def engine(tmp_path: Path, db: str, initial: list[str], generations: int = 1) -> tuple[SearchEngine, Store]:
    wl = tmp_path / "wl"
    if not wl.exists():
        write_synthetic_workload(wl)
    cfg = SearchConfig(seed=2, budget=BudgetConfig(generations=generations), islands=IslandConfig(islands=3),
                       initial_programs=initial)
    cfg.phases.explore.mix = {"design_space": 1.0}
    cfg.phases.exploit.mix = {"design_space": 1.0}
    store = Store(tmp_path / db)
    return SearchEngine(wl, store, SimulatedEvaluator(seed=2), [DesignSpaceSource()], cfg, EventBus()), store


def test_each_initial_program_is_evaluated_at_generation_zero_on_its_own_island(tmp_path: Path) -> None:
    b, c = variants(tmp_path)
    eng, store = engine(tmp_path, "init.db", [str(b), str(c)])
    with store:
        summary = eng.run()
        progs = {p["id"]: p for p in store.programs(summary.run_id)}
        gen0 = [p for p in progs.values() if p["generation"] == 0]
        initial = [p for p in gen0 if INITIAL_TAG in p["tags"]]
        assert [p["code"] for p in initial] == [b.read_text(), c.read_text()]
        assert [p["island"] for p in initial] == [1, 2] and all(p["parent_id"] is None for p in initial)
        assert [p["name"] for p in initial] == ["initial program (wide.cu)", "initial program (fused.cu)"]
        assert {p["source"] for p in gen0} == {"seed", "baseline", "human"}
        for p in initial:
            (ev,) = store.evaluations(program_id=p["id"])
            assert ev["status"] == "done" and ev["result"]["verdict"] in ("pass", "fail")
        # In the population: members (and possible parents) of their islands, not of the others.
        assert {p.id for p in eng.population.island_members(1)} & {p["id"] for p in initial} == {initial[0]["id"]}
        assert {p.id for p in eng.population.island_members(2)} & {p["id"] for p in initial} == {initial[1]["id"]}
        assert eng.population.get(initial[0]["id"]).evaluated
        n = len(progs)
    # Resumed with a larger budget: the initial programs are not added (nor evaluated) again.
    eng2, store2 = engine(tmp_path, "init.db", [str(b), str(c)], generations=2)
    with store2:
        again = eng2.run()
        assert again.run_id == summary.run_id
        rows = store2.programs(again.run_id)
        assert len([p for p in rows if INITIAL_TAG in p["tags"]]) == 2 and len(rows) >= n
        for p in rows:
            if INITIAL_TAG in p["tags"]:
                assert len(store2.evaluations(program_id=p["id"])) == 1


def test_a_bad_initial_program_is_refused_before_anything_is_stored(tmp_path: Path) -> None:
    bad = tmp_path / "plain.cu"
    bad.write_text("__global__ void k() {}\n")
    eng, store = engine(tmp_path, "bad.db", [str(bad)])
    with store, pytest.raises(BadInput, match="no EVOLVE blocks"):
        eng.run()
    with Store(tmp_path / "bad.db") as s:
        assert s.runs() == []


def test_cli_from_twice_starts_from_both(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    wl = write_synthetic_workload(tmp_path / "wl")
    b, c = variants(tmp_path)
    db = tmp_path / "cli.db"
    args = ["search", str(wl), "--generations", "1", "--db", str(db), "--seed", "2", "--evaluator", "simulated",
            "--json", "--from", str(b), "--from", str(c)]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    with Store(db) as s:
        run = s.run(out["run_id"])
        assert run["config"]["initial_programs"] == [str(c)]
        progs = s.programs(out["run_id"])
        baseline = next(p for p in progs if p["source"] == "baseline")
        assert baseline["code"] == b.read_text()  # the first --from is the root, as with one
        (extra,) = [p for p in progs if INITIAL_TAG in p["tags"]]
        assert extra["code"] == c.read_text() and extra["generation"] == 0 and extra["island"] == 1
        assert len(s.evaluations(program_id=extra["id"])) == 1
    bad = tmp_path / "plain.cu"
    bad.write_text("__global__ void k() {}\n")
    args2 = args[:-1] + [str(bad)]
    args2[args2.index("--db") + 1] = str(tmp_path / "bad.db")
    assert main(args2) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--from" in err and "plain.cu" in err and not (tmp_path / "bad.db").exists()
