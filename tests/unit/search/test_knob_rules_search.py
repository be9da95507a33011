"""The offline sources and knob rules: neither the uniform random source nor the Optuna design-space source ever
proposes a point that breaks a rule of the knob block; both still reach every valid point, and a refused point is
logged with the rule that refused it."""
from __future__ import annotations

import itertools
import logging
import random

import pytest

from cuco_kit.search.design_space import DesignSpaceConfig, DesignSpaceSource, RandomKnobSource
from cuco_kit.search.phases import PhaseConfig
from cuco_kit.search.population import Population, ProgramView
from cuco_kit.search.proposal import ProposalContext
from cuco_kit.search.synthetic import BASELINE
from cuco_kit.source import knob_rules, markers, static_check

# The synthetic baseline (96 points) with one rule: 72 points keep it, the baseline's among them.
RULED = BASELINE.replace("// EVOLVE-BLOCK-END", "// knob-rule: kThreads * kChunks <= 1024\n// EVOLVE-BLOCK-END", 1)
RULES = knob_rules.rules(RULED)
NAMES = [k.name for k in markers.knobs(RULED)]


def _values(code: str) -> dict[str, str]:
    return {k.name: k.value for k in markers.knobs(code)}


def _valid_points() -> set[tuple[str, ...]]:
    ks = markers.knobs(RULED)
    return {combo for combo in itertools.product(*(k.allowed for k in ks))
            if knob_rules.is_valid(RULES, dict(zip(NAMES, combo)))}


def _ctx(pop: Population, parent: ProgramView, n: int, seed: int) -> ProposalContext:
    return ProposalContext(run_id=1, generation=1, island=0, parent=parent, population=pop,
                           phase=PhaseConfig().explore, rng=random.Random(seed), kind="design_space", seed=seed, n=n)


def _root() -> tuple[Population, ProgramView]:
    pop = Population()
    root = pop.add(ProgramView(id=1, code=RULED, parent_id=None, source="baseline", knobs=_values(RULED)))
    return pop, root


def _exhaust(source: object) -> set[tuple[str, ...]]:
    """Every point `source` proposes from the root until it has nothing new, each checked on the way."""
    pop, root = _root()
    seen = {tuple(_values(RULED)[n] for n in NAMES)}
    for i in itertools.count():
        props = source.propose(_ctx(pop, root, n=5, seed=i))  # type: ignore[attr-defined]
        if not props:
            return seen
        for p in props:
            values = _values(p.code)
            assert knob_rules.violated(RULES, values) == [], values
            assert static_check.check_candidate(p.code, RULED).ok
            point = tuple(values[n] for n in NAMES)
            assert point not in seen
            seen.add(point)
            pop.add(ProgramView(id=len(pop) + 1, code=p.code, parent_id=1, source="design_space", knobs=values,
                                result={"verdict": "pass"}, fitness=1.0 + len(seen) % 7 / 10))
        assert i < 96


def test_the_random_source_proposes_every_valid_point_and_no_other() -> None:
    assert len(_valid_points()) == knob_rules.count_valid(RULED).valid == 72
    assert _exhaust(RandomKnobSource()) == _valid_points()


@pytest.mark.parametrize("sampler", ["random", "tpe"])
def test_the_design_space_source_proposes_every_valid_point_and_no_other(sampler: str) -> None:
    pytest.importorskip("optuna")
    source = DesignSpaceSource(DesignSpaceConfig(sampler=sampler, n_startup_trials=2, max_asks=6))
    assert _exhaust(source) == _valid_points()


def test_refused_points_are_logged_with_the_rule(caplog: pytest.LogCaptureFixture) -> None:
    pytest.importorskip("optuna")
    pop, root = _root()
    with caplog.at_level(logging.INFO, logger="cuco_kit.search"):
        DesignSpaceSource(DesignSpaceConfig(sampler="random", max_asks=30)).propose(_ctx(pop, root, n=20, seed=4))
        RandomKnobSource().propose(_ctx(pop, root, n=60, seed=4))
    refused = [r.getMessage() for r in caplog.records if "refused before evaluation" in r.getMessage()]
    assert refused and all(m.endswith("knob rule 'kThreads * kChunks <= 1024' (line 12)") for m in refused)
    assert len(refused) == 2  # one line per source and rule, however many points the rule refused


def test_a_start_file_at_a_point_that_breaks_its_rule_is_one_line(tmp_path) -> None:
    from cuco_kit.errors import BadInput
    from cuco_kit.search.start_point import read_start

    ok = tmp_path / "ok.cu"
    ok.write_text(RULED)
    assert read_start(ok, "--from", "hint") == RULED
    bad = tmp_path / "bad.cu"
    bad.write_text(markers.set_knobs(RULED, {"kThreads": "512", "kChunks": "8"}))
    with pytest.raises(BadInput, match=r"^--from .*bad.cu: line 12: knob rule 'kThreads \* kChunks <= 1024' does "
                                       r"not hold at kThreads = 512, kChunks = 8, so its own point is invalid"):
        read_start(bad, "--from", "hint")
