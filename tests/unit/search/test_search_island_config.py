"""Islands configured one by one: each may start from programs of its own and carry a system-prompt file of its own
(`IslandConfig.initial_programs`, `system_prompts`), and migrants travel along a topology (ring, star, full or
explicit directed edges) that a resume rebuilds. Searches run on the SIMULATED evaluator (numbers badged
SIMULATED); LLM calls go to the fake OpenAI-compatible server with LABELLED FIXTURE answers. The LSA program is a
LABELLED FIXTURE: the synthetic baseline with a device-API helper in its kernel block, never built."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from cuco_kit.cli import main
from cuco_kit.errors import BadInput
from cuco_kit.evaluate.simulated import SimulatedEvaluator
from cuco_kit.events import EventBus
from cuco_kit.llm.fake_server import FakeOpenAIServer, answer
from cuco_kit.llm.openai_client import OpenAICompatibleClient
from cuco_kit.search import islands
from cuco_kit.search.api_type import api_type
from cuco_kit.search.budget import BudgetConfig
from cuco_kit.search.config import SearchConfig
from cuco_kit.search.design_space import DesignSpaceConfig, DesignSpaceSource
from cuco_kit.search.engine import SearchEngine
from cuco_kit.search.islands import IslandConfig
from cuco_kit.search.llm_source import LLMSource
from cuco_kit.search.population import Population, ProgramView
from cuco_kit.search.proposal import Proposal, ProposalContext
from cuco_kit.search.synthetic import BASELINE, write_synthetic_workload
from cuco_kit.store import Store

KERNEL_END = "static void launch_step("
# FIXTURE: an LSA helper (a peer's row through its LSA window) in the kernel block.
LSA = BASELINE.replace(KERNEL_END, "__device__ float* peer_row(ncclWindow_t win, size_t offset, int peer) {\n"
                                   "  return (float*)ncclGetLsaPointer(win, offset, peer);\n}\n\n" + KERNEL_END)
# A host-collective start: the synthetic baseline (host API) with other knob values.
HOST = BASELINE.replace("constexpr int kChunks = 2;", "constexpr int kChunks = 8;")


# ---- configuration ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kw, named", [
    ({"topology": "mesh"}, "islands.topology 'mesh' is not one of ring, star, full"),
    ({"topology": [[0, 3]]}, "edge [0, 3] must join two different islands of 0..2"),
    ({"topology": [[1, 1]]}, "edge [1, 1] must join two different islands"),
    ({"topology": [[0]]}, "edge [0] is not [from, to]"),
    ({"hub": 5}, "islands.hub 5 is not an island"),
    ({"initial_programs": [["a.cu"]]}, "islands.initial_programs has 1 entry for 3 island(s)"),
    ({"initial_programs": [[], 3, []]}, "islands.initial_programs[1]: 3 is not a list of file paths"),
    ({"system_prompts": ["", ""]}, "islands.system_prompts has 2 entries for 3 island(s)"),
])
def test_a_bad_island_setting_is_refused_in_one_line_naming_it(kw: dict, named: str) -> None:
    with pytest.raises(BadInput) as exc:
        IslandConfig(islands=3, **kw)
    assert named in str(exc.value) and "\n" not in str(exc.value)


def test_one_file_per_island_may_be_given_as_a_string() -> None:
    cfg = IslandConfig(islands=3, initial_programs=["a.cu", "", ["b.cu", "c.cu"]])  # type: ignore[list-item]
    assert cfg.initial_programs == [["a.cu"], [], ["b.cu", "c.cu"]] and cfg.seeded() == {0, 2}
    assert IslandConfig().programs_of(1) == [] and IslandConfig().prompt_of(0) == ""


# ---- topologies ------------------------------------------------------------------------------------------------

def _pop(n: int, api: list[str] | None = None) -> Population:
    """One scored program per island (id = island + 10), all host programs unless ``api`` says otherwise."""
    pop = Population()
    pop.add(ProgramView(id=1, code=BASELINE, parent_id=None, source="baseline", result={"verdict": "pass"},
                        fitness=1.0))
    for i in range(n):
        code = (LSA if api and api[i] == "lsa" else BASELINE) + f"// island {i}\n"
        pop.add(ProgramView(id=10 + i, code=code, parent_id=1, source="design_space", island=i,
                            result={"verdict": "pass"}, fitness=1.1 + i / 100))
    if api:
        pop.island_api = {i: a for i, a in enumerate(api) if a}
    return pop


def _moves(cfg: IslandConfig, pop: Population | None = None) -> set[tuple[int, int]]:
    return {(m["from"], m["to"]) for m in islands.plan(pop or _pop(cfg.islands), 1, cfg)}


def test_each_topology_moves_migrants_along_its_edges() -> None:
    assert _moves(IslandConfig(islands=4)) == {(0, 1), (1, 2), (2, 3), (3, 0)}  # the ring, as before
    assert _moves(IslandConfig(islands=4, topology="star")) == {(1, 0), (2, 0), (3, 0), (0, 1), (0, 2), (0, 3)}
    assert _moves(IslandConfig(islands=4, topology="star", hub=2)) == {(0, 2), (1, 2), (3, 2), (2, 0), (2, 1),
                                                                        (2, 3)}
    assert _moves(IslandConfig(islands=3, topology="full")) == {(i, j) for i in range(3) for j in range(3) if i != j}
    assert _moves(IslandConfig(islands=3, topology=[[0, 2], [1, 2]])) == {(0, 2), (1, 2)}
    assert _moves(IslandConfig(islands=3, topology=[])) == set()
    assert islands.edges(IslandConfig(islands=3, topology=[[0, 2], [1, 2], [0, 2]])) == [(0, 2), (1, 2)]
    assert islands.edges(IslandConfig(islands=1, topology="full")) == []


def test_a_migrant_goes_only_where_its_api_type_is_taken_on_every_topology() -> None:
    api = ["lsa", "host", "lsa", "host"]
    typed = IslandConfig(islands=4, api=api, topology="full")
    assert _moves(typed, _pop(4, api)) == {(0, 2), (2, 0), (1, 3), (3, 1)}
    edges = IslandConfig(islands=4, api=api, topology=[[0, 1], [0, 2], [3, 1]])
    assert _moves(edges, _pop(4, api)) == {(0, 2), (3, 1)}  # 0 -> 1 carries nothing: island 1 takes host only
    cross = IslandConfig(islands=4, api=api, topology=[[0, 1], [0, 2], [3, 1]], cross_api_migration=True)
    assert _moves(cross, _pop(4, api)) == {(0, 1), (0, 2), (3, 1)}
    ring = IslandConfig(islands=4, api=api)  # the ring skips to the next island that takes the migrant
    assert _moves(ring, _pop(4, api)) == {(0, 2), (2, 0), (1, 3), (3, 1)}


def _engine(tmp_path: Path, db: str, cfg: SearchConfig, sources: list | None = None,
            evaluator: SimulatedEvaluator | None = None) -> tuple[SearchEngine, Store]:
    wl = tmp_path / "wl"
    if not wl.exists():
        write_synthetic_workload(wl)
    store = Store(tmp_path / db)
    src = sources if sources is not None else [DesignSpaceSource(DesignSpaceConfig(sampler="random"))]
    ev = evaluator or SimulatedEvaluator(seed=4, baseline_factor=0.7, fail_rate=0.0)  # most programs beat the seed
    return SearchEngine(wl, store, ev, src, cfg, EventBus()), store


def _star(generations: int, topology: object = "star") -> SearchConfig:
    cfg = SearchConfig(seed=4, proposals_per_generation=4, timeline="off", budget=BudgetConfig(generations=generations),
                       islands=IslandConfig(islands=4, migration_interval=1, migrants=2,
                                            topology=topology))  # type: ignore[arg-type]
    cfg.phases.explore.mix = {"design_space": 1.0}
    cfg.phases.exploit.mix = {"design_space": 1.0}
    return cfg


def test_a_resumed_run_rebuilds_the_memberships_its_topology_made(tmp_path: Path) -> None:
    eng, store = _engine(tmp_path, "star.db", _star(2))
    with store:
        eng.run()
        members = {i: {p.id for p in eng.population.island_members(i)} for i in range(4)}
        state = store.get_meta(eng._rid, "state")
    star = {(i, 0) for i in (1, 2, 3)} | {(0, i) for i in (1, 2, 3)}
    assert state["migrations"] and {(m["from"], m["to"]) for m in state["migrations"]} <= star
    assert state["topology"] == [list(e) for e in islands.edges(_star(2).islands)]
    eng2, store2 = _engine(tmp_path, "star.db", _star(4))
    with store2:
        eng2._setup()
        assert {i: {p.id for p in eng2.population.island_members(i)} for i in range(4)} == members
        eng2.run()
        moves = store2.get_meta(eng2._rid, "state")["migrations"]
    assert eng2.run_id == eng.run_id and len(moves) > len(state["migrations"])
    assert {(m["from"], m["to"]) for m in moves} <= star
    assert max(m["generation"] for m in moves) > 2  # the resumed generations migrated too


def test_a_resume_with_another_topology_keeps_the_moves_made_and_says_so(tmp_path: Path) -> None:
    eng, store = _engine(tmp_path, "change.db", _star(2))
    with store:
        eng.run()
        before = store.get_meta(eng._rid, "state")["migrations"]
    bus = EventBus()
    eng2, store2 = _engine(tmp_path, "change.db", _star(3, topology=[[1, 2]]))
    eng2.events = bus
    with store2:
        eng2.run()
        after = store2.get_meta(eng2._rid, "state")["migrations"]
    assert after[:len(before)] == before and {(m["from"], m["to"]) for m in after[len(before):]} <= {(1, 2)}
    assert any("topology changed" in e.data["message"] for e in bus.history("log"))


# ---- each island's own start and prompt ------------------------------------------------------------------------

class _Recorder:
    """A test source (no LLM): records the context of each proposal, proposes nothing."""

    kinds = ("diff",)

    def __init__(self) -> None:
        self.contexts: list[ProposalContext] = []

    def propose(self, ctx: ProposalContext) -> list[Proposal]:
        self.contexts.append(ctx)
        return []


def _files(tmp_path: Path) -> dict[str, Path]:
    out = {"lsa": tmp_path / "lsa_design.cu", "host": tmp_path / "host_seed.cu", "prompt": tmp_path / "island1.md",
           "wrapped": tmp_path / "island2.md"}
    out["lsa"].write_text(LSA)
    out["host"].write_text(HOST)
    out["prompt"].write_text("Island one: keep the LSA window, try fewer, larger chunks.\n")
    out["wrapped"].write_text("You are on the host island.\n\n$base\n\nNever leave host collectives.\n")
    return out


def _seeded(tmp_path: Path, f: dict[str, Path], **kw: object) -> SearchConfig:
    cfg = SearchConfig(seed=1, proposals_per_generation=3, max_empty_generations=1, timeline="off",
                       budget=BudgetConfig(generations=1),
                       islands=IslandConfig(islands=3, initial_programs=[[], [str(f["lsa"])], [str(f["host"])]],
                                            system_prompts=["", str(f["prompt"]), str(f["wrapped"])], **kw))  # type: ignore[arg-type]
    cfg.phases.explore.mix = {"diff": 1.0}
    cfg.phases.exploit.mix = {"diff": 1.0}
    return cfg


def test_each_islands_first_parent_comes_from_its_own_start_and_its_prompt_is_its_own(tmp_path: Path) -> None:
    f = _files(tmp_path)
    rec = _Recorder()
    cfg = _seeded(tmp_path, f)
    eng, store = _engine(tmp_path, "seeded.db", cfg, [rec])
    with store:
        eng.run()
        progs = {p["id"]: p for p in store.programs(eng._rid)}
    starts = {p["island"]: p for p in progs.values() if "initial" in p["tags"]}
    assert {i: p["code"] for i, p in starts.items()} == {1: LSA, 2: HOST}
    assert all(p["generation"] == 0 and p["parent_id"] is None and f"island:{i}" in p["tags"]
               for i, p in starts.items())
    parents = {c.island: c.parent for c in rec.contexts}
    assert parents[0].source == "baseline"  # an island without its own start: the baseline, as before
    assert parents[1].id == starts[1]["id"] and parents[1].api == "lsa"
    assert parents[2].id == starts[2]["id"] and parents[2].api == "host"
    # The baseline is a member of the unseeded island only.
    baseline = next(p for p in eng.population.roots())
    assert [baseline.id in {p.id for p in eng.population.island_members(i)} for i in range(3)] == [True, False, False]
    prompts = {c.island: c.system_prompt for c in rec.contexts}
    base = islands.system_prompt(0, cfg.islands)
    assert prompts[0] == base
    assert prompts[1].startswith(base.rstrip()) and prompts[1].rstrip().endswith("fewer, larger chunks.")
    assert prompts[2].startswith("You are on the host island.") and base in prompts[2]
    assert prompts[2].rstrip().endswith("Never leave host collectives.")


# FIXTURE: a model's diff every program here takes (its SEARCH text is in the shared kernel).
STREAMING_DIFF = """NAME: streaming stores
RATIONALE: y is not read again, so bypass L1 and keep L2 for the peers.
TAGS: memory
<<<<<<< SEARCH
    y[j] = x[j];
