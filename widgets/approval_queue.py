"""ApprovalQueue: the proposals waiting for a person, as one line each, that scales to many.

Each waiting proposal is a collapsed one-line summary (name, source, what it changes) with Approve and Reject;
"diff" expands it to the full side-by-side DiffReview (where Edit lives), built only when opened. Above the
list: Approve all, Reject all and a manual/automatic switch (automatic approves what waits and what comes).
Below it: the decisions taken in this run and what became of each (the evaluation's verdict and speed-up).
Decisions go on the engine's gate queue, so no click ever blocks. `disable(reason)` turns every control off and
says why (the dashboard calls it when the search stops).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ipywidgets as W

from cuco_kit.evaluate.api import checked_against
from cuco_kit.search.gate import ApprovalGate
from cuco_kit.store import Store

from ._common import esc, short
from .budget_approval import BudgetApproval, outcome_cells, proposal_info_html
from .diff_review import DiffReview

# decide(proposal_id, decision, edited_code_or_None); returns an error line, or "" when the gate took it
DecideFn = Callable[[int, str, "str | None"], str]

SUMMARY_CHARS = 110
HISTORY_ROWS = 12
_ROW = W.Layout(align_items="center", width="100%")



def _outcome(store: Store, program_id: int | None) -> str:
    if not program_id:
        return "-"
    evs = store.evaluations(program_id=program_id)
    if not evs:
        return "waiting for evaluation"
    e = evs[-1]
    oracle = (e.get("result") or {}).get("oracle")
    against = f" ({checked_against(oracle)})" if oracle else ""
    prog = f"program {program_id}: "
    if e.get("verdict") == "pass" and e.get("speedup") is not None:
        return f"{prog}pass, {e['speedup']:.2f}x the seed{against}"
    return f"{prog}{e.get('verdict') or e.get('status')} at {e.get('level_reached') or '-'}{against}"


class _Row(W.VBox):
    """One waiting proposal: a summary line that expands to its diff."""

    def __init__(self, proposal: dict[str, Any], decide: DecideFn) -> None:
        self.proposal = proposal
        self.pid = int(proposal["id"])
        self._decide = decide
        why = str(proposal.get("rationale") or "")
        # "proposal #N": the queue numbers proposals; the lineage numbers programs ("program N"). One line, cut
        # at a word boundary with an ellipsis (the whole rationale is the hover text).
        line = (f"<div style='white-space:nowrap;overflow:hidden;text-overflow:ellipsis'><b>proposal "
                f"#{self.pid}</b> {esc(short(str(proposal.get('name') or 'proposal'), 60))} "
                f"<span style='color:#666'>({esc(proposal.get('source'))}) {esc(short(why, SUMMARY_CHARS))}"
                "</span></div>")
        self.summary = W.HTML(line, layout=W.Layout(flex="1 1 auto", overflow="hidden", max_height="1.6em",
                                                    min_width="0"))
        self.summary.tooltip = why
        self.expand = W.ToggleButton(description="diff", icon="chevron-right", layout=W.Layout(width="70px"),
                                     tooltip="show the side-by-side diff (and Edit)")
        self.approve = W.Button(description="Approve", button_style="success", icon="check",
                                layout=W.Layout(width="100px", flex="0 0 auto"))
        self.reject = W.Button(description="Reject", button_style="danger", icon="times",
                               layout=W.Layout(width="90px", flex="0 0 auto"))
        self.status = W.HTML("")
        self.info = W.HTML("")  # the parent's overlap and the expected cost (widgets/budget_approval.py)
        self.verdict = ""  # what was decided here ("" while waiting)
        self.detail = W.VBox()
        self.review: DiffReview | None = None
        self.expand.observe(lambda ch: self._toggle(bool(ch["new"])), names="value")
        self.approve.on_click(lambda _: self.decide("approved"))
        self.reject.on_click(lambda _: self.decide("rejected"))
        # flex 0 0 auto: inside the scrolling list a row keeps its natural height (an open diff makes the list
        # scroll) instead of shrinking until the rows overlap and cover each other's buttons.
        super().__init__([W.HBox([self.expand, self.summary, self.approve, self.reject, self.status], layout=_ROW),
                          self.info, self.detail], layout=W.Layout(border_bottom="1px solid #eee", padding="1px 0",
                                                                   flex="0 0 auto"))
        self.add_class("cuco-queue-row")

    def _toggle(self, open_: bool) -> None:
        self.expand.icon = "chevron-down" if open_ else "chevron-right"
        if open_ and self.review is None:
            self.review = DiffReview(self.proposal, on_decision=lambda _pid, d, code: self.decide(d, code))
            if self.verdict:
                self.review.freeze(self.verdict)
        self.detail.children = [self.review] if open_ and self.review is not None else []

    def decide(self, decision: str, code: str | None = None) -> None:
        if self.verdict:
            return
        error = self._decide(self.pid, decision, code)
        if error:
            self.status.value = f"<span style='color:#b71c1c'>{esc(error)}</span>"
            return
        self.freeze(decision)

    def freeze(self, verdict: str, reason: str = "") -> None:
        self.verdict = verdict
        for b in (self.approve, self.reject):
            b.disabled = True
            b.tooltip = reason or f"already {verdict}"
        self.status.value = f"<i style='white-space:nowrap'>{esc(verdict)}</i>"
        if self.review is not None and self.review.decision is None:
            self.review.freeze(verdict)


class ApprovalQueue(W.VBox):
    """The approval queue of a live run. `gate` is the engine's ApprovalGate; `refresh()` re-reads the store."""

    def __init__(self, store: Store, run_id: int, gate: ApprovalGate, *,
                 on_change: Callable[[], None] | None = None) -> None:
        self.store, self.run_id, self.gate = store, run_id, gate
        self._on_change = on_change
        self.rows: dict[int, _Row] = {}
        self.disabled_reason = ""
        self.mode = W.ToggleButtons(options=[("manual", "manual"), ("automatic", "auto")], value=gate.mode,
                                    tooltips=["every proposal waits for you", "approve everything, now and later"],
                                    style={"button_width": "90px"})
        self.approve_all = W.Button(description="Approve all", icon="check-double", layout=W.Layout(width="120px"))
        self.reject_all = W.Button(description="Reject all", icon="ban", layout=W.Layout(width="110px"))
        self.count = W.HTML()
        self.note = W.HTML()
        self.list = W.VBox(layout=W.Layout(max_height="360px", overflow="auto"))
        self.history = W.HTML()
        self.budget = BudgetApproval(store, run_id, lambda: [r.proposal for r in self.rows.values() if not r.verdict],
                                     self._approve_one)
        self.mode.observe(lambda ch: self._set_mode(str(ch["new"])), names="value")
        self.approve_all.on_click(lambda _: self.decide_all("approved"))
        self.reject_all.on_click(lambda _: self.decide_all("rejected"))
        history = W.Accordion([self.history])
        history.set_title(0, "decisions and their outcomes")
        history.selected_index = None
        self.history_box = history
        super().__init__([W.HBox([W.HTML("<b>Approval queue</b>"), self.count, self.mode, self.approve_all,
                                  self.reject_all], layout=_ROW), self.budget, self.note, self.list, history])
        self.refresh()

    @property
    def controls(self) -> list[W.Widget]:
        out: list[W.Widget] = [self.mode, self.approve_all, self.reject_all, *self.budget.controls]
        for row in self.rows.values():
            out += [row.approve, row.reject]
        return out

    def decide(self, proposal_id: int, decision: str, code: str | None = None) -> str:
        """Put one decision on the gate; '' when it was taken, else why not (one line)."""
        if self.disabled_reason:
            return self.disabled_reason
        try:
            self.gate.decide(proposal_id, decision, code=code)
        except Exception as exc:  # noqa: BLE001 - decided meanwhile (by auto mode, or another click): say so
            return str(exc).splitlines()[0]
        if self._on_change is not None:
            self._on_change()
        return ""

    def _approve_one(self, proposal_id: int) -> str:
        row = self.rows.get(proposal_id)
        if row is None:
            return "no longer waiting"
        row.decide("approved")
        return "" if row.verdict else "not approved (see its row)"

    def decide_all(self, decision: str) -> int:
        """Approve or reject every waiting proposal; returns how many were decided."""
        n = 0
        for row in list(self.rows.values()):
            if not row.verdict:
                row.decide(decision)
                n += 1
        self.note.value = f"<i>{n} proposal(s) {esc(decision)}</i>" if n else "<i>nothing was waiting</i>"
        return n

    def _set_mode(self, mode: str) -> None:
        if self.disabled_reason or mode == self.gate.mode:
            return  # off, or `refresh` showing a mode set elsewhere (the smoke run's auto-approve)
        self.gate.set_mode(mode)
        self.note.value = ("<i>automatic: every proposal is approved as it comes</i>" if mode == "auto"
                           else "<i>manual: every proposal waits for your decision</i>")
        if self._on_change is not None:
            self._on_change()

    def refresh(self) -> None:
        pending = self.store.proposals(self.run_id, status="pending")
        live = {int(p["id"]) for p in pending}
        for prop in pending:
            pid = int(prop["id"])
            if pid not in self.rows:
                parent_id = prop.get("parent_id")
                parent = self.store.program(int(parent_id)) if parent_id else None
                self.rows[pid] = _Row({**prop, "parent_code": parent["code"] if parent else ""}, self.decide)
                if self.disabled_reason:
                    self.rows[pid].freeze("not decided", self.disabled_reason)
        for pid in live:
            self.rows[pid].info.value = proposal_info_html(self.store, self.run_id, self.rows[pid].proposal)
        for pid in [p for p in self.rows if p not in live]:
            del self.rows[pid]  # decided: it moves to the history
        self.list.children = [self.rows[pid] for pid in sorted(self.rows)]
        self.count.value = f"&nbsp;waiting: <b>{len(live)}</b>&nbsp;"
        if self.gate.mode != self.mode.value and not self.disabled_reason:
            self.mode.value = self.gate.mode
        self.history.value = self._history_html()

    def _history_html(self) -> str:
        decided = [p for p in self.store.proposals(self.run_id) if p.get("status") != "pending"]
        if not decided:
            return "<i>no decisions yet</i>"
        rows = "".join(
            f"<tr><td>proposal #{p['id']}</td><td>{esc(short(str(p.get('name') or ''), 70))}</td>"
            f"<td>{esc(p.get('status'))}</td><td>{esc(p.get('decided_by') or '-')}</td>"
            f"<td>{esc(_outcome(self.store, p.get('program_id')))}</td>"
            f"{outcome_cells(self.store, self.run_id, dict(p))}</tr>"
            for p in decided[-HISTORY_ROWS:][::-1])
        return ("<table style='font-size:12px'><tr><th>proposal</th><th>name</th><th>decision</th><th>by</th>"
                f"<th>outcome</th><th>overlap</th><th>cost</th></tr>{rows}</table>"
                + (f"<i>latest {HISTORY_ROWS} of {len(decided)}</i>" if len(decided) > HISTORY_ROWS else ""))

    def disable(self, reason: str, *, say: bool = True) -> None:
        """Every control off, saying why (hover), and one line above the list unless `say` is False (the
        dashboard says it once, above everything)."""
        self.disabled_reason = reason
        for w in self.controls:
            w.disabled = True
            w.tooltip = reason
        for row in self.rows.values():
            row.freeze("not decided", reason)
            if row.review is not None:
                row.review.freeze("not decided")
        self.note.value = (f"<span class='cuco-disabled-reason' style='color:#555'>{esc(reason)}</span>" if say
                           else "")
