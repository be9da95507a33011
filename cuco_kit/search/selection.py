"""Parent selection: fitness- and novelty-weighted sampling (ShinkaEvolve's "weighted"), power law over rank,
and beam (the best few, taken in turn).

Each method has a pure ``*_probabilities`` function so a test can check the distribution, and
``select_parent`` draws from it with the caller's seeded RNG.
"""
from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from cuco_kit.errors import BadInput
from cuco_kit.search.population import ProgramView

METHODS = ("weighted", "power_law", "beam")


@dataclass
class SelectionConfig:
    method: str = "weighted"
    sharpness: float = 10.0  # weighted: slope of the sigmoid over fitness around the median
    alpha: float = 1.0  # power_law: p(rank r) ~ r ** -alpha (rank 1 = best)
    beam_width: int = 3  # beam: parents come from the best `beam_width`
    crossover_pool: int = 5  # the second parent of a crossover comes from the top this many (other islands)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise BadInput(f"selection method {self.method!r} is not one of {', '.join(METHODS)}")
        if self.beam_width < 1:
            raise BadInput(f"beam_width must be >= 1, got {self.beam_width}")


def _fitness(p: ProgramView) -> float:
    return float(p.fitness or 0.0)  # the probabilities are over scored programs: never None


def weighted_probabilities(programs: Sequence[ProgramView], child_counts: dict[int, int],
                           sharpness: float = 10.0) -> list[float]:
    """p_i ~ sigmoid(sharpness * (F_i - median F) / scale) / (1 + children_i): fitter programs are favoured,
    programs that already have many children are damped so under-explored good ones get their turn."""
    fits = [_fitness(p) for p in programs]
    if not fits:
        return []
    med = statistics.median(fits)
    scale = statistics.median([abs(f - med) for f in fits]) or (abs(med) * 0.05) or 1.0
    weights = []
    for p, f in zip(programs, fits):
        z = max(-60.0, min(60.0, sharpness * (f - med) / scale))
        weights.append((1.0 / (1.0 + math.exp(-z))) / (1.0 + child_counts.get(p.id, 0)))
    return _normalise(weights)


def power_law_probabilities(programs: Sequence[ProgramView], alpha: float = 1.0) -> list[float]:
    """p(rank r) ~ r ** -alpha, rank 1 the fittest (ties broken by id); probabilities in the input order."""
    order = sorted(range(len(programs)), key=lambda i: (-_fitness(programs[i]), programs[i].id))
    weights = [0.0] * len(programs)
    for rank, i in enumerate(order, start=1):
        weights[i] = rank ** -alpha
    return _normalise(weights)


def beam_probabilities(programs: Sequence[ProgramView], width: int) -> list[float]:
    """Uniform over the best ``width`` programs, zero elsewhere."""
    order = sorted(range(len(programs)), key=lambda i: (-_fitness(programs[i]), programs[i].id))[:width]
    weights = [1.0 if i in order else 0.0 for i in range(len(programs))]
    return _normalise(weights)


def probabilities(programs: Sequence[ProgramView], config: SelectionConfig,
                  child_counts: dict[int, int] | None = None) -> list[float]:
    if config.method == "weighted":
        return weighted_probabilities(programs, child_counts or {}, config.sharpness)
    if config.method == "power_law":
        return power_law_probabilities(programs, config.alpha)
    return beam_probabilities(programs, config.beam_width)


def select_parent(candidates: Sequence[ProgramView], fallback: Sequence[ProgramView], config: SelectionConfig,
                  rng: random.Random, child_counts: dict[int, int] | None = None) -> ProgramView:
    """A parent among ``candidates`` that have a fitness; if none has one yet, uniformly among ``fallback``
    (the roots: the search must start somewhere even when the baseline failed)."""
    scored = [p for p in candidates if p.fitness is not None]
    if not scored:
        if not fallback:
            raise BadInput("no program to select a parent from: the run has no baseline program")
        return fallback[rng.randrange(len(fallback))]
    probs = probabilities(scored, config, child_counts)
    return scored[_draw(probs, rng)]


def _draw(probs: Sequence[float], rng: random.Random) -> int:
    x = rng.random()
    acc = 0.0
    for i, p in enumerate(probs):
        acc += p
        if x < acc:
            return i
    return max(i for i, p in enumerate(probs) if p > 0)


def _normalise(weights: list[float]) -> list[float]:
    total = sum(weights)
    if total <= 0:
        return [1.0 / len(weights)] * len(weights) if weights else []
    return [w / total for w in weights]
