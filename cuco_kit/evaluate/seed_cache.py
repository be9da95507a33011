"""The seed's measurement, reused across the candidates of one world, and when it is taken again.

Every ratio is candidate / seed measured in the same world with the same protocol. Measuring the seed before
every candidate (the strict form, ``remeasure_every=1``) doubles the GPU time of an evaluation; here
one measurement serves the next ``remeasure_every`` evaluations of its world, keyed by everything that changes it
(world, seed build, request seed, trials, warm-up, iterations, verification rate).

What reuse could hide, and how the protocol still catches it:
  - the GPU's speed drifts (clocks, heat, another tenant) between the seed's measurement and a candidate's, so
    a ratio is off by the drift: the seed is measured again on a schedule and whenever its world is new, and
    each new measurement is compared with the last (``drift_tolerance``); a move past it is reported in the
    provenance of the evaluation that saw it, with the number of evaluations it may have touched;
  - a lucky ratio is promoted: a ratio that claims something (a new best of this world, or one flagged for
    review) has the seed measured again right after it in the same world, and the ratio and its interval are
    computed against that measurement (``beside_claims``), so no claim rests on a stale seed;
  - the seed's verified outputs (differential verification, oracle "seed") belong to the world that recorded
    them: a measurement is reused only in the world it was taken in, and only while that world's last seed run
    is this one (another request protocol in between overwrote the record).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from cuco_kit.evaluate.api import EvalResult


@dataclass
class SeedEntry:
    result: EvalResult
    world: Any  # the WorkerGroup it was measured in (identity)
    measured_at: float = field(default_factory=time.monotonic)
    served: int = 0


class SeedCache:
    """``remeasure_every``: evaluations one measurement serves in its world (1: measure before each);
    ``drift_tolerance``: a new measurement this far (relative) from the last one is reported; ``beside_claims``:
    measure again right after a candidate whose ratio claims something (EvaluatorConfig's seed_* fields)."""

    def __init__(self, remeasure_every: int = 1, drift_tolerance: float = 0.03, beside_claims: bool = True) -> None:
        self.remeasure_every = max(1, int(remeasure_every))
        self.drift_tolerance = float(drift_tolerance)
        self.beside_claims = bool(beside_claims)
        self._entries: dict[str, SeedEntry] = {}
        self._last_run: dict[int, tuple[Any, str]] = {}  # id(world) -> (world, key of its last seed run)
        self._best: dict[str, float] = {}  # per key: the best ratio a candidate was scored at
        self.measurements = 0
        self.reuses = 0

    def reusable(self, key: str, world: Any) -> SeedEntry | None:
        """The measurement to reuse for one more evaluation in ``world``, or None: measure now."""
        entry = self._entries.get(key)
        last = self._last_run.get(id(world))
        if (entry is None or entry.world is not world or last is None or last[0] is not world or last[1] != key
                or entry.served >= self.remeasure_every):
            return None
        entry.served += 1
        self.reuses += 1
        return entry

    def store(self, key: str, world: Any, result: EvalResult) -> str:
        """Record a new measurement (it serves the evaluation that made it); returns a drift note or ''."""
        self.measurements += 1
        old = self._entries.get(key)
        self._entries[key] = SeedEntry(result, world, served=1)
        self._last_run[id(world)] = (world, key)
        if old is None or not old.result.median_ms or not result.median_ms:
            return ""
        drift = result.median_ms / old.result.median_ms - 1.0
        if abs(drift) <= self.drift_tolerance:
            return ""
        return (f"the seed's time moved {drift:+.1%} since its previous measurement ({old.result.median_ms:.4g} -> "
                f"{result.median_ms:.4g} ms, {old.served} evaluations and {time.monotonic() - old.measured_at:.0f} s "
                f"apart; beyond the {self.drift_tolerance:.0%} drift tolerance): ratios in between used "
                "the old time")

    def claims(self, key: str, result: EvalResult) -> bool:
        """Whether a passing candidate's ratio claims something worth a fresh seed beside it."""
        if not self.beside_claims or result.speedup is None:
            return False
        return bool(result.flagged) or result.speedup > max(1.0, self._best.get(key, 1.0))

    def scored(self, key: str, result: EvalResult) -> None:
        if result.verdict == "pass" and result.speedup is not None:
            self._best[key] = max(self._best.get(key, 0.0), result.speedup)
