"""Pieces every widget shares: escaping, the data badge, and throttled updates from worker threads."""
from __future__ import annotations

import html
import textwrap
import threading
import time
from collections.abc import Callable
from typing import Any

import ipywidgets as W

from cuco_kit.workbench.badges import LABELS, detail_of, label

_COLOURS = {"real": "#1b5e20", "replayed": "#0d47a1", "simulated": "#b71c1c", "unmeasured": "#5d4037",
            "model": "#6a1b9a", "fixture": "#6a1b9a"}
# badge -> (colour, label); the labels are cuco_kit.workbench.badges', so a widget says what the CLI and the banners say
BADGE_STYLE = {**{b: (c, LABELS[b]) for b, c in _COLOURS.items()}, "info": ("#37474f", "info"),
               "error": ("#b71c1c", "error")}


def esc(text: Any) -> str:
    """Every string that may come from an LLM or a candidate goes through here before it reaches HTML."""
    return html.escape("" if text is None else str(text), quote=True)


def short(text: str, width: int) -> str:
    """`text` on one line, at most `width` characters, cut at a word boundary with an ellipsis."""
    return textwrap.shorten(" ".join(text.split()), width, placeholder=" …") if text.strip() else ""


def badge_colour(badge: str) -> str:
    """The badge's colour; a badge this table does not know gets the "info" colour."""
    return BADGE_STYLE.get(badge, BADGE_STYLE["info"])[0]


def badge_html(badge: str, detail: str = "") -> str:
    colour = BADGE_STYLE.get(badge, ("#555", ""))[0]
    text = label(badge, detail) if badge in LABELS else (f"{badge} ({detail})" if detail else badge or "unknown")
    return (f'<span class="cuco-badge" data-badge="{esc(badge)}" style="background:{colour};color:white;'
            f'padding:1px 6px;border-radius:3px;font-size:11px">{esc(text)}</span>')


def badge_widget(badge: str, detail: str = "") -> W.HTML:
    return W.HTML(badge_html(badge, detail))


def provenance_detail(prov: dict[str, Any] | None) -> str:
    """'NVIDIA H200, 2026-12-02' from an evaluation's provenance."""
    return detail_of(prov)


def fmt_ms(ms: Any) -> str:
    """A latency with its unit, rounded for reading: '0.304 ms', '12.4 us', '-' when there is none."""
    if ms is None or ms != ms:  # None or NaN
        return "-"
    ms = float(ms)
    return f"{ms * 1000:.1f} us" if abs(ms) < 0.1 else f"{ms:.3f} ms" if abs(ms) < 100 else f"{ms:,.0f} ms"


class Throttle:
    """Coalesces refreshes: callers mark work dirty from any thread; `fn` runs under one lock at most once per
    `interval` seconds (the last call always lands, via a timer). Keeps notebooks responsive while a search
    publishes many events a second."""

    def __init__(self, fn: Callable[[], None], interval: float = 1.0) -> None:
        self._fn = fn
        self._interval = interval
        self._lock = threading.RLock()  # `fn` may mark work dirty again (a widget it redraws calls back): no deadlock
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
