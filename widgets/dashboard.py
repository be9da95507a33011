"""RunDashboard: a live search with pause / resume / stop, the approval queue, lineage, latency, cells, ledger.

The search runs in the engine's worker thread; this widget only subscribes to its events and marks itself dirty.
A throttled refresher redraws under one lock about once a second. Approve / Reject / Edit put decisions on the
engine's gate queue (widgets/approval_queue.py), so no cell ever blocks waiting for a click.

Its state is enforced: Pause and Resume are on only when they mean something, and once the search has ended
every control is off and says why. Only one dashboard per `key` is live in a kernel: running its cell again
stops the search the old dashboard showed, so no search is left running without a Stop button.
"""
from __future__ import annotations

import threading
from typing import Any, ClassVar

import ipywidgets as W

from cuco_kit.evaluate.api import checked_against
from cuco_kit.events import Event
from cuco_kit.report import ratio_text

from ._common import Throttle, esc, fmt_ms
from .approval_queue import ApprovalQueue
from .budget_approval import program_info_html
from .diff_review import side_by_side_html
from .plots import DesignSpaceMap, LatencyPlot, LineageTree
from .reasoning import ReasoningPanel
from .slots import SlotPanel
from .views import LedgerView

ENDED = ("stopped", "finished", "failed")


class RunDashboard(W.VBox):
    live: ClassVar[dict[str, RunDashboard]] = {}  # key -> the dashboard showing that key's search now

    def __init__(self, engine: Any, *, interval: float = 1.0, baselines: dict[str, float] | None = None,
                 key: str = "search") -> None:
        self.engine = engine
        self.key = key
        self.store, self.run_id = engine.store, engine.run_id
        self._lock = threading.Lock()
        self.events_seen = 0
        self.ended_reason = ""
        self.state = W.HTML()
        self.pause_b = W.Button(description="Pause", icon="pause", tooltip="stop proposing after what is in flight")
        self.resume_b = W.Button(description="Resume", icon="play", tooltip="continue a paused search")
        self.stop_b = W.Button(description="Stop", icon="stop", button_style="danger",
                               tooltip="end the run (it can be resumed from its database)")
        self.pause_b.on_click(lambda _: self._control(self.engine.pause))
        self.resume_b.on_click(lambda _: self._control(self.engine.resume))
        self.stop_b.on_click(lambda _: self._control(self.engine.stop))
        self.reason = W.HTML()
        self.queue = ApprovalQueue(self.store, self.run_id, engine.gate, on_change=lambda: self._refresh())
        self.lineage = LineageTree(self.store, self.run_id)
        self.latency = LatencyPlot(self.store, self.run_id, baselines=baselines)
        self.cells = DesignSpaceMap(self.store, self.run_id)
        self.ledger = LedgerView(self.store, self.run_id)
        self.slots = SlotPanel(engine.events)
        self.reasoning = ReasoningPanel(self.store, self.run_id, getattr(engine, "population", None))
        self.detail = W.HTML()
        self.lineage.on_select(self.show_program)
        tabs = W.Tab([W.VBox([self.lineage, self.detail]), self.latency, self.cells, self.ledger, self.reasoning,
                      self.slots])
        for i, t in enumerate(["lineage", "latency", "design space", "LLM ledger", "reasoning", "slots"]):
            tabs.set_title(i, t)
        self.tabs = tabs
        self._refresh = Throttle(self._render, interval)
        self._unsubscribe = engine.events.subscribe(self._on_event)
        super().__init__([W.HBox([self.pause_b, self.resume_b, self.stop_b, self.state]), self.reason,
                          self.queue, tabs])
        self._replace_previous()
        self._refresh.flush()

    @property
    def controls(self) -> list[W.Widget]:
        """Every control that acts on the search."""
        return [self.pause_b, self.resume_b, self.stop_b, *self.queue.controls]

    def _replace_previous(self) -> None:
        old = RunDashboard.live.get(self.key)
        RunDashboard.live[self.key] = self
        if old is not None and old is not self and old.engine is not self.engine:
            old.engine.stop()  # the cell ran again: the search it showed must not run on without a Stop button
            old.end(f"replaced: this cell ran again, so the search of run {old.run_id} was stopped "
                    "(its database keeps everything; resume it from there)")

    def _control(self, action: Any) -> None:
        if not self.ended_reason:
            action()
        self._refresh.flush()

    def end(self, reason: str) -> None:
        """Every control off, with `reason` on screen and on hover."""
        self.ended_reason = reason
        for w in (self.pause_b, self.resume_b, self.stop_b):
            w.disabled = True
            w.tooltip = reason
        self.queue.disable(reason)
        self.reason.value = f"<span class='cuco-disabled-reason' style='color:#555'>{esc(reason)}</span>"

    def _on_event(self, event: Event) -> None:
        with self._lock:
            self.events_seen += 1
        self._refresh()

    def show_program(self, program_id: int) -> None:
        """What a click on a lineage node opens: the program's diff against its parent and its metrics."""
        p = self.store.program(program_id)
        parent = self.store.program(p["parent_id"]) if p.get("parent_id") else None
        evs = self.store.evaluations(program_id=program_id)
        last = evs[-1] if evs else {}
        metrics = (f"verdict <b>{esc(last.get('verdict'))}</b> at {esc(last.get('level_reached'))}; "
                   f"median {fmt_ms(last.get('median_ms'))}; speed-up over the seed "
                   f"{esc(ratio_text(last.get('speedup'), (last.get('result') or {}).get('speedup_ci')))}"
                   + (f"; {esc(checked_against((last.get('result') or {}).get('oracle')))}"
                      if (last.get("result") or {}).get("oracle") else "")
                   + (f"; reason {esc(last.get('reason'))}" if last.get("reason") else "")) \
            if last else "not evaluated yet"
        self.detail.value = (f"<h4>#{program_id} {esc(p.get('name'))} ({esc(p.get('source'))})</h4>"
                             f"<div>{esc(p.get('rationale'))}</div><div>{metrics}</div>"
                             + program_info_html(self.store, self.run_id, program_id)
                             + side_by_side_html(parent["code"] if parent else "", p["code"]))
        self.selected = program_id

    def _render(self) -> None:
        with self._lock:
            self.queue.refresh()
            state = str(getattr(self.engine, "state", ""))
            if state in ENDED and not self.ended_reason:
                why = getattr(self.engine, "reason", "") or ""
                self.end(f"search {state}{': ' + why if why else ''}; the controls are off "
                         "(the run is in its database: open it in 04_run_analysis, or resume it in a new search)")
            elif not self.ended_reason:
                self.pause_b.disabled = state != "running"
                self.resume_b.disabled = state != "paused"
                self.stop_b.disabled = False
            best = self.store.best(self.run_id)
            self.state.value = (f"state: <b>{esc(state)}</b> | pending: {len(self.queue.rows)} | "
                                + (f"best: {fmt_ms(best['median_ms'])} (#{best['program_id']})"
                                   if best and best.get("median_ms") is not None else "best: -"))
            for view in (self.lineage, self.latency, self.cells, self.ledger, self.reasoning, self.slots):
                view.refresh()

    def close(self) -> None:
        if RunDashboard.live.get(self.key) is self:
            del RunDashboard.live[self.key]
        self._unsubscribe()
        self._refresh.close()
        self.slots.close()
        super().close()
