"""Overlap and cost beside each proposal, and "approve up to a budget" for the approval queue.

`proposal_info_html` is the small line under a waiting proposal (its parent's measured overlap, since the proposal
itself is not measured yet, and its expected cost) and `outcome_cells` the two history cells of a decided one (its
own overlap and actual cost). `BudgetApproval` approves the waiting proposals in order until the next one's
expected cost would exceed the budget typed in (cuco_kit.search.cost.within_budget says what stops it).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ipywidgets as W

from cuco_kit.evaluate.overlap import overlap_text
from cuco_kit.search.cost import Cost, CostConfig, proposal_cost, within_budget
from cuco_kit.store import Store

from ._common import esc


def _last_evaluation(store: Store, program_id: int | None) -> dict[str, Any] | None:
    if not program_id:
        return None
    evs = [e for e in store.evaluations(program_id=int(program_id)) if e["status"] == "done"]
    return dict(evs[-1]) if evs else None


def proposal_info_html(store: Store, run_id: int, proposal: dict[str, Any], config: CostConfig | None = None) -> str:
    """'parent: overlap 52% of ideal [SIMULATED] | cost expected: 3.2 GPU-s, $0.0004 LLM' for a waiting one."""
    parent = _last_evaluation(store, proposal.get("parent_id"))
    ov = overlap_text(parent) if parent else "overlap: no parent measurement"
    cost = proposal_cost(store, run_id, proposal, config)
    return (f"<div class='cuco-proposal-info' style='font-size:11px;color:#555;padding-left:74px'>"
            f"parent's {esc(ov)} | cost {esc(cost.text())}</div>")


def outcome_cells(store: Store, run_id: int, proposal: dict[str, Any], config: CostConfig | None = None) -> str:
    """Two <td>: the decided proposal's own overlap and its cost (actual once evaluated)."""
    ev = _last_evaluation(store, proposal.get("program_id"))
    ov = overlap_text(ev) if proposal.get("status") != "rejected" else "-"
    return f"<td>{esc(ov)}</td><td>{esc(proposal_cost(store, run_id, proposal, config).text())}</td>"


def _limit(text: str, what: str) -> float | None:
    """A budget field: empty means no limit; otherwise a number >= 0 (ValueError naming the field)."""
    t = text.strip().lstrip("$")
    if not t:
        return None
    try:
        v = float(t)
    except ValueError:
        raise ValueError(f"{what} budget {text!r} is not a number; type one (or leave it empty for no limit)") from None
    if v < 0 or v != v:
        raise ValueError(f"{what} budget must be >= 0; type one (or leave it empty for no limit)")
    return v


class BudgetApproval(W.HBox):
    """Two budget fields (GPU seconds, LLM dollars; empty: no limit) and a button that approves the waiting
    proposals in order while their expected cost fits. `pending()` gives the waiting proposals, `decide(pid)`
    approves one and returns '' or why not."""

    def __init__(self, store: Store, run_id: int, pending: Callable[[], list[dict[str, Any]]],
                 decide: Callable[[int], str], config: CostConfig | None = None) -> None:
        self.store, self.run_id, self._pending, self._decide = store, run_id, pending, decide
        self.config = config or CostConfig()
        self.gpu = W.Text(placeholder="GPU-seconds", description="budget", layout=W.Layout(width="210px"),
                          tooltip="GPU seconds the approvals may spend (empty: no limit)")
        self.dollars = W.Text(placeholder="LLM $", layout=W.Layout(width="110px"),
                              tooltip="LLM dollars the approvals may trigger (empty: no limit)")
        self.button = W.Button(description="Approve up to budget", icon="wallet", layout=W.Layout(width="190px"),
                               tooltip="approve in order while the expected cost fits the budget")
        self.result = W.HTML()
        self.button.on_click(lambda _: self.approve())
        super().__init__([self.gpu, self.dollars, self.button, self.result],
                         layout=W.Layout(align_items="center", flex_flow="row wrap"))

    @property
    def controls(self) -> list[W.Widget]:
        return [self.gpu, self.dollars, self.button]

    def costs(self) -> list[tuple[int, Cost]]:
        return [(int(p["id"]), proposal_cost(self.store, self.run_id, p, self.config)) for p in self._pending()]

    def approve(self) -> list[int]:
        """Approve what fits; says how many, what they are expected to cost and what stopped it."""
        try:
            gpu, dollars = _limit(self.gpu.value, "GPU-seconds"), _limit(self.dollars.value, "LLM dollars")
        except ValueError as exc:
            self.result.value = f"<span style='color:#b71c1c'>{esc(exc)}</span>"
            return []
        if gpu is None and dollars is None:
            self.result.value = "<i>type a GPU-seconds or a dollar budget first (Approve all approves without one)</i>"
            return []
        pick = within_budget(self.costs(), gpu_seconds=gpu, llm_dollars=dollars)
        done: list[int] = []
        for pid in pick.approve:
            error = self._decide(pid)
            if error:
                self.result.value = f"<span style='color:#b71c1c'>#{pid}: {esc(error)}</span>"
                return done
            done.append(pid)
        stop = f"; stopped: {pick.stopped}" if pick.stopped else ""
        self.result.value = (f"<i>approved {len(done)} (expected {pick.gpu_seconds:.1f} GPU-s, "
                             f"${pick.llm_dollars:.4f} LLM){esc(stop)}</i>")
        return done


def program_info_html(store: Store, run_id: int, program_id: int, config: CostConfig | None = None) -> str:
    """The lineage's line for one program: its overlap and its cost (its proposal's, when a proposal made it)."""
    ev = _last_evaluation(store, program_id)
    prop = next((p for p in store.proposals(run_id) if p.get("program_id") == program_id), None)
    if prop is not None:
        cost = proposal_cost(store, run_id, dict(prop), config).text()
    elif ev is not None:
        cost = proposal_cost(store, run_id, {"id": -1, "source": "root", "program_id": program_id,
                                             "status": "approved"}, config).text()
    else:
        cost = "not evaluated yet"
    return (f"<div class='cuco-program-info'>{esc(overlap_text(ev))} | cost {esc(cost)}</div>")
