"""Mutation sources: the Optuna design-space source (valid in-set knob values, placements crossed, same diff
format), the human source, and the SIMULATED / replay evaluators the search runs against."""
from __future__ import annotations

import random
from pathlib import Path

import pytest

from cuco_kit.errors import BadInput
from cuco_kit.evaluate.api import EvalRequest
from cuco_kit.evaluate.replay import MISS_REASON, ReplayEvaluator
from cuco_kit.evaluate.simulated import SimulatedEvaluator
from cuco_kit.search.design_space import DesignSpaceConfig, DesignSpaceSource
from cuco_kit.search.human import HumanEdit, HumanSource
from cuco_kit.search.phases import PhaseConfig
from cuco_kit.search.population import Population, ProgramView
from cuco_kit.search.proposal import ProposalContext
from cuco_kit.search.synthetic import BASELINE, KNOB_SETS, write_synthetic_workload
from cuco_kit.source import markers, patch, static_check
from cuco_kit.store import Store


def _ctx(pop: Population, parent: ProgramView, n: int, parallel: int = 1, seed: int = 0) -> ProposalContext:
    return ProposalContext(run_id=1, generation=1, island=0, parent=parent, population=pop,
                           phase=PhaseConfig().explore, rng=random.Random(seed), kind="design_space", seed=seed,
                           parallel=parallel, n=n)


def _root() -> tuple[Population, ProgramView]:
    pop = Population()
    root = pop.add(ProgramView(id=1, code=BASELINE, parent_id=None, source="baseline",
                               knobs={k.name: k.value for k in markers.knobs(BASELINE)},
                               result={"verdict": "pass", "speedup": 1.0, "median_ms": 1.0}, fitness=1.0))
    return pop, root


@pytest.mark.parametrize("parallel", [1, 4])
def test_design_space_proposes_valid_values_and_crosses_placements(parallel: int) -> None:
    pop, root = _root()
    src = DesignSpaceSource(DesignSpaceConfig(n_startup_trials=3))
    sim = SimulatedEvaluator(seed=2)
    placements: set[str] = set()
    issuers: set[str] = set()
    next_id = 2
    for gen in range(4):
        props = src.propose(_ctx(pop, root, n=4, parallel=parallel, seed=gen))
        assert 1 <= len(props) <= 4
        assert len({p.code for p in props}) == len(props)  # distinct points within one ask batch
        for p in props:
            assert p.source == "design_space" and p.parent_id == 1
            assert static_check.check_candidate(p.code, BASELINE).ok  # in-set values, frozen bytes kept
            values = {k.name: k.value for k in markers.knobs(p.code)}
            assert all(values[n] in KNOB_SETS[n] for n in KNOB_SETS)
            assert values != {k.name: k.value for k in markers.knobs(BASELINE)}
            assert p.diff.startswith("--- parent") and "+constexpr" in p.diff  # the one diff format
            placements.add(values["kPlacement"])
            issuers.add(values["kIssuer"])
            # tell the result (the lineage's children are the study's history next time)
            res = sim.evaluate(EvalRequest(candidate_code=p.code, workload_dir="x", parent_code=BASELINE)).to_dict()
            child = pop.add(ProgramView(id=next_id, code=p.code, parent_id=1, source="design_space", knobs=values))
            pop.set_result(child.id, res)
            next_id += 1
    assert len(placements) >= 3 and issuers == set(KNOB_SETS["kIssuer"])
    # One at a time: GP (scipy is a core dependency); in parallel: TPE with the constant liar.
    assert src.last_sampler == ("GPSampler" if parallel == 1 else "TPESampler")


def test_design_space_never_repeats_a_known_point_and_respects_user_constraints() -> None:
    pop, root = _root()
    # few asks per proposal: the walk of untried points takes over sooner (the GP asks dominate this test)
    src = DesignSpaceSource(DesignSpaceConfig(max_asks=8), is_valid=lambda v: v["kPlacement"] != "Placement::kFused")
    seen = {root.code}
    for i in range(6):
        for p in src.propose(_ctx(pop, root, n=3, seed=i)):
            assert p.code not in seen
            values = {k.name: k.value for k in markers.knobs(p.code)}
            assert values["kPlacement"] != "Placement::kFused"
            seen.add(p.code)
            pop.add(ProgramView(id=len(seen) + 1, code=p.code, parent_id=1, source="design_space", knobs=values,
                                result={"verdict": "fail"}))


def test_human_source_turns_edits_into_proposals() -> None:
    pop, root = _root()
    h = HumanSource()
    edits = ("<<<<<<< SEARCH\n    y[j] = x[j];\n=======\n    y[j] = __ldg(&x[j]);\n>>>>>>> REPLACE\n")
    h.submit(HumanEdit(1, edits=edits, name="ldg", rationale="read-only cache"))
    h.submit(HumanEdit(1, code=BASELINE.replace("<<<64,", "<<<96,")))
    h.submit(HumanEdit(1, edits="<<<<<<< SEARCH\nstruct State {\n=======\nstruct S {\n>>>>>>> REPLACE\n"))
    props = h.propose(_ctx(pop, root, 1))
    assert [p.source for p in props] == ["human", "human"]
    assert "__ldg(&x[j])" in props[0].code and props[0].name == "ldg" and "human" in props[0].tags
    assert "<<<96," in props[1].code
    assert len(h.errors) == 1 and "not inside one EVOLVE block" in h.errors[0]  # frozen code refused
    with pytest.raises(BadInput):
        h.submit(HumanEdit(1))


