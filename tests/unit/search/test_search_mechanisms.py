"""Search mechanisms in isolation: parent selection distributions, islands and migration, archive cells,
phase switching, the novelty filter, and the approval gate's queue."""
from __future__ import annotations

import random
import threading
from collections import Counter

import pytest

from cuco_kit.errors import BadInput
from cuco_kit.search import islands
from cuco_kit.search.archive import Archive, cell_of
from cuco_kit.search.gate import ApprovalGate
from cuco_kit.search.novelty import NoveltyConfig, NoveltyFilter
from cuco_kit.search.phases import PhaseConfig, PhaseController
from cuco_kit.search.population import Population, ProgramView
from cuco_kit.search.proposal import Proposal
from cuco_kit.search.selection import (
    SelectionConfig,
    beam_probabilities,
    power_law_probabilities,
    select_parent,
    weighted_probabilities,
)
from cuco_kit.search.synthetic import BASELINE
from cuco_kit.source import markers


def _prog(pid: int, fitness: float | None, island: int = 0, parent: int | None = None, source: str = "design_space",
          code: str = "", cell: str | None = None) -> ProgramView:
    res = {"verdict": "pass", "median_ms": 1.0 / fitness, "speedup": fitness} if fitness else \
        {"verdict": "fail", "level_reached": "L2", "reason": "wrong"}
    return ProgramView(id=pid, code=code or f"code {pid}", parent_id=parent, source=source, island=island,
                       result=res, fitness=fitness, cell=cell)


def test_power_law_favours_rank_and_matches_formula() -> None:
    progs = [_prog(1, 1.0), _prog(2, 3.0), _prog(3, 2.0)]
    p = power_law_probabilities(progs, alpha=1.0)
    # ranks: program 2 -> 1, program 3 -> 2, program 1 -> 3
    z = 1 + 1 / 2 + 1 / 3
    assert p == pytest.approx([(1 / 3) / z, 1 / z, (1 / 2) / z])
    flat = power_law_probabilities(progs, alpha=0.0)
    assert flat == pytest.approx([1 / 3] * 3)


def test_weighted_damps_programs_with_many_children() -> None:
    progs = [_prog(1, 2.0), _prog(2, 2.0), _prog(3, 1.0)]
    p = weighted_probabilities(progs, {1: 9, 2: 0})
    assert p[1] > p[0] * 5  # equal fitness, program 1 already has 9 children
    assert p[1] > p[2]  # fitter wins among the unexplored
    assert sum(p) == pytest.approx(1.0)


def test_beam_only_draws_from_the_best() -> None:
    progs = [_prog(i, float(i)) for i in range(1, 7)]
    assert beam_probabilities(progs, 2) == pytest.approx([0, 0, 0, 0, 0.5, 0.5])
    rng = random.Random(0)
    cfg = SelectionConfig(method="beam", beam_width=2)
    drawn = Counter(select_parent(progs, [], cfg, rng).id for _ in range(400))
    assert set(drawn) == {5, 6}
    assert 150 < drawn[5] < 250


def test_select_parent_empirical_distribution_follows_probabilities() -> None:
    progs = [_prog(1, 1.0), _prog(2, 1.5), _prog(3, 4.0), _prog(4, None)]
    cfg = SelectionConfig(method="power_law", alpha=1.5)
    rng = random.Random(1)
    n = 6000
    drawn = Counter(select_parent(progs, [], cfg, rng).id for _ in range(n))
    want = power_law_probabilities(progs[:3], 1.5)
    assert 4 not in drawn  # failed programs are never parents
    for pid, w in zip((1, 2, 3), want):
        assert abs(drawn[pid] / n - w) < 0.03
    root = _prog(9, None, source="baseline")
    assert select_parent([_prog(4, None)], [root], cfg, rng).id == 9  # nothing scored yet: a root


def test_migration_copies_each_islands_best_round_the_ring() -> None:
    pop = Population()
    pop.add(_prog(1, None, source="baseline"))
    for pid, fit, isl in [(2, 1.2, 0), (3, 1.9, 0), (4, 1.1, 1), (5, 1.4, 1), (6, 2.5, 2)]:
        pop.add(_prog(pid, fit, island=isl, parent=1))
    cfg = islands.IslandConfig(islands=3, migration_interval=2)
    assert not islands.due(1, cfg) and islands.due(2, cfg) and not islands.due(3, cfg)
    moves = islands.migrate(pop, 2, cfg)
    assert {(m["program_id"], m["from"], m["to"]) for m in moves} == {(3, 0, 1), (5, 1, 2), (6, 2, 0)}
    assert 6 in {p.id for p in pop.island_members(0)}
    assert 3 in {p.id for p in pop.island_members(1)} and 3 not in {p.id for p in pop.island_members(2)}
    again = islands.migrate(pop, 4, cfg)  # 6 is already on island 0; 3 is now island 1's best -> island 2
    assert (3, 1, 2) in {(m["program_id"], m["from"], m["to"]) for m in again}
    assert all(m["program_id"] != 6 or m["to"] != 0 for m in again)


def test_archive_cells_come_from_knobs_and_backend_not_tags() -> None:
    knobs, cell = cell_of(BASELINE, "symm")
    assert knobs["kPlacement"] == "Placement::kSequential"
    assert cell.startswith("backend=symm|") and "kPlacement=Placement::kSequential" in cell
    other = markers.set_knobs(BASELINE, {"kPlacement": "Placement::kFused"})
    _, cell2 = cell_of(other, "symm")
    assert cell2 != cell and "kPlacement=Placement::kFused" in cell2
    assert cell_of(BASELINE, "nccl")[1] != cell
    pop = Population()
    a = Archive()
    p1 = pop.add(_prog(1, 1.5, code=BASELINE, cell=cell))
    p2 = pop.add(_prog(2, 1.2, code=BASELINE + "// x\n", cell=cell))
    p3 = pop.add(_prog(3, 1.8, code=BASELINE + "// y\n", cell=cell))
    p4 = pop.add(_prog(4, 1.0, code=other, cell=cell2))
    assert a.update(p1, pop) and not a.update(p2, pop) and a.update(p3, pop) and a.update(p4, pop)
    assert a.cells() == {cell: 3, cell2: 4}


