"""LLM proposals that survive real answers: block-wise splicing, whitespace-tolerant and unified-diff edits, answer
sizing, the model bandit, two fake models of different price and quality (fake server, answers labelled
fixtures), the per-run dollar budget, and the scripted client that needs no openai package."""
from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from cuco_kit.evaluate.simulated import SimulatedEvaluator
from cuco_kit.llm.client import LLMTruncated
from cuco_kit.llm.fake_server import FakeOpenAIServer, answer, truncated
from cuco_kit.llm.openai_client import LLMConfig
from cuco_kit.llm.scripted import ScriptedClient
from cuco_kit.search import bandit
from cuco_kit.search.block_answer import BlockAnswerError, answer_token_cap, evolve_chars, splice
from cuco_kit.search.budget import BudgetConfig
from cuco_kit.search.config import SearchConfig
from cuco_kit.search.engine import SearchEngine
from cuco_kit.search.llm_source import LLMSource, apply_answer
from cuco_kit.search.model_stats import ModelRole, model_roles, role_of, split_purpose
from cuco_kit.search.models import ModelsConfig, ModelSpec
from cuco_kit.search.synthetic import BASELINE, KNOB_SETS, write_synthetic_workload
from cuco_kit.source import markers, patch
from cuco_kit.store import Store

MOE = Path(__file__).resolve().parents[3] / "sample_kernels" / "moe_dispatch_combine" / "device_lsa.cu"


def _knob_block(values: dict[str, str]) -> str:
    """The synthetic baseline's knob block with ``values`` (a model's block-wise answer)."""
    kb = next(b for b in markers.blocks(BASELINE) if b.name == "knobs").text
    for name, value in values.items():
        old = next(line for line in kb.split("\n") if f" {name} = " in line)
        head, _, rest = old.partition(" = ")
        kb = kb.replace(old, f"{head} = {value};{rest.partition(';')[2]}")
    return f"// EVOLVE-BLOCK-START knobs\n{kb}// EVOLVE-BLOCK-END"


def test_splice_takes_blocks_from_prose_and_several_fences_and_keeps_frozen_bytes() -> None:
    moe = MOE.read_text()
    tuning = next(b for b in markers.blocks(moe) if b.name == "tuning")
    new_tuning = tuning.text.replace("kLoadBatch = 4;", "kLoadBatch = 8;")
    ans = ("I would change the tuning.\n\n```cuda\n// EVOLVE-BLOCK-START tuning\n"
           f"{new_tuning}// EVOLVE-BLOCK-END\n```\nThat is all.\n")
    s = splice(moe, ans)
    assert s.blocks == ("tuning",) and "kLoadBatch = 8;" in s.code
    assert markers.frozen_hash(s.code) == markers.frozen_hash(moe) and s.code.count("\n") == moe.count("\n")
    # the whole file back with a frozen line reworded: the parent's frozen text is kept, and that is noted
    drift = moe.replace("kLoadBatch = 4;", "kLoadBatch = 2;").replace("// Flags per source", "// Flag count per src")
    s2 = splice(moe, f"```cuda\n{drift}```")
    assert "kLoadBatch = 2;" in s2.code and markers.frozen_hash(s2.code) == markers.frozen_hash(moe)
    assert s2.notes and "parent's was kept" in s2.notes[0]


def test_splice_refuses_unknown_and_misplaced_blocks() -> None:
    moe = MOE.read_text()
    with pytest.raises(BlockAnswerError, match="does not have"):
        splice(moe, "```cuda\n// EVOLVE-BLOCK-START nope\nint x;\n// EVOLVE-BLOCK-END\n```")
    tuning = next(b for b in markers.blocks(moe) if b.name == "tuning").text
    with pytest.raises(BlockAnswerError, match="is block 'tuning'"):
        splice(moe, f"```cuda\n// EVOLVE-BLOCK-START knobs\n{tuning.replace('256', '128')}// EVOLVE-BLOCK-END\n```")


