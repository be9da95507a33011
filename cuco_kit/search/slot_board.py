"""`SlotBoard`: which slot (GPU set or Ray actor) evaluates what, and each slot's throughput, read from a search's
events, for the CLI's live log and the dashboard's slot table.

The slot executor (cuco_kit.search.slots) reports ``slot_start`` / ``slot_done`` / ``slot_lost`` steps through each
evaluation's progress callback, which the engine publishes as ``evaluation_progress`` events carrying ``slot``,
``slot_label`` and ``gpus``; ``evaluation_started`` events give the programs' names. Thread-safe: events arrive on
the search's threads, readers may be anywhere.
"""
from __future__ import annotations

import threading
from dataclasses import asdict, dataclass
from typing import Any

from cuco_kit.events import Event

SLOT_STEPS = ("slot_start", "slot_done", "slot_lost")


@dataclass
class SlotRow:
    slot: int
    label: str
    gpus: str
    program_id: int | None = None  # what it evaluates now (None: idle)
    program: str = ""
    evaluations: int = 0
    lost: int = 0
    per_hour: float = 0.0  # evaluations per hour since the slot's first start
    last_seconds: float | None = None


class SlotBoard:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rows: dict[int, SlotRow] = {}
        self._names: dict[int, str] = {}

    def on_event(self, event: Event) -> str | None:
        """Take one event; returns a line for a live log when it was a slot's start or loss, else None."""
        d = event.data
        if event.kind == "evaluation_started":
            with self._lock:
                self._names[int(d["program_id"])] = str(d.get("name", ""))
            return None
        if event.kind != "evaluation_progress" or d.get("step") not in SLOT_STEPS or "slot" not in d:
            return None
        i = int(d["slot"])
        pid = d.get("program_id")
        with self._lock:
            row = self._rows.setdefault(i, SlotRow(i, str(d.get("slot_label", f"slot {i}")), str(d.get("gpus", ""))))
            row.label = str(d.get("slot_label", row.label))  # an actor started again may have new GPUs
            row.gpus = str(d.get("gpus", row.gpus))
            name = self._names.get(int(pid), "") if pid is not None else ""
            what = f"program {pid}" + (f" ({name})" if name else "")
            if d["step"] == "slot_start":
                row.program_id, row.program = pid, name
                attempt = int(d.get("attempt", 1))
                again = f", attempt {attempt}" if attempt > 1 else ""
                return (f"{row.label} evaluates {what}{again} [{row.evaluations} done, "
                        f"{row.per_hour:.0f}/h]")
            row.program_id, row.program = None, ""
            if d["step"] == "slot_done":
                row.evaluations = int(d.get("slot_evaluations", row.evaluations + 1))
                row.per_hour = float(d.get("per_hour", row.per_hour))
                row.last_seconds = d.get("seconds")
                return None
            row.lost += 1
            then = "retried on another slot" if d.get("retry") else "recorded as an infrastructure error"
            return f"{row.label} LOST {what}: {d.get('reason', '')}; {then}"

    def rows(self) -> list[dict[str, Any]]:
        with self._lock:
            return [asdict(r) for _, r in sorted(self._rows.items())]

    def total_per_hour(self) -> float:
        with self._lock:
            return sum(r.per_hour for r in self._rows.values())