=======
    float v = __ldg(&x[j]);
    __stcs(&y[j], v);
>>>>>>> REPLACE
"""


def test_an_islands_llm_request_carries_its_own_prompt_at_the_server(tmp_path: Path) -> None:
    """Real HTTP to the fake OpenAI-compatible server, the real openai client, a labelled fixture answer."""
    f = _files(tmp_path)
    cfg = SearchConfig(seed=1, proposals_per_generation=2, budget=BudgetConfig(generations=1), timeline="off",
                       islands=IslandConfig(islands=2, initial_programs=[[], [str(f["lsa"])]],
                                            system_prompts=["", str(f["prompt"])]))
    cfg.novelty.enabled = False
    cfg.diagnosis.enabled = False  # only the mutation calls here
    cfg.meta.interval = 0
    cfg.phases.mode = "fixed"
    cfg.phases.explore.mix = {"diff": 1.0}
    with FakeOpenAIServer([answer("diff", STREAMING_DIFF, match="targeted edits", times=0)]) as srv:
        eng, store = _engine(tmp_path, "llm.db", cfg, [LLMSource(OpenAICompatibleClient(srv.config()))])
        with store:
            eng.run()
            children = [p for p in store.programs(eng._rid) if p["source"] == "llm_diff"]
        requests = [r.body for r in srv.chat_requests()]
    by_api: dict[str, set[str]] = {}
    for body in requests:
        msgs = body["messages"]
        parent = msgs[-1]["content"].split("```cuda\n", 1)[1].split("```", 1)[0]
        by_api.setdefault(api_type(parent), set()).add(msgs[0]["content"])
    own = f["prompt"].read_text().strip()
    assert by_api == {"host": {islands.system_prompt(0, cfg.islands)},
                      "lsa": {islands.system_prompt(1, cfg.islands, own + "\n")}}
    assert own in next(iter(by_api["lsa"])) and own not in next(iter(by_api["host"]))
    assert {p["island"] for p in children} == {0, 1} and all("fixture" in p["tags"] for p in children)


def test_a_missing_island_file_is_refused_naming_the_field_and_the_file(tmp_path: Path) -> None:
    f = _files(tmp_path)
    for kw, field, name in (({"initial_programs": [[], [str(tmp_path / "nope.cu")], []]},
                             "islands.initial_programs[1][0]", "nope.cu"),
                            ({"system_prompts": ["", "", str(tmp_path / "gone.md")]}, "islands.system_prompts[2]",
                             "gone.md")):
        cfg = _seeded(tmp_path, f)
        for k, v in kw.items():
            setattr(cfg.islands, k, v)
        eng, store = _engine(tmp_path, f"missing-{name}.db", cfg, [_Recorder()])
        with store, pytest.raises(BadInput) as exc:
            eng.run()
        msg = str(exc.value)
        assert field in msg and name in msg and "no such file" in msg and "\n" not in msg
        with Store(tmp_path / f"missing-{name}.db") as s:
            assert s.runs() == []  # refused before anything was stored


def test_a_start_of_another_api_type_than_its_island_is_refused(tmp_path: Path) -> None:
    f = _files(tmp_path)
    cfg = _seeded(tmp_path, f, api=["", "gin", ""])
    eng, store = _engine(tmp_path, "typed.db", cfg, [_Recorder()])
    with store, pytest.raises(BadInput, match=r"islands.initial_programs\[1\]\[0\] .*lsa_design.cu: a lsa program, "
                                              r"but island 1 takes gin programs"):
        eng.run()


def test_one_file_starting_two_islands_is_one_program_member_of_both(tmp_path: Path) -> None:
    f = _files(tmp_path)
    cfg = _seeded(tmp_path, f)
    cfg.islands.initial_programs = [[], [str(f["lsa"])], [str(f["lsa"])]]
    eng, store = _engine(tmp_path, "twice.db", cfg, [_Recorder()])
    with store:
        eng.run()
        (start,) = [p for p in store.programs(eng._rid) if "initial" in p["tags"]]
    assert start["island"] == 1
    assert all(start["id"] in {p.id for p in eng.population.island_members(i)} for i in (1, 2))
    assert [p.id for p in eng.population.island_start(2)] == [start["id"]]


def test_cuco_search_config_reads_island_files_relative_to_the_run_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    wl = write_synthetic_workload(tmp_path / "wl")
    runs = tmp_path / "runs"
    runs.mkdir()
    _files(runs)
    (runs / "run.toml").write_text("""
