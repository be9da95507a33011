"""The backend as a design dimension: each program's API type (LSA, GIN, host) comes from its source, enters the
archive's cell, and islands of an API type keep to it (members, system prompt, migration). Searches run on the
SIMULATED evaluator (a synthetic landscape, numbers badged SIMULATED); the LSA and GIN programs below are LABELLED
FIXTURES: the synthetic baseline with a device-API helper in its kernel block, never built."""
from __future__ import annotations

from pathlib import Path

import pytest

from cuco_kit.errors import BadInput
from cuco_kit.evaluate.simulated import SimulatedEvaluator
from cuco_kit.events import EventBus
from cuco_kit.llm.fake_server import FakeOpenAIServer, answer
from cuco_kit.llm.openai_client import OpenAICompatibleClient
from cuco_kit.search import islands
from cuco_kit.search.api_type import api_from_features, api_type
from cuco_kit.search.archive import cell_of
from cuco_kit.search.budget import BudgetConfig
from cuco_kit.search.config import SearchConfig
from cuco_kit.search.design_space import DesignSpaceSource
from cuco_kit.search.engine import SearchEngine
from cuco_kit.search.islands import IslandConfig
from cuco_kit.search.llm_source import LLMSource
from cuco_kit.search.population import Population, ProgramView
from cuco_kit.search.proposal import Proposal, ProposalContext
from cuco_kit.search.synthetic import BASELINE, write_synthetic_workload
from cuco_kit.store import Store

KERNEL_END = "static void launch_step("
# FIXTURE: an LSA helper (a peer's row through its LSA window) in the kernel block.
LSA_HELPER = ("__device__ float* peer_row(ncclWindow_t win, size_t offset, int peer) {\n"
              "  return (float*)ncclGetLsaPointer(win, offset, peer);\n}\n\n")
# FIXTURE: a GIN helper (a one-sided put to a peer, raising its signal) in the kernel block.
GIN_HELPER = ("__device__ void put_row(ncclGin& gin, ncclWindow_t dst, ncclWindow_t src, size_t offset, int peer) {\n"
              "  gin.put(ncclTeamWorld(gin.comm), peer, dst, offset, src, offset, 4096, ncclGin_SignalInc{0});\n}\n\n")
LSA = BASELINE.replace(KERNEL_END, LSA_HELPER + KERNEL_END)
GIN = BASELINE.replace(KERNEL_END, GIN_HELPER + KERNEL_END)


def test_api_type_comes_from_the_analysers_features() -> None:
    assert api_from_features({"uses_gin": True, "uses_lsa": True, "uses_device_api": True}) == "gin"
    assert api_from_features({"uses_lsa": True, "uses_device_api": True}) == "lsa"
    assert api_from_features({"uses_device_api": True}) == "lsa"
    assert api_from_features({"uses_host_collectives": True}) == "host"
    assert (api_type(BASELINE), api_type(LSA), api_type(GIN)) == ("host", "lsa", "gin")


def test_the_cell_carries_the_api_so_gin_and_lsa_designs_hold_cells_apart() -> None:
    cells = {code: cell_of(code, "symm")[1] for code in (BASELINE, LSA, GIN)}
    assert cells[LSA].startswith("backend=symm|api=lsa|") and cells[GIN].startswith("backend=symm|api=gin|")
    assert cells[BASELINE].startswith("backend=symm|api=host|")
    assert len(set(cells.values())) == 3


def test_island_config_names_one_api_per_island() -> None:
    with pytest.raises(BadInput, match="one per island"):
        IslandConfig(islands=3, api=["lsa", "gin"])
    with pytest.raises(BadInput, match="not an API type"):
        IslandConfig(islands=2, api=["lsa", "nvlink"])
    cfg = IslandConfig(islands=3, api=["lsa", "", "gin"])
    assert cfg.api_map() == {0: "lsa", 2: "gin"} and cfg.api_of(1) == ""


