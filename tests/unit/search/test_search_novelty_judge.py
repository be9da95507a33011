"""The LLM novelty judge after the similarity filter, against the fake OpenAI-compatible server (real HTTP, the real
openai client) serving SCRIPTED answers labelled as fixtures. Two fake models: the server records the model each
request named, so the tests tell the mutation model's calls from the judge's. The judge is off by default, asked
only about candidates the filter calls near-duplicates, and its verdict and reason are stored."""
from __future__ import annotations

from pathlib import Path

from cuco_kit.evaluate.simulated import SimulatedEvaluator
from cuco_kit.events import EventBus
from cuco_kit.llm.fake_server import FakeOpenAIServer, answer
from cuco_kit.search import novelty_judge
from cuco_kit.search.budget import BudgetConfig
from cuco_kit.search.config import SearchConfig
from cuco_kit.search.engine import SearchEngine
from cuco_kit.search.llm_source import NOTES_KEY, LLMSource
from cuco_kit.search.meta import MetaConfig
from cuco_kit.search.models import ModelsConfig, ModelSpec
from cuco_kit.search.novelty import NoveltyConfig, NoveltyFilter
from cuco_kit.search.population import Population, ProgramView
from cuco_kit.search.reasoning import reasoning_state
from cuco_kit.search.synthetic import BASELINE, write_synthetic_workload
from cuco_kit.store import Store
from cuco_kit.widgets import ReasoningPanel

MUTATOR, JUDGE = "big-coder", "cheap-judge"
ASKS_JUDGE = "judge whether a candidate is new"  # a phrase only the judge's prompt carries
NEAR = dict(threshold=0.9, min_new_ngrams=0)  # a filter strict enough that one-line edits are "near"

# FIXTURE answers, written as models answer these prompts.
COMMENT_ONLY = """NAME: document the copy
RATIONALE: explain the loop.
TAGS: docs
<<<<<<< SEARCH
    y[j] = x[j];
=======
    y[j] = x[j];  // copy one element
>>>>>>> REPLACE
"""
STREAMING = """NAME: streaming stores
RATIONALE: y is not read again, so bypass L1.
TAGS: memory
<<<<<<< SEARCH
    y[j] = x[j];
=======
    __stcs(&y[j], x[j]);
>>>>>>> REPLACE
"""
DUPLICATE = "VERDICT: DUPLICATE\nREASON: only a comment was added; the kernel does the same work."
NOVEL = "VERDICT: NOVEL\nREASON: streaming stores change the cache policy of every write."


def _models(srv: FakeOpenAIServer) -> ModelsConfig:
    return ModelsConfig(mutation=[ModelSpec(MUTATOR, base_url=srv.base_url)],
                        novelty_judge=ModelSpec(JUDGE, base_url=srv.base_url, price=(0.1, 0.4)))


def _user(r) -> str:
    return str(r.body["messages"][-1]["content"])


def test_off_by_default() -> None:
    assert NoveltyConfig().llm_judge is False and SearchConfig().novelty.llm_judge is False


