"""Stop at a target: the search ends once a program's speed-up over the seed beats ``SearchConfig.target_ratio``
with its interval clear of it -- the lower bound of the 95% bootstrap interval of the speed-up (EvalResult's
``speedup_ci``, from both runs' timed iterations) above the target, not just the point estimate. A program
whose result carries no interval (too few iterations to bootstrap) never ends the search: a lucky median alone
is not a claim.
"""
from __future__ import annotations

import math

from cuco_kit.search.population import Population, ProgramView


def clears(p: ProgramView, target: float) -> float | None:
    """The lower bound of ``p``'s speed-up interval when it is above ``target`` (and its ratio too), else None."""
    if p.fitness is None or p.fitness <= target or not p.result:
        return None
    ci = p.result.get("speedup_ci")
    if not isinstance(ci, (list, tuple)) or len(ci) != 2:
        return None
    lo = ci[0]
    if not isinstance(lo, (int, float)) or not math.isfinite(lo) or lo <= target:
        return None
    return float(lo)


def reached(population: Population, target: float | None) -> str | None:
    """The stop reason when a scored program clears ``target`` (the earliest such program), else None."""
    if target is None:
        return None
    for p in population.scored():
        lo = clears(p, target)
        if lo is not None:
            hi = (p.result or {})["speedup_ci"][1]
            return (f"target reached: program {p.id} ({p.name}) is {p.fitness:.3f}x the seed, 95% interval "
                    f"[{lo:.3f}, {hi:.3f}] clear of the target {target:g}x")
    return None