def _pop(cfg: IslandConfig) -> Population:
    pop = Population()
    pop.island_api = cfg.api_map()
    rows = [(1, BASELINE, "baseline", 0, 1.0), (2, LSA, "human", 0, 1.5), (3, LSA + "// b\n", "design_space", 1, 1.4),
            (4, GIN, "human", 2, 1.3), (5, GIN + "// c\n", "design_space", 3, 1.6)]
    for pid, code, source, island, fit in rows:
        pop.add(ProgramView(id=pid, code=code, parent_id=None, source=source, island=island,
                            result={"verdict": "pass", "speedup": fit}, fitness=fit))
    return pop


def test_migration_keeps_each_migrant_on_islands_of_its_api() -> None:
    cfg = IslandConfig(islands=4, migration_interval=1, api=["lsa", "lsa", "gin", "gin"])
    pop = _pop(cfg)
    # Members: the island's own programs of its type; the host baseline is a member of no typed island.
    assert [p.id for p in pop.island_members(0)] == [2] and [p.id for p in pop.island_members(3)] == [5]
    moves = islands.migrate(pop, 1, cfg)
    assert {(m["program_id"], m["from"], m["to"]) for m in moves} == {(2, 0, 1), (3, 1, 0), (4, 2, 3), (5, 3, 2)}
    for m in moves:
        assert pop.programs[m["program_id"]].api == cfg.api_of(m["to"])
    # Configured otherwise: the plain ring, whatever the type.
    cross = IslandConfig(islands=4, migration_interval=1, api=["lsa", "lsa", "gin", "gin"], cross_api_migration=True)
    moves = islands.migrate(_pop(cross), 1, cross)
    assert (3, 1, 2) in {(m["program_id"], m["from"], m["to"]) for m in moves}


def test_each_typed_island_has_its_own_system_prompt_file() -> None:
    cfg = IslandConfig(islands=3, api=["lsa", "gin", ""])
    lsa, gin, plain = (islands.system_prompt(i, cfg) for i in range(3))
    assert "**LSA** designs" in lsa and "**GIN** designs" in gin and "island" not in plain
    base = plain
    assert lsa.startswith(base) and gin.startswith(base) and "$" not in lsa + gin


class _Recorder:
    """A test source (no LLM): records the context of each proposal, proposes nothing."""

    kinds = ("diff",)

    def __init__(self) -> None:
        self.contexts: list[ProposalContext] = []

    def propose(self, ctx: ProposalContext) -> list[Proposal]:
        self.contexts.append(ctx)
        return []


def _search(tmp_path: Path, cfg: SearchConfig, sources: list, name: str = "api.db") -> tuple[SearchEngine, Store]:
    wl = tmp_path / "wl"
    if not wl.exists():
        write_synthetic_workload(wl)
    for f, code in (("lsa.cu", LSA), ("gin.cu", GIN)):
        (tmp_path / f).write_text(code)
    store = Store(tmp_path / name)
    return SearchEngine(wl, store, SimulatedEvaluator(seed=3, fail_rate=0.0), sources, cfg, EventBus()), store