def test_the_judge_is_asked_about_near_duplicates_only_once_each_and_its_verdict_is_stored(tmp_path: Path) -> None:
    pop = Population()
    pop.add(ProgramView(id=1, code=BASELINE, parent_id=None, source="baseline", name="baseline"))
    near = BASELINE.replace("    y[j] = x[j];\n", "    __stcs(&y[j], x[j]);\n")
    far = BASELINE.split("// EVOLVE-BLOCK-START kernel")[0] + "int totally_different(){return 0;}\n"
    cfg = NoveltyConfig(llm_judge=True, **NEAR)  # type: ignore[arg-type]
    filt = NoveltyFilter(cfg)
    assert not filt.check(near, None, "llm_diff", pop).novel  # the filter alone rejects it
    with Store(tmp_path / "j.db") as store, FakeOpenAIServer([answer("judge", NOVEL, match=ASKS_JUDGE)]) as srv:
        rid = store.create_run(workload="w", config={})
        client, model = LLMSource.from_models(_models(srv), srv.config(max_retries=0)).role_client("novelty_judge")
        filt.judge = novelty_judge.NoveltyJudge(cfg, client, model, store, rid, workload="w")
        v = filt.check(near, None, "llm_diff", pop)
        again = filt.check(near, None, "llm_diff", pop)  # the same candidate: not asked twice
        assert filt.check(far, None, "llm_diff", pop).novel  # novel by the filter: never sent to the judge
        bodies = [r.body for r in srv.chat_requests()]
        stored = store.get_meta(rid, novelty_judge.KEY)
    assert v.novel and v.judge == "novel" and "cache policy" in v.judge_reason and v.tags() == ["novelty-judge:novel"]
    assert again == v
    assert len(bodies) == 1 and bodies[0]["model"] == JUDGE
    assert "__stcs(&y[j], x[j]);" in bodies[0]["messages"][-1]["content"]  # the judge sees the change
    assert [(r["verdict"], r["nearest_id"], r["fixture"]) for r in stored] == [("novel", 1, True)]
    assert "cache policy" in stored[0]["reason"]


def test_in_a_search_the_judge_rejects_a_rewording_and_lets_a_real_change_through(tmp_path: Path) -> None:
    wl = write_synthetic_workload(tmp_path / "wl")
    script = [answer("comment-only", COMMENT_ONLY, match="targeted edits", times=1),
              answer("streaming", STREAMING, match="Your proposal was not used", times=1),
              answer("judge-duplicate", DUPLICATE, match=ASKS_JUDGE, times=1),
              answer("judge-novel", NOVEL, match=ASKS_JUDGE, times=1)]
    with Store(tmp_path / "s.db") as store, FakeOpenAIServer(script) as srv:
        cfg = SearchConfig(seed=3, proposals_per_generation=1, budget=BudgetConfig(generations=1),
                           meta=MetaConfig(interval=0), models=_models(srv),
                           novelty=NoveltyConfig(llm_judge=True, **NEAR))  # type: ignore[arg-type]
        cfg.diagnosis.enabled = False
        for s in (cfg.phases.explore, cfg.phases.exploit):
            s.mix = {"diff": 1.0}
        cfg.phases.mode = "fixed"
        source = LLMSource.from_models(cfg.models, srv.config(max_retries=0, timeout_s=10.0))
        eng = SearchEngine(wl, store, SimulatedEvaluator(seed=3), [source], cfg, EventBus())
        eng.run()
        asked = [(r.body["model"], ASKS_JUDGE in _user(r)) for r in srv.chat_requests()]
        rid = eng.run_id
        assert rid is not None
        stored = store.get_meta(rid, novelty_judge.KEY)
        notes = store.get_meta(rid, NOTES_KEY)
        proposals = store.proposals(rid)
        calls = store.llm_calls(rid)
        state = reasoning_state(store, rid)
        html = ReasoningPanel(store, rid).body.value
    # mutation, judge (duplicate), resample, judge (novel): each role its own model, each verdict asked once
    assert asked == [(MUTATOR, False), (JUDGE, True), (MUTATOR, False), (JUDGE, True)]
    assert [r["verdict"] for r in stored] == ["duplicate", "novel"]
    assert any(n["what"] == "resample: not novel" and "the novelty judge agrees: only a comment" in n["reason"]
               for n in notes)
    (prop,) = proposals
    assert prop["name"] == "streaming stores" and "novelty-judge:novel" in prop["tags"]
    assert sum(c["purpose"] == f"{novelty_judge.PURPOSE}@{JUDGE}" for c in calls) == 2  # in the run's ledger
    assert [j["verdict"] for j in state["novelty_judgements"]] == ["duplicate", "novel"]
    assert "Novelty judge" in html and "cache policy of every write" in html  # shown in the reasoning panel
