"""FastPathStepper: the fast path with a person in the loop, one attempt at a time.

Each LLM attempt stops as a DiffReview against its stage's input: Approve evaluates it as proposed, Reject sends
the note typed above it into the next prompt, Edit evaluates the person's code instead (L0, L1, L2 like any
attempt). The fast path runs in a worker thread, so no cell waits for a click; decided attempts move to the
history with their verdicts. When every stage has passed, an optional `search` callback builds a search whose
generation 0 is the approved result; the stepper starts it and shows its dashboard.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import ipywidgets as W

from cuco_kit.errors import CucoError
from cuco_kit.fastpath import Attempt, FastPath, FastPathResult, StageOutcome
from cuco_kit.terminal import one_line
from cuco_kit.workbench import start_search

from ._common import badge_html, esc
from .dashboard import RunDashboard
from .diff_review import DiffReview

SearchFactory = Callable[[], tuple[Any, Any]]  # () -> (SearchEngine, Store), not started


def _attempt_line(a: Attempt) -> str:
    who = " FIXTURE" if a.fixture and a.source != "human" else ""
    note = f" - note: {esc(a.note)}" if a.verdict == "rejected" and a.note else ""
    return (f"<div>stage {esc(a.stage)}, attempt {a.number} ({esc(a.source)}{who}): <b>{esc(a.verdict)}</b> at "
            f"{esc(a.level or '-')}: {esc(a.reason)}{note}</div>")


class FastPathStepper(W.VBox):
    def __init__(self, fp: FastPath, *, search: SearchFactory | None = None) -> None:
        self.fp = fp
        self.search = search
        self.result: FastPathResult | None = None
        self.error: str | None = None
        self.engine: Any = None
        self.search_store: Any = None
        self.dashboard: RunDashboard | None = None
        self.review: DiffReview | None = None
        self.done = threading.Event()
        self._lock = threading.Lock()
        self._seen: set[tuple[str, int]] = set()
        self.status = W.HTML("<i>not started</i>")
        self.note = W.Text(placeholder="why you reject this attempt: the note goes into the next prompt",
                           description="note", layout=W.Layout(width="100%"))
        self.history = W.VBox()
        self.current = W.VBox()
        self.after = W.VBox()
        super().__init__([W.HTML("<b>Fast path, one attempt at a time</b>"), self.status, self.history, self.note,
                          self.current, self.after])
        self.add_class("cuco-fastpath-stepper")

    # -- driving ----------------------------------------------------------------------------------------
    def start(self) -> FastPathStepper:
        """Run the fast path in a worker thread up to its first attempt (the cell returns at once)."""
        self._work(self.fp.run, "the model proposes Stage A")
        return self

    def _work(self, fn: Callable[[], Any], what: str) -> None:
        self.status.value = f"<i>working: {esc(what)} (checks: L0, L1{', L2' if self.fp.evaluator else ''})</i>"
        threading.Thread(target=self._run, args=(fn,), name="cuco-fastpath-stepper", daemon=True).start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            out = fn()
        except CucoError as exc:
            self._end(None, one_line(exc))
            return
        except Exception as exc:  # noqa: BLE001 -- a worker must report, never die silently
            self._end(None, f"{type(exc).__name__}: {one_line(exc)}")
            return
        if isinstance(out, StageOutcome) and out.status == "pending":
            self._show_pending()
        else:
            self._end(out, None)

    def _decided_attempts(self) -> list[Attempt]:
        return [a for oc in self.fp.outcomes.values() for a in oc.attempts if a.verdict != "pending"]

    def _sync_history(self) -> None:
        new = [a for a in self._decided_attempts() if (a.stage, a.number) not in self._seen]
        for a in new:
            self._seen.add((a.stage, a.number))
        if new:
            self.history.children = (*self.history.children, *(W.HTML(_attempt_line(a)) for a in new))

    def _show_pending(self) -> None:
        a = self.fp.pending
        if a is None:
            return
        with self._lock:
            self._sync_history()
            stage_input = self.fp.outcomes[a.stage].code  # a pending stage's outcome still holds its input
            prop = {"id": a.proposal_id or a.number, "name": f"stage {a.stage}, attempt {a.number}",
                    "rationale": (a.proposal_text.split("```")[0].strip() or "(no rationale)")[:600],
                    "source": a.source, "tags": ["fixture"] if a.fixture else [], "parent_code": stage_input,
                    "code": a.code or ""}
            self.review = DiffReview(prop, self._decided, badge="fixture" if a.fixture else "")
            self.current.children = [self.review]
            self.status.value = (f"stage {esc(a.stage)}, attempt {a.number}: <b>waiting for your decision</b> "
                                 "(type a note before Reject)")

    def _decided(self, _pid: int, decision: str, code: str | None) -> None:
        note = self.note.value.strip()
        self.note.value = ""
        self.current.children = []
        if decision == "rejected":
            self._work(lambda: self.fp.reject(note), "the model tries again with your note")
        elif decision == "edited":
            self._work(lambda: self.fp.edit(code or ""), "your edit is checked")
        else:
            self._work(self.fp.approve, "the attempt is checked")

    def _end(self, out: Any, error: str | None) -> None:
        with self._lock:
            self._sync_history()
            self.current.children = []
            self.note.layout.display = "none"  # nothing left to reject: no stale note field
            if error is not None:
                self.error = error
                self.status.value = f"{badge_html('simulated', 'stopped')} {esc(error)}"
            else:
                self.result = out
                ok = bool(getattr(out, "ok", False))
                self.status.value = (f"fast path <b>{esc(getattr(out, 'status', '?'))}</b>: "
                                     f"{esc(getattr(out, 'message', ''))}")
                if ok and self.search is not None:
                    self._start_search()
        self.done.set()

    def _start_search(self) -> None:
        assert self.search is not None
        try:
            self.engine, self.search_store = self.search()
            start_search(self.engine)
        except CucoError as exc:
            self.after.children = [W.HTML(f"<b>the search did not start</b>: {esc(one_line(exc))}")]
            return
        self.dashboard = RunDashboard(self.engine)
        self.after.children = [
            W.HTML(f"<b>Search started from the approved result</b> (run {self.engine.run_id}): generation 0 is "
                   "the fast path's result; its stages are the lineage's first nodes."), self.dashboard]

    # -- headless -------------------------------------------------------------------------------------------
    def approve_all(self, timeout: float = 900.0) -> FastPathResult | None:
        """Approve every attempt until the fast path ends (a headless smoke run: nobody is there to click)."""
        deadline = time.monotonic() + timeout
        while not self.done.is_set():
            if time.monotonic() > deadline:
                raise TimeoutError(f"the fast path did not end within {timeout:.0f} s")
            review = self.review
            if review is not None and review.decision is None and self.current.children:
                review.approve.click()
            time.sleep(0.1)
        return self.result