def test_phases_switch_on_stagnation_and_on_schedule() -> None:
    c = PhaseController(PhaseConfig(mode="stagnation", start="exploit", patience=2, explore_generations=2))
    assert c.settings.name == "exploit"
    assert c.end_generation(1, 1.0) is None
    assert c.end_generation(2, 1.0) is None  # stagnant 1
    assert c.end_generation(3, 1.0) is not None and c.state.phase == "explore"  # stagnant 2 -> explore
    assert c.settings.mix["full"] > PhaseConfig().exploit.mix["full"]
    assert c.settings.temperature > PhaseConfig().exploit.temperature
    assert c.end_generation(4, 1.0) is None
    assert c.end_generation(5, 1.0) is not None and c.state.phase == "exploit"  # explored 2 generations
    c.end_generation(6, 1.0)
    c.end_generation(7, 1.0)
    assert c.state.phase == "explore"
    assert c.end_generation(8, 1.3) == "exploring found a new best" and c.state.phase == "exploit"
    s = PhaseController(PhaseConfig(mode="schedule", start="explore", schedule=[[3, "exploit"], [6, "explore"]]))
    phases = []
    for g in range(1, 8):
        s.end_generation(g, 1.0)
        phases.append(s.state.phase)
    assert phases == ["explore", "exploit", "exploit", "exploit", "explore", "explore", "explore"]
    with pytest.raises(BadInput):
        PhaseConfig(mode="sometimes")


def test_phase_mix_draws_follow_weights_and_available_kinds() -> None:
    s = PhaseConfig().explore
    rng = random.Random(0)
    draws = Counter(s.draw_kind(rng, {"diff", "design_space"}) for _ in range(2000))
    assert set(draws) == {"diff", "design_space"}
    ratio = draws["design_space"] / draws["diff"]
    assert abs(ratio - s.mix["design_space"] / s.mix["diff"]) < 0.3
    assert s.draw_kind(rng, set()) is None


def test_novelty_filter_rejects_near_duplicate_and_passes_a_real_change() -> None:
    pop = Population()
    cell = "c"
    pop.add(_prog(1, 1.0, code=BASELINE, cell=cell))
    f = NoveltyFilter(NoveltyConfig(threshold=0.95))
    near = BASELINE.replace("y[j] = x[j];", "y[j] = x[j];  // copy one element")  # comment only
    v = f.check(near, cell, "llm_diff", pop)
    assert not v.novel and v.nearest_id == 1 and v.similarity >= 0.95 and "near-duplicate" in v.reason()
    spaced = BASELINE.replace("  long i =", "      long   i  =")  # whitespace only
    assert not f.check(spaced, cell, "llm_full", pop).novel
    changed = BASELINE.replace(
        "    y[j] = x[j];\n",
        "    float v = __ldg(&x[j]);\n    if (kIssuer == Issuer::kOneWarp) { v *= 1.0f; }\n"
        "    __stcs(&y[j], v);\n    __threadfence_system();\n")
    v2 = f.check(changed, cell, "llm_diff", pop)
    assert v2.novel and v2.similarity < 0.95
    assert f.check(near, "other cell", "llm_diff", pop).novel  # only the same cell counts
    assert f.check(near, cell, "design_space", pop).method == "exempt"


def test_novelty_with_embeddings_from_fake_server() -> None:
    from cuco_kit.llm.fake_server import FakeOpenAIServer
    from cuco_kit.search.novelty import openai_embedder

    pop = Population()
    pop.add(_prog(1, 1.0, code=BASELINE, cell="c"))
    with FakeOpenAIServer([]) as srv:
        f = NoveltyFilter(NoveltyConfig(use_embeddings=True, embedding_threshold=0.999),
                          openai_embedder(srv.config()))
        v = f.check(BASELINE + "\n", "c", "llm_diff", pop)
        assert v.method == "embedding" and not v.novel
        v2 = f.check("__global__ void k() { totally(different, words, here); }", "c", "llm_diff", pop)
        assert v2.method == "embedding" and v2.novel


def _proposal(i: int) -> Proposal:
    return Proposal(name=f"p{i}", rationale="", diff="", tags=[], source="llm_diff", parent_id=1, code=f"c{i}")


def test_gate_manual_queue_is_thread_safe_and_non_blocking() -> None:
    g = ApprovalGate("manual")
    for i in range(1, 4):
        g.submit(i, _proposal(i))
    assert g.pending_ids() == [1, 2, 3] and g.drain() == []
    t = threading.Thread(target=lambda: (g.decide(2, "rejected"), g.decide(1, "edited", code="new")))
    t.start()
    t.join(5)
    assert g.pending_ids() == [3]
    got = g.drain()
    assert [(d.proposal_id, d.decision, d.code) for d, _ in got] == [(2, "rejected", None), (1, "edited", "new")]
    with pytest.raises(BadInput):
        g.decide(1, "approved")  # already decided
    with pytest.raises(BadInput):
        g.decide(3, "edited")  # edited needs code
    g.set_mode("auto")
    assert [(d.proposal_id, d.decision, d.by) for d, _ in g.drain()] == [(3, "approved", "auto")]
    g.submit(4, _proposal(4))
    assert [d.proposal_id for d, _ in g.drain()] == [4]