def test_edits_match_ignoring_whitespace_and_unified_diffs_become_edits() -> None:
    drifted = "<<<<<<< SEARCH\n   y[j]  =  x[j];\t\n=======\n    y[j] = 2.0f * x[j];\n>>>>>>> REPLACE\n"
    with pytest.raises(patch.PatchError, match="if whitespace is ignored"):
        patch.apply_proposal(BASELINE, drifted)  # strict (a person's edit) still says where it would match
    code, shape, _ = apply_answer(BASELINE, drifted)
    assert shape == "diff" and "y[j] = 2.0f * x[j];" in code and "y[j] = x[j];" not in code
    udiff = ("```diff\n@@ -30,3 +30,3 @@\n   for (long j = begin + i; j < end; j += (long)gridDim.x * blockDim.x) {\n"
             "-    y[j] = x[j];\n+    y[j] = x[j] + 0.0f;\n   }\n```\n")
    code, shape, notes = apply_answer(BASELINE, udiff)
    assert "y[j] = x[j] + 0.0f;" in code and notes == ["a unified diff, applied as SEARCH/REPLACE edits"]
    near = patch.nearest_lines(BASELINE, "    y[k] = x[k];")
    assert "y[j] = x[j];" in near and "|" in near


def test_answer_cap_follows_what_is_asked() -> None:
    moe = MOE.read_text()
    cap = answer_token_cap(evolve_chars(moe))
    # every MoE block back at 3 characters a token, plus prose: more than the old fixed 8192 would need to fit
    assert cap > evolve_chars(moe) / 3 and cap > answer_token_cap(evolve_chars(BASELINE))
    assert answer_token_cap(10**6, limit=4000) == 4000
    assert answer_token_cap(10, extra_tokens=8192) >= 8192


def test_bandit_prefers_improvement_per_dollar_and_tries_every_arm() -> None:
    rows = [ModelRole("a", "mutation", calls=5, dollars=1.0, improvement=0.5),
            ModelRole("b", "mutation", calls=5, dollars=0.1, improvement=0.2)]
    assert bandit.choose(["a", "b"], rows, c=0.0) == "b"  # 2.0 per dollar beats 0.5
    assert bandit.choose(["a", "b", "c"], rows, c=0.0) == "c"  # never tried: first
    arms = bandit.arms(["a", "b"], rows, 0.5)
    assert arms[1].value == 1.0 and 0 < arms[0].value < 1 and arms[0].bonus == arms[1].bonus > 0
    unpriced = [ModelRole("a", "mutation", calls=1, unpriced_tokens=10**6, improvement=1.0)]
    assert bandit.arms(["a"], unpriced, 0.0)[0].dollars == bandit.UNKNOWN_PRICE_PER_MTOK  # never free


def test_model_roles_count_calls_retries_and_wins() -> None:
    calls = [{"purpose": "search.mutate.diff@m1", "model": "fixture-x", "ok": True, "prompt_tokens": 10,
              "completion_tokens": 5, "dollars": 0.01},
             {"purpose": "search.mutate.diff.repair.patch@m1", "model": "fixture-y", "ok": True, "prompt_tokens": 10,
              "completion_tokens": 5, "dollars": None},
             {"purpose": "search.meta", "model": "gpt-x", "ok": False, "prompt_tokens": 0, "completion_tokens": 0,
              "dollars": 0.0}]
    progs = [{"id": 3, "parent_id": 1, "tags": ["model:m1"]}, {"id": 4, "parent_id": 1, "tags": ["model:m1"]}]
    rows = {(r.model, r.role): r for r in model_roles(calls, progs, {1: 1.0, 3: 1.5, 4: None})}
    m1 = rows[("m1", "mutation")]
    assert (m1.calls, m1.answers, m1.retries, m1.unpriced_tokens, m1.programs, m1.wins) == (2, 2, 1, 15, 2, 1)
    assert m1.win_rate == 0.5 and m1.improvement == pytest.approx(0.5)
    assert rows[("gpt-x", "meta")].answers == 0
    assert split_purpose("search.mutate.full@a@b") == ("search.mutate.full@a", "b")


