"""The dashboard's slot table: what each slot evaluates, its throughput, losses; names escaped."""
from __future__ import annotations

from cuco_kit.events import EventBus
from cuco_kit.widgets import SlotPanel

EVIL = "<img src=x onerror=alert(1)>"


def test_slot_panel_shows_what_each_slot_evaluates_and_its_rate() -> None:
    bus = EventBus()
    bus.publish("evaluation_started", evaluation_id=1, program_id=7, world_size=2, backend="nccl", badge="real",
                name=EVIL)
    panel = SlotPanel(bus)  # made after the first event: it reads the history
    assert "no GPU slots" in panel.value
    slot0 = {"slot": 0, "slot_label": "slot 0 [GPU 0,1]", "gpus": "0,1"}
    slot1 = {"slot": 1, "slot_label": "actor 1 [GPU 2,3]", "gpus": "2,3"}
    bus.publish("evaluation_progress", evaluation_id=1, program_id=7, step="slot_start", attempt=1, **slot0)
    bus.publish("evaluation_progress", evaluation_id=2, program_id=8, step="slot_start", attempt=1, **slot1)
    bus.publish("evaluation_progress", evaluation_id=2, program_id=8, step="slot_done", seconds=0.5,
                slot_evaluations=3, per_hour=7200.0, **slot1)
    panel.refresh()
    html = panel.value
    assert "2 slot(s)" in html and "7200 evaluations/h in all" in html
    assert "slot 0 [GPU 0,1]" in html and "actor 1 [GPU 2,3]" in html and "idle" in html
    assert EVIL not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    panel.close()
