"""DiffReview: one proposal as a side-by-side CUDA diff with Approve / Reject / Edit.

Syntax colours come from pygments, which escapes the source itself; names, rationales and tags go through
`esc`. LLM text never becomes live HTML. An edit becomes a human proposal: the decision carries the edited code.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ipywidgets as W
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import CudaLexer

from cuco_kit.source.patch import diff_rows

from ._common import badge_html, esc

# decision callback: (proposal_id, decision, edited_code_or_None)
DecisionFn = Callable[[int, str, "str | None"], None]

_ROW_BG = {"equal": "", "replace": "#fff5d6", "delete": "#ffe0e0", "insert": "#e0ffe0"}
_FORMATTER = HtmlFormatter(nowrap=True, noclasses=True, style="default")


def _highlighted_lines(code: str) -> list[str]:
    # HtmlFormatter closes its spans at each line end, so splitting the output keeps every line well formed.
    out = highlight(code, CudaLexer(), _FORMATTER)
    lines = out.split("\n")
    n = code.count("\n") + 1
    return (lines + [""] * n)[:n]


def side_by_side_html(old: str, new: str, context: int | None = 3) -> str:
    """An HTML table of the diff. Source text is escaped by pygments; nothing else from the code is used."""
    old_hl, new_hl = _highlighted_lines(old), _highlighted_lines(new)
    cells = []
    for r in diff_rows(old, new, context=context):
        if r.kind == "skip":
            cells.append(f'<tr><td colspan="4" style="color:#888;text-align:center">'
                         f"... {r.skipped} unchanged lines ...</td></tr>")
            continue
        bg = _ROW_BG[r.kind]
        style = f' style="background:{bg}"' if bg else ""
        left = old_hl[r.old_no - 1] if r.old_no else ""
        right = new_hl[r.new_no - 1] if r.new_no else ""
        cells.append(
            f"<tr{style}><td class='ln'>{r.old_no or ''}</td><td><pre>{left}</pre></td>"
            f"<td class='ln'>{r.new_no or ''}</td><td><pre>{right}</pre></td></tr>")
    return (
        "<style>.cuco-diff pre{margin:0;font-size:11px;white-space:pre-wrap;word-break:break-all}"
        " .cuco-diff td.ln{color:#999;font-size:10px;text-align:right;padding-right:4px;width:3em}"
        " .cuco-diff{border-collapse:collapse;table-layout:fixed;width:100%} .cuco-diff td{vertical-align:top}"
        "</style><div style='overflow-x:auto;max-width:100%'>"
        f"<table class='cuco-diff'><colgroup><col style='width:3em'><col><col style='width:3em'><col></colgroup>"
        f"{''.join(cells)}</table></div>")


class DiffReview(W.VBox):
    """Review one proposal. `proposal` holds id, name, rationale, tags, source, cell, parent_code and code.
    Clicking a button calls `on_decision(proposal_id, decision, edited_code)` once and disables the buttons."""

    def __init__(self, proposal: dict[str, Any], on_decision: DecisionFn | None = None, badge: str = "",
                 context: int | None = 3) -> None:
        self.proposal = proposal
        self.on_decision = on_decision
        self.decision: str | None = None
        tags = ", ".join(esc(t) for t in proposal.get("tags") or [])
        head = (f"<b>{esc(proposal.get('name') or 'proposal')}</b> "
                f"<span style='color:#666'>#{esc(proposal.get('id'))} from {esc(proposal.get('source'))}"
                f"{' | cell ' + esc(proposal['cell']) if proposal.get('cell') else ''}"
                f"{' | tags ' + tags if tags else ''}</span> {badge_html(badge) if badge else ''}"
                f"<div style='margin:4px 0'>{esc(proposal.get('rationale') or '')}</div>")
        self.header = W.HTML(head)
        self.diff = W.HTML(side_by_side_html(proposal.get("parent_code") or "", proposal.get("code") or "",
                                             context=context))
        self.approve = W.Button(description="Approve", button_style="success", icon="check")
        self.reject = W.Button(description="Reject", button_style="danger", icon="times")
        self.edit = W.Button(description="Edit", icon="edit")
        self.editor = W.Textarea(value=proposal.get("code") or "", layout=W.Layout(width="100%", height="300px",
                                                                                   display="none"))
        self.editor.add_class("cuco-edit-code")  # the page finds this proposal's editor, not another textarea
        self.submit_edit = W.Button(description="Submit edit", button_style="info",
                                    layout=W.Layout(display="none"))
        self.status = W.HTML("")
        self.approve.on_click(lambda _: self._decide("approved"))
        self.reject.on_click(lambda _: self._decide("rejected"))
        self.edit.on_click(lambda _: self._open_editor())
        self.submit_edit.on_click(lambda _: self._decide("edited", self.editor.value))
        buttons = W.HBox([self.approve, self.reject, self.edit, self.status])
        super().__init__([self.header, buttons, self.editor, self.submit_edit, self.diff],
                         layout=W.Layout(border="1px solid #ddd", padding="4px", margin="4px 0"))

    def _open_editor(self) -> None:
        self.editor.layout.display = ""
        self.submit_edit.layout.display = ""

    def freeze(self, verdict: str) -> None:
        """Show a decision as taken (here or elsewhere, e.g. by the fast path's judge): the buttons go off, the
        editor closes and `verdict` is shown; later clicks decide nothing."""
        self.decision = verdict
        for b in (self.approve, self.reject, self.edit, self.submit_edit):
            b.disabled = True
        self.editor.layout.display = "none"
        self.status.value = f"<i>{esc(verdict)}</i>"

    def _decide(self, decision: str, code: str | None = None) -> None:
        if self.decision is not None:
            return
        self.freeze(decision)
        if self.on_decision is not None:
            self.on_decision(int(self.proposal.get("id") or 0), decision, code)