def test_a_search_with_islands_per_api_type_fills_gin_and_lsa_cells(tmp_path: Path) -> None:
    # Islands 2 and 3 are GIN islands; only island 2 starts with a GIN program, island 3 gets GIN by migration.
    cfg = SearchConfig(seed=3, proposals_per_generation=8, budget=BudgetConfig(generations=4),
                       islands=IslandConfig(islands=4, migration_interval=1, api=["host", "lsa", "gin", "gin"]),
                       initial_programs=[str(tmp_path / "lsa.cu"), str(tmp_path / "gin.cu")])
    cfg.phases.explore.mix = {"design_space": 1.0}
    cfg.phases.exploit.mix = {"design_space": 1.0}
    # Where moves may go is the question here; these GIN designs do not beat the seed, and the re-measure rule
    # (search/remeasure.py) would keep them home.
    cfg.remeasure.migrants = False
    eng, store = _search(tmp_path, cfg, [DesignSpaceSource()])
    with store:
        summary = eng.run()
        progs = {p["id"]: p for p in store.programs(summary.run_id)}
        elites = eng.archive.cells()
        moves = store.get_meta(summary.run_id, "state")["migrations"]
    assert {cell.split("|")[1] for cell in elites} == {"api=lsa", "api=gin", "api=host"}
    assert sum(c.startswith("backend=nccl|api=gin|") for c in elites) >= 2  # GIN designs were searched
    for p in progs.values():  # a knob move keeps the API of its parent
        if p["parent_id"] is not None and p["source"] == "design_space":
            assert api_type(p["code"]) == api_type(progs[p["parent_id"]]["code"])
    for i, want in enumerate(cfg.islands.api):  # a typed island's members are of its type
        members = eng.population.island_members(i)
        assert members and {p.api for p in members} == {want}
    # Migrants went to islands of their type only: GIN from island 2 to island 3, none elsewhere.
    assert moves and {(m["from"], m["to"]) for m in moves} <= {(2, 3), (3, 2)}
    assert all(api_type(progs[m["program_id"]]["code"]) == "gin" for m in moves)
    assert any(eng.population.programs[i].api == "gin" for i in eng.population.extra_members.get(3, ()))


def test_proposals_on_a_typed_island_carry_its_system_prompt(tmp_path: Path) -> None:
    rec = _Recorder()
    cfg = SearchConfig(seed=1, proposals_per_generation=2, max_empty_generations=1,
                       budget=BudgetConfig(generations=1), islands=IslandConfig(islands=2, api=["lsa", "gin"]))
    cfg.phases.explore.mix = {"diff": 1.0}
    cfg.phases.exploit.mix = {"diff": 1.0}
    eng, store = _search(tmp_path, cfg, [rec])
    with store:
        eng.run()
    by_island = {c.island: c.system_prompt for c in rec.contexts}
    assert by_island == {0: islands.system_prompt(0, cfg.islands), 1: islands.system_prompt(1, cfg.islands)}
    assert "**GIN** designs" in by_island[1]


# FIXTURE: a model's diff that any of the three programs takes (its SEARCH text is in the shared kernel).
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


def test_llm_calls_from_a_typed_island_send_its_system_prompt(tmp_path: Path) -> None:
    """Against the fake OpenAI-compatible server (real HTTP, the real openai client, a labelled fixture answer)."""
    cfg = SearchConfig(seed=1, proposals_per_generation=3, budget=BudgetConfig(generations=1),
                       islands=IslandConfig(islands=3, api=["host", "lsa", "gin"]),
                       initial_programs=[str(tmp_path / "lsa.cu"), str(tmp_path / "gin.cu")])
    cfg.novelty.enabled = False
    cfg.diagnosis.enabled = False  # only the mutation calls here: each carries its island's system prompt
    cfg.meta.interval = 0
    cfg.phases.mode = "fixed"
    cfg.phases.explore.mix = {"diff": 1.0}
    with FakeOpenAIServer([answer("diff", STREAMING_DIFF, match="targeted edits", times=0)]) as srv:
        eng, store = _search(tmp_path, cfg, [LLMSource(OpenAICompatibleClient(srv.config()))])
        with store:
            eng.run()
            progs = store.programs(eng._rid)
        requests = [r.body for r in srv.chat_requests()]
    systems = {}
    for body in requests:
        msgs = body["messages"]
        parent = msgs[-1]["content"].split("```cuda\n", 1)[1].split("```", 1)[0]  # the parent's code
        api = api_type(parent)
        systems.setdefault(api, set()).add(msgs[0]["content"])
    assert systems == {a: {islands.system_prompt(i, cfg.islands)} for i, a in enumerate(cfg.islands.api)}
    children = [p for p in progs if p["source"] == "llm_diff"]
    assert {cfg.islands.api[p["island"]] for p in children} == {"host", "lsa", "gin"}
    assert all(api_type(p["code"]) == cfg.islands.api[p["island"]] and "fixture" in p["tags"] for p in children)
