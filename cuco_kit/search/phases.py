"""Explore / exploit phases: each sets the mutation mix, the LLM temperature and the parent-selection method.

Explore favours full rewrites, crossovers and a flat selection (a higher temperature too); exploit favours
small diffs and design-space moves around the best programs. Switching follows either a fixed schedule or
stagnation: after ``patience`` generations without a new best, exploit turns to explore; after
``explore_generations`` of exploring (or on a new best found while exploring) it turns back.
"""
from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from typing import Any

from cuco_kit.errors import BadInput
from cuco_kit.search.proposal import MUTATION_KINDS

PHASES = ("explore", "exploit")


@dataclass
class PhaseSettings:
    name: str
    mix: dict[str, float]  # mutation kind -> weight
    temperature: float
    selection: str  # "weighted" | "power_law" | "beam"
    hint: str = ""  # one sentence for the prompt

    def draw_kind(self, rng: random.Random, available: set[str]) -> str | None:
        """A mutation kind drawn from the mix, restricted to the kinds some source can serve."""
        items = [(k, w) for k, w in self.mix.items() if k in available and w > 0]
        if not items:
            return None
        total = sum(w for _, w in items)
        x = rng.random() * total
        for k, w in items:
            x -= w
            if x < 0:
                return k
        return items[-1][0]


def _explore() -> PhaseSettings:
    return PhaseSettings("explore", {"diff": 0.3, "full": 0.3, "crossover": 0.2, "design_space": 0.4}, 1.0,
                         "weighted", "Try a structurally different design (placement, issuer, fusion); "
                                     "bold changes are welcome.")


def _exploit() -> PhaseSettings:
    return PhaseSettings("exploit", {"diff": 0.6, "full": 0.05, "crossover": 0.15, "design_space": 0.6}, 0.4,
                         "power_law", "Refine what works: small, careful changes to the best design.")


@dataclass
class PhaseConfig:
    mode: str = "stagnation"  # "stagnation" | "schedule" | "fixed"
    start: str = "explore"
    patience: int = 3  # stagnation: generations without a new best before exploring
    explore_generations: int = 2  # stagnation: generations of exploring before exploiting again
    schedule: list[list[Any]] = field(default_factory=list)  # schedule: [[from_generation, phase], ...]
    explore: PhaseSettings = field(default_factory=_explore)
    exploit: PhaseSettings = field(default_factory=_exploit)

    def __post_init__(self) -> None:
        if self.mode not in ("stagnation", "schedule", "fixed"):
            raise BadInput(f"phase mode {self.mode!r} is not one of stagnation, schedule, fixed")
        if self.start not in PHASES:
            raise BadInput(f"phase {self.start!r} is not one of {', '.join(PHASES)}")
        for _, name in self.schedule:
            if name not in PHASES:
                raise BadInput(f"phase schedule names {name!r}; phases are {', '.join(PHASES)}")
        for s in (self.explore, self.exploit):
            if isinstance(s, dict):  # from JSON (a stored run config)
                raise BadInput("PhaseConfig.explore/exploit must be PhaseSettings; use PhaseConfig.from_dict")
            unknown = set(s.mix) - set(MUTATION_KINDS)
            if unknown:
                raise BadInput(f"phase {s.name}: unknown mutation kind(s) {sorted(unknown)}; "
                               f"kinds: {', '.join(MUTATION_KINDS)}")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PhaseConfig:
        d = dict(d)
        for k in ("explore", "exploit"):
            if isinstance(d.get(k), dict):
                d[k] = PhaseSettings(**d[k])
        return cls(**d)


@dataclass
class PhaseState:
    """What the controller must remember across generations (stored in the run's metadata for resume)."""

    phase: str
    since: int = 0  # generation the phase started
    stagnant: int = 0  # generations without a new best
    best: float | None = None  # best fitness seen so far
    switches: list[list[Any]] = field(default_factory=list)  # [[generation, phase, reason], ...]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class PhaseController:
    def __init__(self, config: PhaseConfig, state: PhaseState | None = None) -> None:
        self.config = config
        self.state = state or PhaseState(phase=self._scheduled(0) if config.mode == "schedule" else config.start)

    @property
    def settings(self) -> PhaseSettings:
        return self.config.explore if self.state.phase == "explore" else self.config.exploit

    def _scheduled(self, generation: int) -> str:
        phase = self.config.start
        for start, name in sorted(self.config.schedule, key=lambda x: x[0]):
            if generation >= start:
                phase = name
        return phase

    def end_generation(self, generation: int, best_fitness: float | None) -> str | None:
        """Account for finished generation ``generation`` (1-based) whose run-best is ``best_fitness``; returns
        the reason when the phase switched (the new phase applies from the next generation)."""
        s = self.state
        first = s.best is None
        improved = best_fitness is not None and (s.best is None or best_fitness > s.best)
        if improved:
            s.best = best_fitness
            s.stagnant = 0
        else:
            s.stagnant += 1
        reason = None
        new = s.phase
        if self.config.mode == "schedule":
            new = self._scheduled(generation + 1)  # the phase of the next generation
            reason = "schedule" if new != s.phase else None
        elif self.config.mode == "stagnation":
            if s.phase == "exploit" and s.stagnant >= self.config.patience:
                new, reason = "explore", f"no new best for {s.stagnant} generation(s)"
            elif s.phase == "explore" and improved and not first:
                new, reason = "exploit", "exploring found a new best"
            elif s.phase == "explore" and generation - s.since >= self.config.explore_generations:
                new, reason = "exploit", f"explored for {generation - s.since} generation(s)"
        if new != s.phase:
            s.phase = new
            s.since = generation
            s.stagnant = 0 if new == "explore" else s.stagnant
            s.switches.append([generation, new, reason])
            return reason
        return None
