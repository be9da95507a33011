"""ReasoningPanel: why the search proposes what it proposes, next to the approval queue.

Draws cuco_kit.search.reasoning.reasoning_state: the current meta-summary (ranked recommendations, the run's
scratchpad and the summary of recent programs, when a model made them), the phase and islands, the model
bandit's arms (value per dollar, exploration bonus, score), novelty rejections and the LLM source's retries and
give-ups, and for each crossover both parents. Every string from a model or a candidate is escaped.
"""
from __future__ import annotations

import math
from typing import Any

import ipywidgets as W

from cuco_kit.search.population import Population
from cuco_kit.search.reasoning import reasoning_state
from cuco_kit.store import Store

from ._common import esc


def _num(v: Any, fmt: str = ".3g") -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and math.isinf(v):
        return "untried"
    return format(v, fmt) if isinstance(v, (int, float)) else esc(v)


def _rows(head: list[str], rows: list[list[str]]) -> str:
    if not rows:
        return "<i>none</i>"
    th = "".join(f"<th>{esc(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{th}</tr>{body}</table>"


def _meta_html(meta: dict[str, Any]) -> str:
    """The meta-summary's three steps when a model made them (summary, scratchpad, ranked recommendations), else
    its text (the statistical summary)."""
    head = f"<div>generation {_num(meta['generation'])} ({esc(meta['method'])})</div>"
    if not (meta.get("scratchpad") or meta.get("recommendations") or meta.get("summary")):
        return head + f"<pre>{esc(meta['text'])}</pre>"
    recs = "".join(f"<li>{esc(r)}</li>" for r in meta.get("recommendations") or [])
    return (head + "<h5>Ranked recommendations</h5>" + (f"<ol class='cuco-recommendations'>{recs}</ol>" if recs
                                                        else "<i>none</i>")
            + f"<h5>Scratchpad</h5><pre class='cuco-scratchpad'>{esc(meta.get('scratchpad') or '')}</pre>"
            + f"<h5>Summary of recent programs</h5><pre class='cuco-meta-summary'>{esc(meta.get('summary') or '')}"
              "</pre>")


def reasoning_html(state: dict[str, Any]) -> str:
    meta = state["meta_summary"]
    phase = state["phase"]
    parts = [
        "<h4>Meta-summary</h4>" + (_meta_html(meta) if meta["text"] else "<i>none yet</i>"),
        f"<h4>Phase and islands</h4><div>phase <b>{esc(phase.get('phase', '-'))}</b>, "
        f"{_num(state['generation_done'])} generation(s) done, {state['migrations']} migration(s)</div>"
        + _rows(["island", "programs", "best", "fitness"],
                [[str(i["island"]), str(i["programs"]), _num(i["best_id"]), _num(i["best_fitness"])]
                 for i in state["islands"]]),
        "<h4>Model bandit (improvement per dollar, UCB)</h4>"
        + _rows(["model", "calls", "dollars", "improvement", "value", "bonus", "score"],
                [[esc(a["model"]), str(a["calls"]), _num(a["dollars"], ".4f"), _num(a["improvement"]),
                  _num(a["value"]), _num(a["bonus"]), _num(a["score"])] for a in state["bandit"]]),
        "<h4>Novelty rejections</h4>"
        + _rows(["proposal", "name", "parent", "why"],
                [[str(r["proposal_id"]), esc(r["name"]), _num(r["parent_id"]), esc(r["note"])]
                 for r in state["novelty_rejections"]]),
        "<h4>Novelty judge (near-duplicates by similarity)</h4>"
        + _rows(["nearest", "similarity", "verdict", "model", "reason"],
                [[_num(j.get("nearest_id")), _num(j.get("similarity")), esc(j.get("verdict") or "unreadable"),
                  esc(j.get("model")), esc(j.get("reason"))] for j in state.get("novelty_judgements", [])]),
        "<h4>LLM retries and rejections</h4>"
        + _rows(["gen", "parent", "kind", "model", "what", "reason"],
                [[_num(n.get("generation")), _num(n.get("parent_id")), esc(n.get("kind")), esc(n.get("model") or "-"),
                  esc(n.get("what")), esc(n.get("reason"))] for n in state["llm_notes"]]),
        "<h4>Crossovers</h4>"
        + _rows(["proposal", "name", "status", "parent A", "parent B"],
                [[str(c["proposal_id"]), esc(c["name"]), esc(c["status"]),
                  *[esc(f"#{p['id']} {p['name']} (island {p['island']}): {p['result']}") if p else "-"
                    for p in (c["parent_a"], c["parent_b"])]] for c in state["crossovers"]]),
    ]
    return "".join(parts)


class ReasoningPanel(W.VBox):
    """The reasoning of run ``run_id``; ``refresh()`` redraws it from the store (the dashboard calls it)."""

    def __init__(self, store: Store, run_id: int, population: Population | None = None) -> None:
        self.store, self.run_id, self.population = store, run_id, population
        self.body = W.HTML()
        super().__init__([self.body])
        self.refresh()

    def refresh(self) -> None:
        self.state = reasoning_state(self.store, self.run_id, self.population)
        self.body.value = reasoning_html(self.state)
