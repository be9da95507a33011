"""RandomKnobSource: uniform random points of the knob block, without repeats, seeded, in the one diff format;
and a whole search driven by it (the baseline benchmarks/search compares the design-space search against)."""
from __future__ import annotations

import itertools
import random
from pathlib import Path

from cuco_kit.evaluate.simulated import SimulatedEvaluator
from cuco_kit.events import EventBus
from cuco_kit.search.budget import BudgetConfig
from cuco_kit.search.config import SearchConfig
from cuco_kit.search.design_space import RandomKnobSource
from cuco_kit.search.engine import SearchEngine
from cuco_kit.search.phases import PhaseConfig
from cuco_kit.search.population import Population, ProgramView
from cuco_kit.search.proposal import ProposalContext
from cuco_kit.search.synthetic import BASELINE, KNOB_SETS, write_synthetic_workload
from cuco_kit.source import markers, static_check
from cuco_kit.store import Store

SPACE = 1
for _values in KNOB_SETS.values():
    SPACE *= len(_values)


def _values(code: str) -> dict[str, str]:
    return {k.name: k.value for k in markers.knobs(code)}


def _ctx(pop: Population, parent: ProgramView, n: int, seed: int) -> ProposalContext:
    return ProposalContext(run_id=1, generation=1, island=0, parent=parent, population=pop,
                           phase=PhaseConfig().explore, rng=random.Random(seed), kind="design_space", seed=seed, n=n)


def _root() -> tuple[Population, ProgramView]:
    pop = Population()
    root = pop.add(ProgramView(id=1, code=BASELINE, parent_id=None, source="baseline", knobs=_values(BASELINE)))
    return pop, root


def _points(props: list) -> list[tuple[str, ...]]:
    return [tuple(_values(p.code)[n] for n in sorted(KNOB_SETS)) for p in props]


def test_random_points_are_valid_distinct_seeded_and_in_the_diff_format() -> None:
    pop, root = _root()
    a = RandomKnobSource().propose(_ctx(pop, root, n=6, seed=5))
    b = RandomKnobSource().propose(_ctx(pop, root, n=6, seed=5))
    c = RandomKnobSource().propose(_ctx(pop, root, n=6, seed=6))
    assert len(a) == 6 and len(set(_points(a))) == 6
    assert _points(a) == _points(b)  # same RNG seed, same points
    assert _points(a) != _points(c)
    for p in a:
        assert p.source == "design_space" and "random" in p.tags and p.parent_id == 1
        assert static_check.check_candidate(p.code, BASELINE).ok  # in-set values, frozen bytes kept
        assert all(v in KNOB_SETS[n] for n, v in _values(p.code).items())
        assert _values(p.code) != _values(BASELINE)
        assert p.diff.startswith("--- parent") and "+constexpr" in p.diff


def test_random_never_repeats_and_covers_the_whole_space() -> None:
    pop, root = _root()
    src = RandomKnobSource()
    seen = {tuple(_values(BASELINE)[n] for n in sorted(KNOB_SETS))}
    for i in itertools.count():
        props = src.propose(_ctx(pop, root, n=7, seed=i))
        if not props:
            break
        for pt, p in zip(_points(props), props):
            assert pt not in seen
            seen.add(pt)
            pop.add(ProgramView(id=len(pop) + 1, code=p.code, parent_id=1, source="design_space",
                                knobs=_values(p.code)))
        assert i < SPACE  # it must run dry once the space is used up
    assert len(seen) == SPACE  # every point reached, none twice


def test_random_falls_back_to_a_root_when_the_parent_has_no_knob_block() -> None:
    pop, root = _root()
    seedish = pop.add(ProgramView(id=2, code="// no knobs here\nint x;\n", parent_id=None, source="seed"))
    props = RandomKnobSource().propose(_ctx(pop, seedish, n=3, seed=1))
    assert len(props) == 3 and all(p.parent_id == root.id for p in props)


def test_a_search_driven_by_random_sampling_spends_its_evaluation_budget(tmp_path: Path) -> None:
    wl = write_synthetic_workload(tmp_path / "synthetic")
    store = Store(":memory:")
    cfg = SearchConfig(seed=3, budget=BudgetConfig(generations=1000, evaluations=20))
    cfg.phases.explore.mix = {"design_space": 1.0}
    cfg.phases.exploit.mix = {"design_space": 1.0}
    eng = SearchEngine(wl, store, SimulatedEvaluator(seed=7), [RandomKnobSource()], cfg, EventBus())
    s = eng.run()
    assert s.state == "finished" and "evaluation budget" in s.reason
    progs = store.programs(eng.run_id)
    randoms = [p for p in progs if "random" in (p["tags"] or [])]
    assert 20 <= s.evaluations < 20 + cfg.proposals_per_generation
    # everything but the seed, the baseline and the re-measures of programs promoted over the seed
    assert len(randoms) == s.evaluations - 2 - s.remeasures
    points = {tuple(sorted(p["knobs"].items())) for p in progs if p["source"] != "seed"}
    assert len(points) == s.evaluations - 1 - s.remeasures  # no knob point evaluated twice
    assert len({p["knobs"]["kPlacement"] for p in randoms}) >= 2
