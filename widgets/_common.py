"""Pieces every widget shares: escaping, the data badge, and throttled updates from worker threads."""
from __future__ import annotations

import html
import threading
import time
from collections.abc import Callable
from typing import Any

import ipywidgets as W

BADGE_STYLE = {
    "real": ("#1b5e20", "real GPU measurement"),
    "replayed": ("#0d47a1", "replayed"),
    "simulated": ("#b71c1c", "SIMULATED"),
    "unmeasured": ("#5d4037", "UNMEASURED (checked and built, no GPU here to run it)"),
    "model": ("#6a1b9a", "MODEL (formula, not measured)"),
    "fixture": ("#6a1b9a", "FIXTURE (recorded answer, not a live model)"),
    "info": ("#37474f", "info"),
}


def esc(text: Any) -> str:
    """Every string that may come from an LLM or a candidate goes through here before it reaches HTML."""
    return html.escape("" if text is None else str(text), quote=True)


def badge_colour(badge: str) -> str:
    """The badge's colour; a badge this table does not know gets the "info" colour."""
    return BADGE_STYLE.get(badge, BADGE_STYLE["info"])[0]


def badge_html(badge: str, detail: str = "") -> str:
    colour, label = BADGE_STYLE.get(badge, ("#555", badge or "unknown"))
    if badge == "replayed" and detail:
        label = f"replayed: {detail}"
    elif detail and badge not in ("simulated", "model"):  # their label already says what they are
        label = f"{label} ({detail})"
    return (f'<span class="cuco-badge" style="background:{colour};color:white;padding:1px 6px;'
            f'border-radius:3px;font-size:11px">{esc(label)}</span>')


def badge_widget(badge: str, detail: str = "") -> W.HTML:
    return W.HTML(badge_html(badge, detail))


def provenance_detail(prov: dict[str, Any] | None) -> str:
    """'NVIDIA H200, 2026-12-02' from an evaluation's provenance."""
    if not prov:
        return ""
    parts = [str(prov.get(k)) for k in ("gpu", "date") if prov.get(k)]
    return ", ".join(parts)


class Throttle:
    """Coalesces refreshes: callers mark work dirty from any thread; `fn` runs under one lock at most once per
    `interval` seconds (the last call always lands, via a timer). Keeps notebooks responsive while a search
    publishes many events a second."""

    def __init__(self, fn: Callable[[], None], interval: float = 1.0) -> None:
        self._fn = fn
        self._interval = interval
        self._lock = threading.Lock()
        self._last = 0.0
        self._timer: threading.Timer | None = None
        self.calls = 0

    def __call__(self) -> None:
        with self._lock:
            wait = self._interval - (time.monotonic() - self._last)
            if wait <= 0:
                self._run_locked()
            elif self._timer is None:
                self._timer = threading.Timer(wait, self._fire)
                self._timer.daemon = True
                self._timer.start()

    def _fire(self) -> None:
        with self._lock:
            self._timer = None
            self._run_locked()

    def _run_locked(self) -> None:
        self._last = time.monotonic()
        self.calls += 1
        self._fn()

    def flush(self) -> None:
        """Run now (tests, and the final refresh when a run ends)."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._run_locked()

    def close(self) -> None:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
