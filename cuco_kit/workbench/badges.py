"""The badge of a number: where it comes from, in the same words everywhere it appears.

Every number the kit shows carries one of five badges (banners, plots, winner text and CLI JSON use these
words and no others):

* ``real``: measured now, on this machine's GPU (a live run with the GPU evaluator);
* ``replayed``: measured on a GPU earlier and shown from a recording, with the GPU and the date;
* ``simulated``: made up by the synthetic landscape, not a measurement of anything;
* ``fixture``: a recorded answer standing in for a live model (LLM text, never a latency);
* ``model``: a formula (the overlap model of the teaching notebook), not measured.

``unmeasured`` is not a sixth kind of number: it marks a result that has NO number (the candidate was checked
and built, and no GPU was here to run it), so it appears only where a number is absent.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

NUMBER_BADGES = ("real", "replayed", "simulated", "fixture", "model")
NO_NUMBER = "unmeasured"

LABELS = {
    "real": "real (measured now on this machine's GPU)",
    "replayed": "replayed",
    "simulated": "SIMULATED",
    "fixture": "FIXTURE (recorded answer, not a live model)",
    "model": "MODEL (formula, not measured)",
    NO_NUMBER: "UNMEASURED (checked and built, no GPU here to run it)",
}


def shown_badge(stored: str, *, live: bool) -> str:
    """The badge of a stored number as it is shown now: a "real" measurement read back from a store that is
    not being written by a live run (a recording, or a finished run opened read-only) is "replayed"."""
    return "replayed" if stored == "real" and not live else stored


def detail_of(provenance: Mapping[str, Any] | None) -> str:
    """'NVIDIA H200, 2026-12-02' from an evaluation's provenance ('' when it names neither)."""
    if not provenance:
        return ""
    parts = [str(provenance[k])[:10] if k == "date" else str(provenance[k])
             for k in ("gpu", "date") if provenance.get(k)]
    return ", ".join(parts)


def label(badge: str, detail: str = "") -> str:
    """'replayed (NVIDIA H200, 2026-12-02)', 'SIMULATED', 'real (measured now ...; NVIDIA H200)'."""
    text = LABELS.get(badge, badge or "unknown")
    if detail and badge in ("real", "replayed", NO_NUMBER):
        text = f"{text} ({detail})" if badge != "real" else f"{text[:-1]}; {detail})"
    return text
