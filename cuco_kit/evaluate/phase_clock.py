"""Where an evaluation's time goes: wall seconds per named phase, summed over the phase's visits.

Both sides keep one: the parent (build wait, worker start, the seed's and the candidate's commands) and each rank
(loading, set-up, verification trials, stress trials, device and end-to-end timing, teardown). The rank's phases
travel in its reply; the parent keeps the slowest rank's value of each (the ranks move in lockstep, so the
slowest rank is the one the evaluation waited for) under ``rank.<phase>`` in the result's ``provenance["phases"]``.
"""
from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager


class PhaseClock:
    """Accumulates wall seconds per phase name (a phase may be entered many times)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t0 = time.monotonic()
        try:
            yield
        finally:
            self.add(name, time.monotonic() - t0)

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + max(0.0, float(seconds))

    def rounded(self, digits: int = 4) -> dict[str, float]:
        return {k: round(v, digits) for k, v in self.seconds.items()}


def slowest_rank(per_rank: Sequence[Mapping[str, float] | None]) -> dict[str, float]:
    """Each phase's largest value over the ranks' replies (a missing reply or phase counts as absent)."""
    out: dict[str, float] = {}
    for phases in per_rank:
        for k, v in (phases or {}).items():
            out[k] = max(out.get(k, 0.0), float(v))
    return out