def _two_model_run(tmp_path: Path) -> tuple[Store, int, SimulatedEvaluator]:
    wl = write_synthetic_workload(tmp_path / "wl")
    ev = SimulatedEvaluator(seed=3, fail_rate=0.0)
    combos = [dict(zip(KNOB_SETS, vals)) for vals in itertools.product(*KNOB_SETS.values())]
    combos.sort(key=lambda k: ev.true_ms(k))
    good = [answer(f"good-{i}", f"NAME: fast combo {i}\nRATIONALE: measured design.\nTAGS: knobs\n```cuda\n"
                                f"{_knob_block(k)}\n```\n") for i, k in enumerate(combos[:16])]
    bad = [answer("bad", "NAME: wide\nRATIONALE: guess.\nTAGS: knobs\n```cuda\n"
                         + _knob_block({"kThreads": "300"}) + "\n```\n", times=0)]
    store = Store(tmp_path / "two.db")
    with FakeOpenAIServer(bad) as cheap, FakeOpenAIServer(good) as dear:
        models = ModelsConfig(mutation=[ModelSpec("cheap-bad", base_url=cheap.base_url, price=(0.5, 0.5)),
                                        ModelSpec("dear-good", base_url=dear.base_url, price=(2.0, 2.0))],
                              bandit_c=0.5)
        cfg = SearchConfig(seed=0, proposals_per_generation=2, budget=BudgetConfig(generations=4), models=models)
        cfg.meta.interval = 0
        cfg.phases.mode = "fixed"
        for s in (cfg.phases.explore, cfg.phases.exploit):
            s.mix = {"full": 1.0}
        src = LLMSource.from_models(models, LLMConfig(api_key="fixture-key", max_retries=0))
        eng = SearchEngine(wl, store, ev, [src], cfg)
        eng.run()
    return store, eng.run_id or 0, ev


def test_two_fake_models_bandit_shifts_to_the_better_one_per_dollar(tmp_path: Path) -> None:
    store, rid, _ = _two_model_run(tmp_path)
    calls = store.llm_calls(rid)
    mutation = [c for c in calls if role_of(c["purpose"]) == "mutation"]  # side roles use the first model too
    by_model = {m: sum(split_purpose(c["purpose"])[1] == m for c in mutation) for m in ("cheap-bad", "dear-good")}
    assert by_model["cheap-bad"] >= 1 and by_model["dear-good"] >= 3 * by_model["cheap-bad"], by_model
    rows = {r.model: r for r in model_roles(calls, store.programs(rid),
                                            {p["id"]: None for p in store.programs(rid)}) if r.role == "mutation"}
    assert rows["dear-good"].dollars > 0 and rows["cheap-bad"].dollars > 0  # both priced from the config
    assert all("fixture" in p["tags"] for p in store.programs(rid) if p["source"].startswith("llm"))


def test_the_run_budget_stops_at_the_limit_and_resume_loses_nothing(tmp_path: Path) -> None:
    wl = write_synthetic_workload(tmp_path / "wl")
    script = [answer("grid", "NAME: n\nRATIONALE: r\nTAGS: t\n```cuda\n" + _knob_block({"kChunks": "4"}) + "\n```\n",
                     times=0)]
    store = Store(tmp_path / "budget.db")
    model = ModelSpec("priced", price=(1.0, 1.0))

    def session(dollars: float) -> tuple[SearchEngine, int]:
        with FakeOpenAIServer(script) as srv:
            model.base_url = srv.base_url
            cfg = SearchConfig(seed=0, proposals_per_generation=1, models=ModelsConfig(mutation=[model]),
                               budget=BudgetConfig(generations=20, llm_dollars=dollars))
            cfg.meta.interval = 0
            cfg.max_empty_generations = 50  # the fake answers the same knobs every time: only the budget ends it
            for s in (cfg.phases.explore, cfg.phases.exploit):
                s.mix = {"full": 1.0}
            eng = SearchEngine(wl, store, SimulatedEvaluator(seed=1, fail_rate=0.0),
                               [LLMSource.from_models(cfg.models, LLMConfig(api_key="k", max_retries=0))], cfg)
            eng.run()
            return eng, len(srv.chat_requests())

    eng, sent = session(0.03)
    spent = store.llm_dollars(eng.run_id)
    assert 0 < spent <= 0.03 and sent >= 2
    assert "LLM budget" in eng.reason and eng.state == "finished"
    last = store.llm_calls(eng.run_id)[-1]
    assert not last["ok"] and last["error"].startswith("refused") and "$0.0300" in last["error"]
    programs = [p["id"] for p in store.programs(eng.run_id)]
    again, sent_again = session(0.03)  # the same budget: nothing sent, nothing lost
    assert again.run_id == eng.run_id and sent_again == 0 and store.llm_dollars(eng.run_id) == spent
    assert [p["id"] for p in store.programs(eng.run_id)] == programs
    more, sent_more = session(0.2)  # a raised budget: the run goes on from where it was
    assert sent_more >= 1 and [p["id"] for p in store.programs(eng.run_id)][:len(programs)] == programs
    assert more.generation > eng.generation and store.llm_dollars(eng.run_id) <= 0.2


