"""`--mutator llm` end to end against the fake OpenAI-compatible server: real HTTP, the real openai client,
scripted answers labelled fixtures for diff, full-rewrite and crossover proposals, failures fed back into
later prompts, and an LLM meta-summary."""
from __future__ import annotations

from pathlib import Path

from cuco_kit.evaluate.simulated import SimulatedEvaluator
from cuco_kit.events import EventBus
from cuco_kit.llm.fake_server import FakeOpenAIServer, answer
from cuco_kit.llm.openai_client import OpenAICompatibleClient
from cuco_kit.search.budget import BudgetConfig
from cuco_kit.search.config import SearchConfig
from cuco_kit.search.engine import SearchEngine
from cuco_kit.search.llm_source import LLMSource, parse_header
from cuco_kit.search.meta import MetaConfig
from cuco_kit.search.synthetic import BASELINE, write_synthetic_workload
from cuco_kit.store import Store

LAUNCH = "    gather_chunks<<<64, kThreads, 0, stream>>>(x, y, n, c);"

BAD_DIFF = """NAME: more threads
RATIONALE: a wider block
TAGS: threads
<<<<<<< SEARCH
constexpr int kThreads = 256;                              // knob: {128, 256, 512}
=======
constexpr int kThreads = 384;                              // knob: {128, 256, 512}
>>>>>>> REPLACE
"""

GOOD_DIFF = """NAME: streaming stores
RATIONALE: y is not read again, so bypass L1 and keep L2 for the peers.
TAGS: memory
<<<<<<< SEARCH
    y[j] = x[j];
=======
    float v = __ldg(&x[j]);
    __stcs(&y[j], v);
>>>>>>> REPLACE
"""

FULL = "NAME: wider grid\nRATIONALE: more CTAs hide the put latency.\nTAGS: grid, placement\n```cuda\n" + \
    BASELINE.replace(LAUNCH, "    gather_chunks<<<256, kThreads, 0, stream>>>(x, y, n, c);\n"
                             "    cudaStreamQuery(stream);") + "```\n"

CROSS = "NAME: grid plus streaming\nRATIONALE: A's grid with B's stores.\nTAGS: crossover\n```cuda\n" + \
    BASELINE.replace(LAUNCH, "    gather_chunks<<<192, kThreads, 0, stream>>>(x, y, n, c);").replace(
        "    y[j] = x[j];\n", "    float w = x[j];\n    __stwt(&y[j], w);\n") + "```\n"

META = "- streaming stores won\n- knob values outside their sets fail at L0"


def test_parse_header() -> None:
    assert parse_header(GOOD_DIFF) == ("streaming stores", "y is not read again, so bypass L1 and keep L2 for "
                                       "the peers.", ["memory"])
    assert parse_header("no header") == ("", "", [])


