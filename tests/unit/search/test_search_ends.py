"""A search ends on its own when it has nothing new to propose: an offline search of a knob space with 72 valid
points (96 before its knob rule) with --generations 400 stops once every valid point is evaluated, never one that
breaks the rule ("design space exhausted"), and a search whose
LLM keeps bringing nothing new stops after `max_empty_generations` such generations; the counts a search takes
have upper bounds."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from cuco_kit.cli import main
from cuco_kit.commands import search as search_command
from cuco_kit.evaluate.simulated import SimulatedEvaluator
from cuco_kit.search.budget import BudgetConfig
from cuco_kit.search.config import SearchConfig
from cuco_kit.search.design_space import DesignSpaceConfig, DesignSpaceSource
from cuco_kit.search.engine import SearchEngine
from cuco_kit.search.proposal import Proposal, ProposalContext
from cuco_kit.search.synthetic import write_synthetic_workload
from cuco_kit.source import knob_rules, markers
from cuco_kit.store import Store

# The synthetic baseline's 96 points less those where threads x chunks pass 1024 (256 x 8, 512 x 4, 512 x 8, for
# each of 4 placements and 2 issuers): 72 valid points.
RULE = "// knob-rule: kThreads * kChunks <= 1024\n"


def test_an_offline_search_of_72_valid_points_ends_with_design_space_exhausted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Through `cuco search` (in this process), with the random sampler to keep it short: which sampler asks
    does not matter to the end, since the source walks the untried points itself when its sampler has none."""
    wl = write_synthetic_workload(tmp_path / "wl")
    code = (wl / "baseline.cu").read_text()
    code = code.replace("// EVOLVE-BLOCK-END", RULE + "// EVOLVE-BLOCK-END", 1)
    (wl / "baseline.cu").write_text(code)
    count = knob_rules.count_valid(code)
    assert (count.total, count.valid) == (96, 72)
    space = count.valid
    monkeypatch.setattr(search_command, "DesignSpaceSource",
                        lambda: DesignSpaceSource(DesignSpaceConfig(sampler="random")))
    db = tmp_path / "run.db"
    assert main(["search", str(wl), "--evaluator", "simulated", "--generations", "400", "--db", str(db),
                 "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["state"] == "finished" and summary["reason"].startswith("design space exhausted: generation ")
    assert summary["generations"] < 400
    rules = knob_rules.rules(code)
    with Store(db, readonly=True) as st:
        programs = st.programs(summary["run_id"])
        points = {tuple(sorted(p["knobs"].items())) for p in programs if p["source"] != "seed"}
        assert len(points) == space  # every valid point of the space, the baseline's included, once
        assert all(knob_rules.is_valid(rules, dict(p)) for p in points)  # and none that breaks the rule
        # and the seed, and the checks of programs promoted over the seed (search/remeasure.py)
        evs = st.evaluations(summary["run_id"])
        assert len(evs) == space + 1 + summary["remeasures"]
        assert sum("remeasure" in e["request"] for e in evs) == summary["remeasures"]


class _Repeats:
    """An LLM stand-in whose every answer is the parent's own code: nothing new, ever."""

    name = "repeats"
    kinds: tuple[str, ...] = ("diff", "full", "crossover")

    def propose(self, ctx: ProposalContext) -> list[Proposal]:
        return [Proposal(name="same", rationale="", diff="", tags=[], source="llm_diff", parent_id=ctx.parent.id,
                         code=ctx.parent.code)]


def test_a_search_whose_llm_brings_nothing_new_ends_after_max_empty_generations(tmp_path: Path) -> None:
    wl = write_synthetic_workload(tmp_path / "wl")
    cfg = SearchConfig(seed=1, budget=BudgetConfig(generations=50), max_empty_generations=3)
    with Store(tmp_path / "run.db") as st:
        engine = SearchEngine(wl, st, SimulatedEvaluator(seed=1), [_Repeats()], cfg)
        s = engine.run()
    assert s.state == "finished" and s.generations == 3
    assert s.reason == "nothing new to propose: 3 generations in a row (to generation 3) brought no program the " \
                       "run does not have"


def test_the_untried_points_are_proposed_when_the_sampler_asks_for_tried_ones(tmp_path: Path) -> None:
    """A sampler that may ask only once finds nothing new after the first proposals; the source then walks the
    untried points, so a small space is covered in full before the search ends."""
    wl = write_synthetic_workload(tmp_path / "wl")
    space = markers.space_size((wl / "baseline.cu").read_text())
    assert space <= 200
    cfg = SearchConfig(seed=2, budget=BudgetConfig(generations=10_000))
    source = DesignSpaceSource(DesignSpaceConfig(sampler="random", max_asks=1))
    with Store(":memory:") as st:
        s = SearchEngine(wl, st, SimulatedEvaluator(seed=1), [source], cfg).run()
        knobs = {tuple(sorted(p["knobs"].items())) for p in st.programs(s.run_id) if p["source"] != "seed"}
    assert s.reason.startswith("design space exhausted") and len(knobs) == space
    assert s.generations <= space  # every round but the last brought at least one new point


@pytest.mark.parametrize("flag, value, says", [
    ("--generations", "10001", "--generations 10001: must be between 0 and 10000"),
    ("--generations", "-1", "--generations -1: must be between 0 and 10000"),
    ("--seed", "-1", "--seed -1: must be between 0 and 4294967295"),
    ("--seed", "99999999999999999999", "must be between 0 and 4294967295"),
    ("--llm-budget", "1e9", "--llm-budget 1e+09: must be more than 0 and at most 10000 dollars"),
    ("--llm-token-budget", "100000000000", "must be more than 0 and at most 10000000000 tokens"),
])
def test_counts_have_upper_bounds(tmp_path: Path, flag: str, value: str, says: str,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    wl = write_synthetic_workload(tmp_path / "wl")
    db = tmp_path / "run.db"
    argv = ["search", str(wl), "--evaluator", "simulated", "--db", str(db), f"{flag}={value}"]
    if flag.startswith("--llm"):
        argv += ["--mutator", "llm"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err, err
    assert not db.exists()
