"""The reasoning panel: meta-summary, phase and islands, the model bandit, novelty rejections, LLM retries and both
parents of a crossover, read from a store, escaped, and shown in the dashboard's tabs; the ledger view's per-model
table."""
from __future__ import annotations

from pathlib import Path

from cuco_kit.search.config import SearchConfig
from cuco_kit.search.llm_source import NOTES_KEY
from cuco_kit.search.models import ModelsConfig, ModelSpec
from cuco_kit.search.reasoning import reasoning_state
from cuco_kit.store import Store
from cuco_kit.widgets import LedgerView, ReasoningPanel


def _store(tmp_path: Path) -> tuple[Store, int]:
    st = Store(tmp_path / "r.db")
    cfg = SearchConfig(models=ModelsConfig(mutation=[ModelSpec("m-a", price=(1, 1)), ModelSpec("m-b")]))
    rid = st.create_run(workload="w", config=cfg.to_dict())
    a = st.add_program(run_id=rid, code="a", parent_id=None, source="baseline", name="base", island=0)
    b = st.add_program(run_id=rid, code="b", parent_id=a, source="llm_full", name="<b>two</b>", island=1,
                       tags=["model:m-a"])
    x = st.add_proposal(run_id=rid, parent_id=a, source="llm_crossover", name="cross", rationale="", diff="",
                        code="c", second_parent_id=b)
    n = st.add_proposal(run_id=rid, parent_id=a, source="llm_diff", name="dup", rationale="", diff="", code="d")
    st.decide(n, "rejected", by="novelty", note="near-duplicate of program 1 (ngram similarity 0.990)")
    st.decide(x, "rejected", by="human")
    st.put_meta(rid, "meta_summary", {"generation": 3, "method": "llm", "text": "- chunking <won>"})
    st.put_meta(rid, "state", {"generation_done": 3, "phase": {"phase": "exploit"},
                               "migrations": [{"program_id": b, "from": 1, "to": 0}]})
    st.put_meta(rid, NOTES_KEY, [{"generation": 2, "parent_id": a, "kind": "diff", "model": "m-b",
                                   "what": "retry: answer not applicable", "reason": "edit 1: SEARCH text not found"}])
    st.add_llm_call(run_id=rid, model="fixture-a", purpose="search.mutate.full@m-a", prompt_tokens=10,
                    completion_tokens=5, latency_s=0.1, dollars=0.5, ok=True)
    return st, rid


def test_reasoning_state_reads_everything_from_the_store(tmp_path: Path) -> None:
    st, rid = _store(tmp_path)
    s = reasoning_state(st, rid)
    assert s["meta_summary"]["text"] == "- chunking <won>" and s["phase"]["phase"] == "exploit"
    assert [i["programs"] for i in s["islands"]] == [1, 1] and s["migrations"] == 1
    assert s["novelty_rejections"][0]["note"].startswith("near-duplicate")
    assert s["llm_notes"][0]["what"].startswith("retry")
    cross = s["crossovers"][0]
    assert cross["parent_a"]["name"] == "base" and cross["parent_b"]["name"] == "<b>two</b>"
    arms = {a["model"]: a for a in s["bandit"]}
    assert arms["m-a"]["calls"] == 1 and arms["m-b"]["calls"] == 0  # m-b untried: first in line


def test_panel_and_ledger_escape_and_show_models(tmp_path: Path) -> None:
    st, rid = _store(tmp_path)
    html = ReasoningPanel(st, rid).body.value
    assert "&lt;won&gt;" in html and "<won>" not in html and "&lt;b&gt;two" in html and "untried" in html
    led = LedgerView(st, rid)
    assert "m-a" in led.models.value and "mutation" in led.models.value and "win_rate" in led.models.value
