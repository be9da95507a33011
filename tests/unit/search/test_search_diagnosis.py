"""LLM diagnoses of failed and slow evaluations, against the fake OpenAI-compatible server (real HTTP, the real
openai client) serving SCRIPTED answers labelled as fixtures. Two fake models: the server records the model each
request named, so the tests tell the mutation model's calls from the diagnosis model's."""
from __future__ import annotations

from pathlib import Path

from cuco_kit.evaluate.simulated import SimulatedEvaluator
from cuco_kit.events import EventBus
from cuco_kit.llm.fake_server import FakeOpenAIServer, answer
from cuco_kit.search import diagnosis
from cuco_kit.search.budget import BudgetConfig
from cuco_kit.search.config import SearchConfig
from cuco_kit.search.engine import SearchEngine
from cuco_kit.search.llm_source import LLMSource, result_line
from cuco_kit.search.meta import MetaConfig
from cuco_kit.search.models import ModelsConfig, ModelSpec
from cuco_kit.search.population import Population, ProgramView
from cuco_kit.search.synthetic import write_synthetic_workload
from cuco_kit.store import Store

MUTATOR, DIAGNOSER = "big-coder", "cheap-diag"
ASKS_DIAGNOSIS = "diagnose one evaluation"  # a phrase only the diagnosis prompt carries
ASKS_DIFF = "targeted edits"

# FIXTURE answers, written the way models answer these prompts.
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
RATIONALE: y is not read again, so bypass L1.
TAGS: memory
<<<<<<< SEARCH
    y[j] = x[j];
=======
    float v = __ldg(&x[j]);
    __stcs(&y[j], v);