def test_search_budget_defaults_to_ten_dollars_per_run() -> None:
    assert SearchConfig().budget.llm_dollars == 10.0


def test_scripted_client_needs_no_server_and_labels_fixtures() -> None:
    c = ScriptedClient([truncated("cut", "half"), answer("rest", " done", match="Continue")], model="m",
                       prices={"m": (1.0, 1.0)})
    with pytest.raises(LLMTruncated) as exc:
        c.complete([{"role": "user", "content": "go"}], purpose="t")
    assert exc.value.completion.text == "half" and exc.value.completion.fixture
    done = c.complete([{"role": "user", "content": "Continue it"}], purpose="t")
    assert done.text == " done" and done.model == "fixture-rest" and done.dollars and done.dollars > 0


def test_search_flags_give_models_and_a_ten_dollar_run_budget(tmp_path: Path) -> None:
    from cuco_kit.cli import build_parser
    from cuco_kit.commands.model_options import models_from_args
    from cuco_kit.commands.search import resolve_config
    from cuco_kit.errors import BadInput

    f = tmp_path / "models.json"
    f.write_text('{"mutation": [{"name": "r1", "send_temperature": false, "reasoning_effort": "low", '
                 '"price": [1, 4]}], "meta": "m2"}')
    args = build_parser().parse_args(["search", "wl", "--db", "x.db", "--models", str(f), "--mutation-model", "r2"])
    resolve_config(args)  # the flags' defaults are filled where the command line and --config are resolved
    assert args.llm_budget == 10.0
    models = models_from_args(args)
    assert [m.name for m in models.mutation] == ["r1", "r2"] and models.mutation[0].price == (1.0, 4.0)
    assert models.for_role("meta").name == "m2" and models.for_role("judge").name == "r1"
    cfg = models.mutation[0].llm_config(LLMConfig(api_key="k"))
    assert not cfg.send_temperature and cfg.reasoning_effort == "low" and cfg.prices == {"r1": (1.0, 4.0)}
    f.write_text('{"mutation": [{"name": "r1", "reasoning_effort": "huge"}]}')
    with pytest.raises(BadInput, match="reasoning_effort"):
        models_from_args(args)


def test_per_model_settings_reach_the_request() -> None:
    from cuco_kit.llm.openai_client import OpenAICompatibleClient

    with FakeOpenAIServer([answer("a", "ok", times=0)]) as srv:
        spec = ModelSpec("reasoner", base_url=srv.base_url, send_temperature=False, reasoning_effort="high")
        OpenAICompatibleClient(spec.llm_config(LLMConfig(api_key="k", max_retries=0))).complete(
            [{"role": "user", "content": "hi"}], purpose="t", temperature=0.7, max_tokens=100)
        OpenAICompatibleClient(LLMConfig(base_url=srv.base_url, api_key="k", model="plain")).complete(
            [{"role": "user", "content": "hi"}], purpose="t", temperature=0.7, max_tokens=100)
        first, second = (r.body for r in srv.chat_requests())
    assert "temperature" not in first and first["reasoning_effort"] == "high" and first["model"] == "reasoner"
    assert second["temperature"] == 0.7 and "reasoning_effort" not in second


def test_prompt_context_without_tree_sitter_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from cuco_kit.search import conditioning

    monkeypatch.setitem(sys.modules, "cuco_kit.prompts.nccl_api", None)  # as on the GPU image: no tree-sitter
    assert conditioning.api_excerpt(BASELINE).startswith("(the NCCL device API excerpt is unavailable here")
    assert conditioning.device_api_kind("ncclGin_SignalInc") == "gin" and conditioning.device_api_kind("") == "lsa"
