"""A UCB bandit that picks the mutation model for each proposal, on improvement per dollar.

Each arm is a configured mutation model. Its value is the fitness it gained over the parents of its programs
(model_stats.ModelRole.improvement) divided by what its calls cost; a model of unknown price is charged its
tokens at ``UNKNOWN_PRICE_PER_MTOK`` (never free). Values are scaled by the best arm's, so the exploration weight
``c`` means the same at any price level, and the score is ``value + c * sqrt(2 ln N / n)`` over the arms' call
counts (UCB1). An arm never tried goes first. The state is read from the store on every choice, so a resumed run
picks up where it stopped, and the dashboard shows the same numbers (``BanditArm``).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from cuco_kit.search.model_stats import ModelRole

# $ per million tokens charged, for the bandit's value only, to a model whose price is unknown.
UNKNOWN_PRICE_PER_MTOK = 10.0


@dataclass(frozen=True)
class BanditArm:
    model: str
    calls: int
    dollars: float  # what the value divides by (unknown prices charged as above)
    improvement: float
    value: float  # improvement per dollar, scaled by the best arm's (0..1)
    bonus: float  # exploration term
    score: float  # value + bonus (inf: never tried)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def arms(models: Sequence[str], roles: Sequence[ModelRole], c: float) -> list[BanditArm]:
    """The bandit's arms in ``models`` order, from the run's mutation usage rows."""
    use = {r.model: r for r in roles if r.role == "mutation"}
    total = sum(use[m].calls for m in models if m in use)
    raw = {}
    for m in models:
        r = use.get(m)
        cost = (r.dollars + r.unpriced_tokens * UNKNOWN_PRICE_PER_MTOK / 1e6) if r else 0.0
        raw[m] = (r.improvement / cost) if r and cost > 0 else 0.0
    top = max(raw.values(), default=0.0)
    out = []
    for m in models:
        r = use.get(m)
        n = r.calls if r else 0
        cost = (r.dollars + r.unpriced_tokens * UNKNOWN_PRICE_PER_MTOK / 1e6) if r else 0.0
        value = raw[m] / top if top > 0 else 0.0
        bonus = c * math.sqrt(2 * math.log(max(total, 1)) / n) if n else math.inf
        out.append(BanditArm(m, n, cost, r.improvement if r else 0.0, value, bonus, value + bonus))
    return out


def choose(models: Sequence[str], roles: Sequence[ModelRole], c: float) -> str:
    """The model with the highest score (the first in ``models`` order on a tie)."""
    best = max(arms(models, roles, c), key=lambda a: a.score)  # max keeps the first of equal scores
    return best.model
