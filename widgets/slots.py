"""SlotPanel: which slot (GPU set or Ray actor) evaluates what, and each slot's evaluations per hour, live.

It reads the search's events through ``cuco_kit.search.slot_board.SlotBoard`` (the CLI's live log reads the same),
so it holds no logic of its own; the dashboard shows it in its "slots" tab. Program names come from the LLM:
the table escapes every cell.
"""
from __future__ import annotations

import ipywidgets as W

from cuco_kit.events import Event, EventSource
from cuco_kit.search.slot_board import SlotBoard

from .views import _table

COLUMNS = ["label", "gpus", "evaluating", "evaluations", "per_hour", "lost"]


class SlotPanel(W.HTML):
    """Subscribes to ``events`` (the search's EventBus); ``refresh()`` redraws (the dashboard calls it, throttled)."""

    def __init__(self, events: EventSource) -> None:
        super().__init__()
        self.board = SlotBoard()
        for event in events.history():  # what happened before the panel was made
            self.board.on_event(event)
        self._unsubscribe = events.subscribe(self._on_event)
        self.refresh()

    def _on_event(self, event: Event) -> None:
        self.board.on_event(event)

    def refresh(self) -> None:
        rows = self.board.rows()
        for r in rows:
            r["evaluating"] = (f"program {r['program_id']} {r['program']}".strip()
                               if r["program_id"] is not None else "idle")
            r["per_hour"] = round(r["per_hour"])
        total = self.board.total_per_hour()
        head = (f"<b>{len(rows)} slot(s)</b>, {total:.0f} evaluations/h in all" if rows else
                "<i>one evaluator in this process (no GPU slots)</i>")
        self.value = f"<div>{head}</div>" + (_table(rows, COLUMNS) if rows else "")

    def close(self) -> None:
        self._unsubscribe()
        super().close()