def test_llm_mutator_end_to_end_with_fake_server(tmp_path: Path) -> None:
    wl = write_synthetic_workload(tmp_path / "wl")
    script = [
        answer("bad-diff", BAD_DIFF, match="targeted edits", times=1),
        answer("good-diff", GOOD_DIFF, match="targeted edits", times=0),
        answer("full", FULL, match="rewrite the program", times=0),
        answer("crossover", CROSS, match="combine the strengths", times=0),
        answer("meta", META, match="summarise what the search", times=0),
        answer("scratchpad", "Works: streaming stores", match="update the search's scratchpad", times=0),
        answer("recommend", "1. Try streaming stores on the best program", match="rank recommendations", times=0),
        # a diff whose SEARCH text the parent no longer has gets one retry; this fixture answers it with blocks
        answer("repair", FULL, match="could not be applied", times=0),
    ]
    store = Store(tmp_path / "llm.db")
    with FakeOpenAIServer(script) as srv:
        client = OpenAICompatibleClient(srv.config())
        # The simulated landscape is keyed on code hashes, so which parents win (and whether a slot draws a diff
        # on a parent that still has the SEARCH text) depends on the synthetic baseline's bytes; seed 1 draws
        # every kind on a parent it applies to with today's baseline.
        cfg = SearchConfig(seed=1, proposals_per_generation=3, budget=BudgetConfig(generations=3),
                           meta=MetaConfig(interval=2))
        cfg.novelty.enabled = False
        for s in (cfg.phases.explore, cfg.phases.exploit):
            s.mix = {"diff": 1.0, "full": 1.0, "crossover": 1.0}
        cfg.phases.mode = "fixed"
        eng = SearchEngine(wl, store, SimulatedEvaluator(seed=1), [LLMSource(client)], cfg, EventBus())
        # generation 1: diff, full, crossover slots; crossover has no second parent yet and falls back to diff
        eng.run()
        requests = srv.chat_requests()
    rid = eng.run_id
    progs = store.programs(rid)
    by_source: dict[str, list[dict]] = {}
    for p in progs:
        by_source.setdefault(p["source"], []).append(p)
    assert {"llm_diff", "llm_full", "llm_crossover"} <= set(by_source)
    for p in progs[2:]:
        assert "fixture" in p["tags"]  # answers from the fake server are labelled
    cross = by_source["llm_crossover"][0]
    assert cross["second_parent_id"] is not None and cross["second_parent_id"] != cross["parent_id"]
    assert "__stwt(&y[j], w);" in cross["code"] and cross["name"] == "grid plus streaming"
    full = by_source["llm_full"][0]
    assert "<<<256, kThreads" in full["code"] and full["name"] == "wider grid"
    diffs = {p["name"]: p for p in by_source["llm_diff"]}
    assert "__stcs(&y[j], v);" in diffs["streaming stores"]["code"]
    # the bad diff put a knob out of its set: a real L0 failure, stored with its reason ...
    bad = diffs["more threads"]
    bad_eval = store.evaluations(program_id=bad["id"])[0]
    assert (bad_eval["level_reached"], bad_eval["verdict"]) == ("L0", "fail")
    assert "not in its allowed set" in bad_eval["reason"]
    # ... and fed back: a later mutation prompt shows it under "Recent failures"
    mutate = [r for r in requests if "Task: summarise" not in str(r.body)]
    later = [r for r in mutate if f"program {bad['id']} (more threads)" in str(r.body)]
    assert later and "not in its allowed set" in str(later[0].body)
    # prompts carry inspirations from the archive once there are elites
    assert any("Other good programs" in str(r.body) and "### program" in str(r.body) for r in mutate)
    # the ledger recorded every call into the store, by purpose
    purposes = [c["purpose"] for c in store.llm_calls(rid)]
    assert {"search.mutate.diff", "search.mutate.full", "search.mutate.crossover", "search.meta.summary",
            "search.meta.scratchpad", "search.meta.recommend"} <= set(purposes)
    assert all(c["ok"] for c in store.llm_calls(rid))
    meta = store.get_meta(rid, "meta_summary")
    assert meta["method"] == "llm" and "streaming stores won" in meta["summary"]
    assert "Works: streaming stores" in meta["text"] and meta["recommendations"] == [
        "Try streaming stores on the best program"]
    assert len([e for e in store.evaluations(run_id=rid) if e["verdict"] == "pass"]) >= 4


def test_prompts_load_and_name_a_missing_placeholder() -> None:
    import pytest

    from cuco_kit import prompts
    from cuco_kit.errors import BadInput

    assert {"search_system", "search_diff", "search_full", "search_crossover", "search_meta",
            "search_meta_scratchpad", "search_meta_recommend", "search_diagnose"} <= set(
        prompts.names())
    assert "parent_code" in prompts.placeholders("search_diff")
    assert "second_parent_code" in prompts.placeholders("search_crossover")
    with pytest.raises(BadInput, match="recent_programs"):
        prompts.render("search_meta", workload="w", backend="b", world_size=1, generation=1, statistics="s")
    text = prompts.render("search_meta", workload="w", backend="symm", world_size=4, generation=2,
                          statistics="STATS{}", recent_programs="-")
    assert "STATS{}" in text and "$" not in text.split("##")[0]