>>>>>>> REPLACE
"""
DIAGNOSIS = ("CAUSE: kThreads = 384 is outside the knob's allowed set {128, 256, 512}.\n"
             "EVIDENCE: L0 says the value is not in its allowed set.\n"
             "FIX: keep kThreads at one of 128, 256, 512.")


def _models(srv: FakeOpenAIServer) -> ModelsConfig:
    return ModelsConfig(mutation=[ModelSpec(MUTATOR, base_url=srv.base_url, price=(2.0, 8.0))],
                        diagnosis=ModelSpec(DIAGNOSER, base_url=srv.base_url, price=(0.1, 0.4)))


def _search(tmp_path: Path, *, enabled: bool) -> tuple[Store, int, list]:
    wl = write_synthetic_workload(tmp_path / "wl")
    script = [answer("bad-diff", BAD_DIFF, match=ASKS_DIFF, times=1),
              answer("good-diff", GOOD_DIFF, match=ASKS_DIFF, times=0),
              answer("diagnosis", DIAGNOSIS, match=ASKS_DIAGNOSIS, times=0)]
    store = Store(tmp_path / "diag.db")
    with FakeOpenAIServer(script) as srv:
        cfg = SearchConfig(seed=1, proposals_per_generation=2, budget=BudgetConfig(generations=2),
                           meta=MetaConfig(interval=0), models=_models(srv))
        cfg.novelty.enabled = False
        cfg.diagnosis.enabled = enabled
        for s in (cfg.phases.explore, cfg.phases.exploit):
            s.mix = {"diff": 1.0}
        cfg.phases.mode = "fixed"
        source = LLMSource.from_models(cfg.models, srv.config(max_retries=0, timeout_s=10.0))
        eng = SearchEngine(wl, store, SimulatedEvaluator(seed=1), [source], cfg, EventBus())
        eng.run()
        requests = srv.chat_requests()
    assert eng.run_id is not None
    return store, eng.run_id, requests


def _last_user(r) -> str:
    return str(r.body["messages"][-1]["content"])


def test_a_failed_evaluation_is_diagnosed_by_its_own_model_stored_and_fed_to_later_prompts(tmp_path: Path) -> None:
    store, rid, requests = _search(tmp_path, enabled=True)
    asked = [(r.body["model"], ASKS_DIAGNOSIS in _last_user(r)) for r in requests]
    assert any(diag for _, diag in asked)
    assert all(model == (DIAGNOSER if diag else MUTATOR) for model, diag in asked)  # each role its own model
    bad = next(p for p in store.programs(rid) if p["name"] == "more threads")
    stored = store.get_meta(rid, f"{diagnosis.KEY_PREFIX}{bad['id']}")
    assert stored["kind"] == "failed" and stored["text"] == DIAGNOSIS and stored["fixture"] is True
    # the diagnosis prompt showed the change and the evaluation's reason
    first = next(_last_user(r) for r in requests if ASKS_DIAGNOSIS in _last_user(r))
    assert "kThreads = 384" in first and "not in its allowed set" in first and "FAILED" in first
    # a mutation prompt asked after the diagnosis shows it under the lineage's failures
    i = next(i for i, (_, diag) in enumerate(asked) if diag)
    later = [_last_user(r) for r in requests[i + 1:] if ASKS_DIFF in _last_user(r)]
    assert later and all("diagnosis:\n    CAUSE: kThreads = 384" in text for text in later)
    # each call counts in the run's ledger, priced at the diagnosis model's price
    rows = [c for c in store.llm_calls(rid) if c["purpose"] == f"{diagnosis.PURPOSE}@{DIAGNOSER}"]
    assert rows and all(c["ok"] and c["dollars"] and c["dollars"] > 0 for c in rows)
    # a resumed engine reads the diagnosis back onto the program
    assert diagnosis.load(store, rid)[bad["id"]].text == DIAGNOSIS


def test_the_off_switch_asks_no_diagnosis(tmp_path: Path) -> None:
    store, rid, requests = _search(tmp_path, enabled=False)
    assert not any(ASKS_DIAGNOSIS in _last_user(r) for r in requests)
    assert diagnosis.load(store, rid) == {}
    later = [_last_user(r) for r in requests[2:]]
    assert later and any("not in its allowed set" in t for t in later)  # the raw failure text, as before
    assert not any("diagnosis:" in t for t in later)


def _view(pid: int, parent: int | None, fitness: float | None, verdict: str = "pass", **kw: object) -> ProgramView:
    p = ProgramView(id=pid, code=f"int x = {pid};\n", parent_id=parent, source=str(kw.get("source", "llm_diff")),
                    name=f"p{pid}")
    p.result = {"verdict": verdict, "level_reached": "L3" if verdict == "pass" else "L2", "reason": "",
                "speedup": fitness, "median_ms": 1.0, "logs": {"rank0": "timing: 1.0 ms"},
                "provenance": dict(kw.get("provenance", {}))}  # type: ignore[call-overload]
    p.fitness = fitness
    return p


def test_slow_means_below_the_parents_ratio_and_the_diagnosis_reaches_its_childrens_prompt(tmp_path: Path) -> None:
    pop = Population()
    for p in (_view(1, None, 1.0, source="baseline"), _view(2, 1, 1.2), _view(3, 2, 1.1), _view(4, 2, 1.3),
              _view(5, 2, None, "fail"), _view(6, 2, None, "error", provenance={"infrastructure_error": True}),
              _view(7, 2, None, "unavailable")):
        pop.add(p)
    kinds = {p.id: diagnosis.kind_of(p, pop.get(p.parent_id)) for p in pop.all()}
    assert kinds == {1: None, 2: None, 3: "slow", 4: None, 5: "failed", 6: None, 7: None}
    slow_answer = "CAUSE: the extra __syncthreads in the loop.\nFIX: drop it."
    with Store(tmp_path / "s.db") as store, FakeOpenAIServer(
            [answer("diagnosis", slow_answer, match=ASKS_DIAGNOSIS, times=0)]) as srv:
        rid = store.create_run(workload="w", config={})
        source = LLMSource.from_models(_models(srv), srv.config(max_retries=0, timeout_s=10.0))
        client, model = source.role_client("diagnosis")
        got = diagnosis.Diagnoser(diagnosis.DiagnosisConfig(max_per_round=1), client, model, store,
                                  rid).diagnose(pop, [3, 5], generation=2)
        assert [g.program_id for g in got] == [5]  # newest first, max_per_round at most
        got += diagnosis.Diagnoser(diagnosis.DiagnosisConfig(), client, model, store, rid).diagnose(pop, [3, 5], 2)
        assert [g.program_id for g in got] == [5, 3]  # program 5 has one already: not asked again
        bodies = [r.body for r in srv.chat_requests()]
        assert set(diagnosis.load(store, rid)) == {3, 5}
    assert len(bodies) == 2 and all(b["model"] == DIAGNOSER for b in bodies)
    assert "SLOWER than its parent: 1.100x the seed against the parent's 1.200x" in bodies[1]["messages"][-1][
        "content"]
    assert pop.programs[3].diagnosis == slow_answer
    assert "Diagnosis of this result:\n  CAUSE: the extra __syncthreads" in result_line(pop.programs[3])
    assert result_line(pop.programs[4]) == pop.programs[4].summary()
