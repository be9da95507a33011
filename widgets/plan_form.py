"""The import in a notebook: the plan as a form the user corrects, and the LLM's port and reference as drafts
a person approves, rejects with a note, or edits.

`PlanForm` shows the plan's buffers (role, dtype, element count), sizes, where the step is, what it leaves out and
what is still TODO, with the plan's JSON in an editor; "Apply" checks an edited plan against the program and
says what is open or inconsistent, one line each.
`DraftReview` shows a draft (the port as a diff against the original program, the reference as a diff against
workload.py's current one) with what the checks found; Approve writes it only if the checks pass, Reject asks
again with the note, Edit writes the person's version after the same checks. Nothing is accepted silently.
"""
from __future__ import annotations

import threading
from typing import Any

import ipywidgets as W

from cuco_kit.errors import BadInput
from cuco_kit.importer.plan import InconsistentPlan, check_plan
from cuco_kit.importer.session import Draft, ImportSession
from cuco_kit.importer.workload_writer import current_reference
from cuco_kit.terminal import one_line

from ._common import esc
from .diff_review import DiffReview


def plan_html(session: ImportSession) -> str:
    p = session.plan
    rows = "".join(f"<tr><td>{esc(b.name)}</td><td><b>{esc(b.role)}</b></td><td>{esc(b.dtype)}</td>"
                   f"<td>{esc(b.count)}</td></tr>" for b in p.buffers)
    sizes = ", ".join(f"{esc(k)}={v}" + (" (fixed)" if k in p.fixed_sizes else "") for k, v in p.sizes.items())
    what = "the loop at" if p.step_kind == "loop" else "the statements at"
    via = f" (main() calls it at line(s) {', '.join(map(str, p.call_lines))})" if p.call_lines else ""
    items = ([f"<li><b>TODO</b>: {esc(t)}</li>" for t in p.todo]
             + [f"<li>left out: L{x.line} <code>{esc(x.code)}</code> ({esc(x.why)})</li>" for x in p.left_out]
             + [f"<li>{esc(n)}</li>" for n in p.notes])
    return (f"<div><b>{esc(p.program)}</b> -> workload <b>{esc(p.name)}</b>; step: {what} lines {p.step_start}-"
            f"{p.step_end} of {esc(p.step_function)}(){esc(via)}; communicator {esc(p.comm)}, rank "
            f"{esc(p.rank or '-')}, world {esc(p.world or '-')}; harness stream &lt;- {esc(p.main_stream)}"
            f"{'; side streams ' + esc(', '.join(p.side_streams)) if p.side_streams else ''}</div>"
            f"<div>sizes: {sizes or 'none'}</div><table><tr><th>buffer</th><th>role</th><th>dtype</th>"
            f"<th>elements per rank</th></tr>{rows}</table>{'<ul>' + ''.join(items) + '</ul>' if items else ''}")


class PlanForm(W.VBox):
    def __init__(self, session: ImportSession) -> None:
        self.session = session
        self.view = W.HTML(plan_html(session))
        self.editor = W.Textarea(value=session.plan.to_json(), layout=W.Layout(width="100%", height="260px"))
        self.apply = W.Button(description="Apply plan", button_style="info", icon="check")
        self.problems = W.HTML(self._problems_html(check_plan(session.plan, session.code)))
        self.apply.on_click(lambda _: self.apply_text(self.editor.value))
        super().__init__([W.HTML("<b>Import plan</b> (correct roles, counts or step lines in the JSON, then "
                                 "Apply)"), self.view, self.problems, self.editor, self.apply])

    @staticmethod
    def _problems_html(problems: list[str]) -> str:
        if not problems:
            return "<div style='color:#2a7'>the plan is consistent</div>"
        return "<ul style='color:#b33'>" + "".join(f"<li>{esc(p)}</li>" for p in problems) + "</ul>"

    def apply_text(self, text: str) -> bool:
        """Use `text` (the plan's JSON) if it is consistent; show what is wrong otherwise."""
        try:
            self.session.set_plan(text)
        except InconsistentPlan as exc:
            self.problems.value = self._problems_html([one_line(p) for p in exc.problems])
            return False
        except BadInput as exc:
            self.problems.value = self._problems_html([one_line(exc)])
            return False
        self.view.value = plan_html(self.session)
        self.problems.value = ("<div style='color:#2a7'>plan applied: the plan is consistent; run the next cell to "
                               "write the folder with it</div>")
        return True


