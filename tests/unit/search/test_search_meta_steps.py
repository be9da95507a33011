"""The three-step meta-summary (summarise recent programs, update the persistent scratchpad, rank
recommendations) against the fake OpenAI-compatible server (real HTTP, the real openai client) serving SCRIPTED
answers labelled as fixtures. Two fake models: the server records the model each request named, so the tests tell
the mutation model's calls from the meta model's. The scratchpad carries across rounds and a resume; the reasoning
panel shows all three steps, escaped."""
from __future__ import annotations

from pathlib import Path

from cuco_kit.evaluate.simulated import SimulatedEvaluator
from cuco_kit.events import EventBus
from cuco_kit.llm.fake_server import FakeOpenAIServer, Scripted, answer
from cuco_kit.search.budget import BudgetConfig
from cuco_kit.search.config import SearchConfig
from cuco_kit.search.engine import SearchEngine
from cuco_kit.search.llm_source import LLMSource
from cuco_kit.search.meta import MetaConfig, ranked
from cuco_kit.search.models import ModelsConfig, ModelSpec
from cuco_kit.search.synthetic import BASELINE, write_synthetic_workload
from cuco_kit.store import Store
from cuco_kit.widgets import ReasoningPanel

MUTATOR, META_MODEL = "big-coder", "cheap-meta"
STEP1, STEP2, STEP3 = "(step 1 of 3)", "(step 2 of 3)", "(step 3 of 3)"  # phrases only each step's prompt carries
LAUNCH = "    gather_chunks<<<64, kThreads, 0, stream>>>(x, y, n, c);"


def _full(grid: int) -> str:  # FIXTURE: a block-wise rewrite, as a model answers the full-rewrite prompt
    return (f"NAME: grid {grid}\nRATIONALE: {grid} CTAs.\nTAGS: grid\n```cuda\n"
            + BASELINE.replace(LAUNCH, f"    gather_chunks<<<{grid}, kThreads, 0, stream>>>(x, y, n, c);") + "```\n")


# FIXTURE answers of the meta model, one per step and round (round 1's, then round 2's).
SUMMARY = ["- grid 128 passed; wider grids look faster", "- grid 512 <b>failed</b> nothing; grid 32 slower"]
PAD = ["Works: wider grids\nFails or slows: none yet\nOpen questions: chunking",
       "Works: wider grids up to 512\nFails or slows: grid 32 is slow\nOpen questions: chunking"]
RECS = ["1. Try grid 256 on the best program\n2. Try chunking",
        "1. Chunk the gather in four\n2. Try grid 1024 <script>\n3. Keep kThreads at 256"]


def _script(rounds: int) -> list[Scripted]:
    out = [answer(f"full-{g}", _full(g), match="rewrite the program", times=1) for g in (128, 32, 512, 1024, 256)]
    for i in range(rounds):
        out += [answer(f"summary-{i}", SUMMARY[i], match=STEP1), answer(f"pad-{i}", PAD[i], match=STEP2),
                answer(f"recs-{i}", RECS[i], match=STEP3)]
    return out


def _engine(wl: Path, store: Store, srv: FakeOpenAIServer, generations: int) -> SearchEngine:
    cfg = SearchConfig(seed=2, proposals_per_generation=1, budget=BudgetConfig(generations=generations),
                       meta=MetaConfig(interval=1),
                       models=ModelsConfig(mutation=[ModelSpec(MUTATOR, base_url=srv.base_url)],
                                           meta=ModelSpec(META_MODEL, base_url=srv.base_url, price=(0.1, 0.4))))
    cfg.novelty.enabled = False
    cfg.diagnosis.enabled = False
    for s in (cfg.phases.explore, cfg.phases.exploit):
        s.mix = {"full": 1.0}
    cfg.phases.mode = "fixed"
    source = LLMSource.from_models(cfg.models, srv.config(max_retries=0, timeout_s=10.0))
    return SearchEngine(wl, store, SimulatedEvaluator(seed=2), [source], cfg, EventBus())


def _user(r) -> str:
    return str(r.body["messages"][-1]["content"])


def test_three_steps_each_asked_of_the_meta_model_with_a_scratchpad_carried_across_a_resume(tmp_path: Path) -> None:
    wl = write_synthetic_workload(tmp_path / "wl")
    db = tmp_path / "meta.db"
    with Store(db) as store, FakeOpenAIServer(_script(1)) as srv:
        eng = _engine(wl, store, srv, generations=1)
        eng.run()
        first = srv.chat_requests()
        rid = eng.run_id
        assert rid is not None
        stored = store.get_meta(rid, "meta_summary")
    meta_calls = [r for r in first if any(s in _user(r) for s in (STEP1, STEP2, STEP3))]
    assert [next(s for s in (STEP1, STEP2, STEP3) if s in _user(r)) for r in meta_calls] == [STEP1, STEP2, STEP3]
    assert {r.body["model"] for r in meta_calls} == {META_MODEL}
    assert {r.body["model"] for r in first if r not in meta_calls} == {MUTATOR}
    assert "grid 128" in _user(meta_calls[0])  # step 1 sees the recent program
    assert SUMMARY[0] in _user(meta_calls[1]) and "(empty: this is the first update)" in _user(meta_calls[1])
    assert PAD[0] in _user(meta_calls[2])  # step 3 ranks from the updated scratchpad
    assert stored["method"] == "llm" and stored["generation"] == 1
    assert (stored["summary"], stored["scratchpad"]) == (SUMMARY[0], PAD[0])
    assert stored["recommendations"] == ["Try grid 256 on the best program", "Try chunking"]

    # A second session resumes the run: its step 2 starts from the stored scratchpad, and the mutation prompt of
    # generation 2 carries the scratchpad and the ranked recommendations.
    with Store(db) as store, FakeOpenAIServer(_script(2)[:5] + _script(2)[-3:]) as srv:
        eng = _engine(wl, store, srv, generations=2)
        eng.run()
        second = srv.chat_requests()
        assert eng.run_id == rid
        stored = store.get_meta(rid, "meta_summary")
        purposes = {c["purpose"] for c in store.llm_calls(rid)}
    step2 = next(r for r in second if STEP2 in _user(r))
    assert PAD[0] in _user(step2) and SUMMARY[1] in _user(step2)
    mutate = next(r for r in second if "rewrite the program" in _user(r))
    assert PAD[0] in _user(mutate) and "1. Try grid 256 on the best program" in _user(mutate)
    assert stored["scratchpad"] == PAD[1] and stored["generation"] == 2
    assert stored["recommendations"][0] == "Chunk the gather in four"
    assert {f"search.meta.{s}@{META_MODEL}" for s in ("summary", "scratchpad", "recommend")} <= purposes

    # The workbench's reasoning panel shows the three steps, escaped.
    with Store(db, readonly=True) as store:
        html = ReasoningPanel(store, rid).body.value
    assert "Ranked recommendations" in html and "Scratchpad" in html and "Summary of recent programs" in html
    assert "<li>Try grid 1024 &lt;script&gt;</li>" in html and "<script>" not in html
    assert "grid 32 is slow" in html and "&lt;b&gt;failed&lt;/b&gt;" in html
    assert html.index("Chunk the gather") < html.index("Try grid 1024") < html.index("Keep kThreads")


def test_ranked_reads_numbered_and_bulleted_lists() -> None:
    assert ranked("Here:\n1. a\n2) b\n- c\n") == ["a", "b", "c"]
    assert ranked("just one idea\n\n") == ["just one idea"]
