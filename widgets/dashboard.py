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
from collections.abc import Callable
from typing import ClassVar, Protocol

import ipywidgets as W

from cuco_kit.errors import BadInput
from cuco_kit.events import Event, EventSink, EventSource
from cuco_kit.search.gate import ApprovalGate
from cuco_kit.search.population import Population
from cuco_kit.store import Store

from ._common import Throttle, esc, fmt_ms
from .approval_queue import ApprovalQueue
from .plots import DesignSpaceMap, LatencyPlot, LineageTree
from .program_detail import program_detail_html
from .reasoning import ReasoningPanel
from .slots import SlotPanel
from .views import LedgerView

ENDED = ("stopped", "finished", "failed")


class DashboardEngine(Protocol):
    """What the dashboard needs of a search: SearchEngine has all of it (the unit tests drive a stand-in).
    ``events`` must also be an EventSource (an EventBus) for the dashboard to follow it."""

    @property
    def store(self) -> Store: ...

    @property
    def run_id(self) -> int | None: ...

    @property
    def gate(self) -> ApprovalGate: ...

    @property
    def events(self) -> EventSink: ...

    @property
    def population(self) -> Population | None: ...  # None: the reasoning panel rebuilds it from the store

    @property
    def state(self) -> str: ...

    @property
    def reason(self) -> str: ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def stop(self) -> None: ...


class RunDashboard(W.VBox):
    live: ClassVar[dict[str, RunDashboard]] = {}  # key -> the dashboard showing that key's search now

    def __init__(self, engine: DashboardEngine, *, interval: float = 1.0, baselines: dict[str, float] | None = None,
                 key: str = "search") -> None:
        events, run_id = engine.events, engine.run_id
        if not isinstance(events, EventSource):
            raise BadInput("the dashboard follows the search's events: make the engine with an EventBus "
                           "(SearchEngine(..., events=EventBus()), as workbench.new_search does)")
        if run_id is None:
            raise BadInput("the search has no run yet: start it with workbench.start_search(engine), which waits "
                           "for its run, then show its dashboard")
        self.engine = engine
        self.key = key
        self.store, self.run_id = engine.store, run_id
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
        self.lineage = LineageTree(self.store, self.run_id, detail=False)  # shown in self.detail
        self.latency = LatencyPlot(self.store, self.run_id, baselines=baselines)
        self.cells = DesignSpaceMap(self.store, self.run_id)
        self.ledger = LedgerView(self.store, self.run_id)
        self.slots = SlotPanel(events)
        self.reasoning = ReasoningPanel(self.store, self.run_id, engine.population)
        self.detail = W.HTML()
        self.lineage.on_select(self.show_program)
        tabs = W.Tab([W.VBox([self.lineage, self.detail]), self.latency, self.cells, self.ledger, self.reasoning,
                      self.slots])
        for i, t in enumerate(["lineage", "latency", "design space", "LLM ledger", "reasoning", "slots"]):
            tabs.set_title(i, t)
        self.tabs = tabs
        self._refresh = Throttle(self._render, interval)
        self._unsubscribe = events.subscribe(self._on_event)
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

    def _control(self, action: Callable[[], None]) -> None:
        if not self.ended_reason:
            action()
        self._refresh.flush()

    def end(self, reason: str) -> None:
        """Every control off, with `reason` on screen and on hover."""
        self.ended_reason = reason
        for w in (self.pause_b, self.resume_b, self.stop_b):
            w.disabled = True
            w.tooltip = reason
        self.queue.disable(reason, say=False)  # said once, in self.reason
        self.reason.value = f"<span class='cuco-disabled-reason' style='color:#555'>{esc(reason)}</span>"

    def _on_event(self, event: Event) -> None:
        with self._lock:
            self.events_seen += 1
        self._refresh()

    def show_program(self, program_id: int) -> None:
        """What a click on a lineage node opens: the program's diff against its parent and its metrics."""
        self.detail.value = program_detail_html(self.store, program_id)
        self.selected = program_id

    def _render(self) -> None:
        with self._lock:
            self.queue.refresh()
            state = self.engine.state
            if state in ENDED and not self.ended_reason:
                why = self.engine.reason
                self.end(f"search {state}{': ' + why if why else ''}; the controls are off "
                         "(the run is in its database: open it in 04_run_analysis, or resume it in a new search)")
            elif not self.ended_reason:
                self.pause_b.disabled = state != "running"
                self.resume_b.disabled = state != "paused"
                self.stop_b.disabled = False
            best = self.store.best(self.run_id)
            self.state.value = (f"state: <b>{esc(state)}</b> | pending: {len(self.queue.rows)} | "
                                + (f"best: {fmt_ms(best['median_ms'])} (program {best['program_id']})"
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