class DraftReview(W.VBox):
    """The LLM's port (kind "port") or reference (kind "reference"), proposed at once, reviewed by a person."""

    def __init__(self, session: ImportSession, kind: str) -> None:
        if kind not in ("port", "reference"):
            raise BadInput(f"DraftReview kind {kind!r}: use 'port' or 'reference'")
        self.session = session
        self.kind = kind
        self.accepted = False
        self.drafts = 0  # drafts shown so far: each is numbered, so a second answer does not read as the first
        self.draft: Draft | None = None
        self.review: DiffReview | None = None
        self.note = W.Text(placeholder="why you reject it: this note goes into the next prompt",
                           description="note", layout=W.Layout(width="100%"))
        self.status = W.HTML()
        self.box = W.VBox()
        super().__init__([W.HTML(f"<b>The LLM's {kind}</b>"), self.status, self.note, self.box])
        self.add_class(f"cuco-draft-{kind}")
        self.propose()

    def propose(self, note: str = "") -> Draft:
        fn = self.session.propose_port if self.kind == "port" else self.session.propose_reference
        self.draft = fn(note)
        self.drafts += 1
        self._show(self.draft)
        return self.draft

    def _base(self) -> str:
        if self.kind == "port":
            return self.session.code
        path = self.session.directory / "workload.py"
        return current_reference(path.read_text(encoding="utf-8")) if path.is_file() else ""

    def _show(self, d: Draft) -> None:
        found = ("<div style='color:#2a7'>checks passed: approve to write it</div>" if d.ok else
                 "<ul style='color:#b33'>" + "".join(f"<li>{esc(p)}</li>" for p in d.problems) + "</ul>")
        who = "FIXTURE answer" if d.fixture else f"model {esc(d.model)}"
        self.status.value = f"{who}. {found}"
        prop = {"id": self.drafts, "name": f"{self.kind} draft {self.drafts}",
                "rationale": d.answer.split("```")[0].strip()[:600],
                "source": "llm", "parent_code": self._base(), "code": d.code or ""}
        self.review = DiffReview(prop, self._decided, badge="fixture" if d.fixture else "")
        self.box.children = [self.review]

    def _decided(self, _pid: int, decision: str, code: str | None) -> None:
        note = self.note.value.strip()
        self.note.value = ""
        if decision == "rejected":
            self.status.value = "<i>asking again with your note ...</i>"
            threading.Thread(target=self.propose, args=(note,), daemon=True).start()
            return
        self.accept(code if decision == "edited" else (self.draft.code if self.draft else None))

    def accept(self, code: str | None) -> bool:
        """Write `code` through the session's checks; on a refusal, show why and offer the draft again."""
        fn: Any = self.session.accept_port if self.kind == "port" else self.session.accept_reference
        try:
            path = fn(code or "")
        except BadInput as exc:
            if self.draft is not None:
                self._show(self.draft)  # a fresh review of the same draft, to edit or reject
            self.status.value = f"<span style='color:#b33'>not accepted: {esc(one_line(exc))}</span>"
            return False
        self.accepted = True
        self.note.layout.display = "none"  # nothing left to reject: no stale note field
        if self.review is not None:
            self.review.freeze("approved" if code == (self.draft.code if self.draft else None) else "edited")
        self.status.value = f"<span style='color:#2a7'>accepted: written to {esc(path.name)}</span>"
        return True

    def auto(self, note: str) -> bool:
        """Headless (smoke): reject drafts whose checks fail, with `note`, until one passes; then approve it."""
        for _ in range(3):
            if self.draft is not None and self.draft.ok:
                return self.accept(self.draft.code)
            self.propose(note)
        return False
