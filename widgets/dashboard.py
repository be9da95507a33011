"""RunDashboard: a live search with pause / resume / stop, the approval queue, lineage, latency, cells, ledger.

The search runs in the engine's worker thread; this widget only subscribes to its events and marks itself dirty.
A throttled refresher redraws under one lock about once a second. Approve / Reject / Edit put decisions on the
engine's gate queue, so no cell ever blocks waiting for a click.
"""
from __future__ import annotations

import threading
from typing import Any

import ipywidgets as W

from cuco_kit.events import Event
from cuco_kit.report import ratio_text

from ._common import Throttle, esc
from .diff_review import DiffReview, side_by_side_html
from .plots import DesignSpaceMap, LatencyPlot, LineageTree
from .reasoning import ReasoningPanel
from .slots import SlotPanel
from .views import LedgerView


class RunDashboard(W.VBox):
    def __init__(self, engine: Any, *, interval: float = 1.0, baselines: dict[str, float] | None = None) -> None:
        self.engine = engine
        self.store, self.run_id = engine.store, engine.run_id
        self._lock = threading.Lock()
        self._reviews: dict[int, DiffReview] = {}
        self.events_seen = 0
        self.state = W.HTML()
        self.pause_b = W.Button(description="Pause", icon="pause")
        self.resume_b = W.Button(description="Resume", icon="play")
        self.stop_b = W.Button(description="Stop", icon="stop", button_style="danger")
        self.pause_b.on_click(lambda _: self.engine.pause())
        self.resume_b.on_click(lambda _: self.engine.resume())
        self.stop_b.on_click(lambda _: self.engine.stop())
        self.queue = W.VBox()
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
        super().__init__([W.HBox([self.pause_b, self.resume_b, self.stop_b, self.state]),
                          W.HTML("<b>Approval queue</b>"), self.queue, tabs])
        self._refresh.flush()

    def _on_event(self, event: Event) -> None:
        with self._lock:
            self.events_seen += 1
        self._refresh()

    def _decide(self, proposal_id: int, decision: str, code: str | None) -> None:
        self.engine.gate.decide(proposal_id, decision, code=code)
        self._refresh()

    def show_program(self, program_id: int) -> None:
        """What a click on a lineage node opens: the program's diff against its parent and its metrics."""
        p = self.store.program(program_id)
        parent = self.store.program(p["parent_id"]) if p.get("parent_id") else None
        evs = self.store.evaluations(program_id=program_id)
        last = evs[-1] if evs else {}
        metrics = (f"verdict <b>{esc(last.get('verdict'))}</b> at {esc(last.get('level_reached'))}; "
                   f"median {esc(last.get('median_ms'))} ms; speed-up "
                   f"{esc(ratio_text(last.get('speedup'), (last.get('result') or {}).get('speedup_ci')))}; "
                   f"reason {esc(last.get('reason'))}") if last else "not evaluated yet"
        self.detail.value = (f"<h4>#{program_id} {esc(p.get('name'))} ({esc(p.get('source'))})</h4>"
                             f"<div>{esc(p.get('rationale'))}</div><div>{metrics}</div>"
                             + side_by_side_html(parent["code"] if parent else "", p["code"]))
        self.selected = program_id

    def _render(self) -> None:
        with self._lock:
            pending = self.store.proposals(self.run_id, status="pending")
            for prop in pending:
                if prop["id"] not in self._reviews:
                    parent = self.store.program(prop["parent_id"]) if prop.get("parent_id") else None
                    self._reviews[prop["id"]] = DiffReview(
                        {**prop, "parent_code": parent["code"] if parent else ""}, on_decision=self._decide)
            live = {p["id"] for p in pending}
            self.queue.children = [r for pid, r in sorted(self._reviews.items()) if pid in live]
            state = getattr(self.engine, "state", "")
            best = self.store.best(self.run_id)
            self.state.value = (f"state: <b>{esc(state)}</b> | pending: {len(live)} | "
                                + (f"best: {best['median_ms']:.3f} ms (#{best['program_id']})"
                                   if best and best.get("median_ms") is not None else "best: -"))
            for view in (self.lineage, self.latency, self.cells, self.ledger, self.reasoning, self.slots):
                view.refresh()

    def close(self) -> None:
        self._unsubscribe()
        self._refresh.close()
        self.slots.close()
        super().close()