def test_simulated_evaluator_is_deterministic_badged_and_fails_some_combinations() -> None:
    sim = SimulatedEvaluator(seed=3, fail_rate=0.3)
    req = EvalRequest(candidate_code=BASELINE, workload_dir="x", parent_code=BASELINE)
    a, b = sim.evaluate(req), sim.evaluate(req)
    assert a.to_dict() == b.to_dict() and a.badge == "simulated" and a.provenance["simulated"] is True
    levels = set()
    for chunks in KNOB_SETS["kChunks"]:
        for placement in KNOB_SETS["kPlacement"]:
            code = markers.set_knobs(BASELINE, {"kChunks": chunks, "kPlacement": placement})
            r = sim.evaluate(EvalRequest(candidate_code=code, workload_dir="x", parent_code=BASELINE))
            assert r.badge == "simulated"
            levels.add((r.level_reached, r.verdict))
            if r.verdict == "fail":
                assert r.reason and "simulated" in r.reason
            else:
                assert r.speedup == pytest.approx(r.seed_median_ms / r.median_ms)
    assert ("L3", "pass") in levels and ({("L1", "fail"), ("L2", "fail")} & levels)
    bad = BASELINE.replace("constexpr int kThreads = 256;", "constexpr int kThreads = 300;")
    r = sim.evaluate(EvalRequest(candidate_code=bad, workload_dir="x", parent_code=BASELINE))
    assert (r.level_reached, r.verdict) == ("L0", "fail") and "not in its allowed set" in r.reason


def test_replay_evaluator_serves_real_rows_and_misses_honestly(tmp_path: Path) -> None:
    wl = write_synthetic_workload(tmp_path / "wl")
    db = tmp_path / "real.db"
    with Store(db) as s:
        rid = s.create_run(workload="synthetic_gemm_allgather", config={}, badge="real")
        pid = s.add_program(run_id=rid, code=BASELINE, parent_id=None, source="baseline")
        eid = s.start_evaluation(pid, world_size=4, backend="symm", badge="real",
                                 request={"params": {"N": 4096}})
        s.finish_evaluation(eid, {"level_reached": "L3", "verdict": "pass", "median_ms": 0.5, "speedup": 1.7,
                                  "badge": "real", "provenance": {"gpu": "NVIDIA H200", "date": "2025-05-01",
                                                                  "mps": True}})
        sim_code = BASELINE.replace("<<<64,", "<<<32,")
        pid2 = s.add_program(run_id=rid, code=sim_code, parent_id=pid, source="design_space")
        e2 = s.start_evaluation(pid2, world_size=4, backend="symm", badge="simulated", request={})
        s.finish_evaluation(e2, {"level_reached": "L3", "verdict": "pass", "median_ms": 0.1, "badge": "simulated"})
    rep = ReplayEvaluator(db)
    # {} matches the stored explicit default N=4096 once the workload's defaults are filled in
    hit = rep.evaluate(EvalRequest(candidate_code=BASELINE, workload_dir=str(wl), world_size=4, backend="symm"))
    assert hit.verdict == "pass" and hit.median_ms == 0.5 and hit.badge == "replayed"
    assert hit.provenance["gpu"] == "NVIDIA H200" and hit.provenance["replayed_evaluation_id"] == eid
    assert "NVIDIA H200" in rep.describe() and "2025-05-01" in rep.describe()
    for req in (EvalRequest(candidate_code=BASELINE, workload_dir=str(wl), world_size=2, backend="symm"),
                EvalRequest(candidate_code=BASELINE, workload_dir=str(wl), world_size=4, backend="nccl"),
                EvalRequest(candidate_code=BASELINE, workload_dir=str(wl), world_size=4, backend="symm",
                            params={"N": 8192}),
                EvalRequest(candidate_code=sim_code, workload_dir=str(wl), world_size=4, backend="symm")):
        miss = rep.evaluate(req)
        assert miss.verdict == "unavailable" and miss.reason.startswith(MISS_REASON) and miss.median_ms is None
    assert rep.hits == 1 and rep.misses == 4
    with pytest.raises(BadInput):
        ReplayEvaluator(tmp_path / "nope.db")


def test_patch_and_design_space_agree_on_the_edit_format() -> None:
    pop, root = _root()
    p = DesignSpaceSource().propose(_ctx(pop, root, 1))[0]
    knob_lines = [ln for ln in p.diff.splitlines() if ln.startswith("+constexpr")]
    assert knob_lines and all("// knob:" in ln for ln in knob_lines)
    assert patch.unified_diff(BASELINE, p.code, "parent", "candidate") == p.diff
