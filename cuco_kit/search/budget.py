"""Budgets: generations, wall time, evaluations and LLM dollars (evaluation-side calls included).

Dollars are per RUN (default DEFAULT_LLM_DOLLARS, the paper's bound per workload), read from the store's LLM
ledger for the run, so every client that records into the same store and
run (the search's mutators and any evaluation-side helper) counts; the ledger itself reserves each call's worst
case before sending it and refuses what does not fit, counting everything spent in the database
(cuco_kit/llm/ledger.py, per run). Wall time adds up over resumed sessions (the engine stores what earlier
sessions used).
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from cuco_kit.errors import BadInput
from cuco_kit.store import Store

# The paper's bound per workload: every run has a dollar budget unless it is set to None on purpose.
DEFAULT_LLM_DOLLARS = 10.0


@dataclass
class BudgetConfig:
    generations: int = 10
    wall_s: float | None = None  # None: no limit
    llm_dollars: float | None = DEFAULT_LLM_DOLLARS  # per run, every session of it; None: no dollar limit
    llm_tokens: int | None = None  # tokens of LLM calls at unknown price (None: the ledger's default)
    # Evaluations started by the search, seed and baseline included; one a kill interrupted does not count (its
    # re-run does), so a resumed run stops where an uninterrupted one would.
    evaluations: int | None = None

    def __post_init__(self) -> None:
        if self.generations < 0:
            raise BadInput(f"generations must be >= 0, got {self.generations}")
        for name in ("wall_s", "llm_dollars", "llm_tokens", "evaluations"):
            v = getattr(self, name)
            if v is not None and v < 0:
                raise BadInput(f"budget {name} must be >= 0 or None, got {v}")


class BudgetTracker:
    def __init__(self, config: BudgetConfig, store: Store, run_id: int, *, wall_used_before: float = 0.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.store = store
        self.run_id = run_id
        self.wall_before = float(wall_used_before)
        self._clock = clock
        self._start = clock()

    def wall_used(self) -> float:
        return self.wall_before + (self._clock() - self._start)

    def dollars_used(self) -> float:
        return float(self.store.llm_dollars(self.run_id))

    def evaluations_used(self) -> int:
        return sum(e["status"] != "interrupted" for e in self.store.evaluations(run_id=self.run_id))

    def exhausted(self, generations_done: int) -> str | None:
        """Why the run must stop proposing (None while there is budget left)."""
        c = self.config
        if generations_done >= c.generations:
            return f"generation budget reached ({generations_done} of {c.generations})"
        if c.wall_s is not None and self.wall_used() >= c.wall_s:
            return f"wall-time budget reached ({self.wall_used():.1f} s of {c.wall_s:.1f} s)"
        if c.llm_dollars is not None and self.dollars_used() >= c.llm_dollars:
            return f"LLM budget reached (${self.dollars_used():.4f} of ${c.llm_dollars:.4f})"
        if c.evaluations is not None and self.evaluations_used() >= c.evaluations:
            return f"evaluation budget reached ({self.evaluations_used()} of {c.evaluations})"
        return None

    def hard_stop(self) -> str | None:
        """Limits that also stop evaluating work already approved (wall time only: dollars and generations
        stop new proposals, but what was approved is still worth measuring)."""
        c = self.config
        if c.wall_s is not None and self.wall_used() >= c.wall_s:
            return f"wall-time budget reached ({self.wall_used():.1f} s of {c.wall_s:.1f} s)"
        return None