proposals_per_generation = 3
[islands]
islands = 3
migration_interval = 1
topology = [[1, 0], [2, 0]]
initial_programs = [[], ["lsa_design.cu"], "host_seed.cu"]
system_prompts = ["", "island1.md", ""]
""")
    monkeypatch.chdir(tmp_path)  # not the run file's folder
    db = tmp_path / "cli.db"
    assert main(["search", str(wl), "--config", str(runs / "run.toml"), "--generations", "2", "--db", str(db),
                 "--evaluator", "simulated", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    with Store(db, readonly=True) as s:
        run = s.run(out["run_id"])
        assert run["config"]["islands"]["initial_programs"] == [[], [str(runs / "lsa_design.cu")],
                                                                [str(runs / "host_seed.cu")]]
        assert run["config"]["islands"]["topology"] == [[1, 0], [2, 0]]
        starts = {p["island"]: p["code"] for p in s.programs(out["run_id"]) if "initial" in p["tags"]}
        assert starts == {1: LSA, 2: HOST}
        state = s.get_meta(out["run_id"], "state")
        assert {(m["from"], m["to"]) for m in state["migrations"]} <= {(1, 0), (2, 0)}
    (runs / "bad.toml").write_text("[islands]\nislands = 2\nsystem_prompts = [\"\", \"missing.md\"]\n")
    bad_db = tmp_path / "bad.db"
    assert main(["search", str(wl), "--config", str(runs / "bad.toml"), "--db", str(bad_db), "--evaluator",
                 "simulated"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "islands.system_prompts[1]" in err and str(runs / "missing.md") in err
    assert not bad_db.exists()  # refused before the database was made
