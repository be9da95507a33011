"""The numbers both sides of an evaluation agree on: which timed iterations are verified, the seed of each rank's
inputs, the size of the L2 flush, how per-rank timings combine into the reported median and spread, and how
sure a ratio is (a seeded percentile bootstrap over the timed iterations).

Ranks use them while measuring (rank.harness); the parent applies iteration_stats and speedup_ci to what they
report (gpu_evaluator). Only the standard library and numpy (no torch), so the parent imports it freely.
"""
from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

FLUSH_BYTES = 256 << 20  # >= 2x the 60 MB L2 of H100/H200


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolation percentile, q in [0, 100]: numpy's default method, to the last bit."""
    xs = sorted(float(v) for v in values)
    if not xs:
        raise ValueError("percentile: no values")
    pos = q / 100.0 * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    t = pos - lo
    a, b = xs[lo], xs[hi]
    # numpy's lerp: from below for t < 0.5, from above otherwise (exact at both ends)
    return a + (b - a) * t if t < 0.5 else b - (b - a) * (1.0 - t)


def iteration_stats(per_rank_ms: Sequence[Sequence[float]]) -> dict[str, Any]:
    """Combine per-rank timings of the same iterations: an iteration takes as long as its slowest rank.
    Returns iteration_ms (max over ranks), median_ms and spread_ms (p90 - p10) of those, and every rank's
    own median. Ranks must report the same number of iterations."""
    if not per_rank_ms or not per_rank_ms[0]:
        raise ValueError("iteration_stats: no timings")
    n = len(per_rank_ms[0])
    if any(len(r) != n for r in per_rank_ms):
        raise ValueError(f"iteration_stats: ranks report different iteration counts {[len(r) for r in per_rank_ms]}")
    ranks = [[float(x) for x in r] for r in per_rank_ms]
    if any(not math.isfinite(x) or x < 0 for r in ranks for x in r):
        raise ValueError("iteration_stats: non-finite or negative time")
    it = [max(column) for column in zip(*ranks)]
    p10, p90 = percentile(it, 10), percentile(it, 90)
    return {"iteration_ms": it, "median_ms": statistics.median(it), "spread_ms": p90 - p10, "p10_ms": p10,
            "p90_ms": p90, "per_rank_median_ms": [statistics.median(r) for r in ranks]}


def verified_iterations(iters: int, verify_every: int, seed: int) -> list[int]:
    """Timed iterations to verify: the first, plus each other with probability 1/verify_every (seeded, so all
    ranks pick the same ones)."""
    rng = random.Random(f"verify:{seed}")
    every = max(1, int(verify_every))
    return [i for i in range(iters) if i == 0 or rng.random() < 1.0 / every]


def input_seed(seed: int, trial: int, rank: int) -> int:
    """Seed of one rank's inputs in one trial; the same on every rank (so references need no gather)."""
    return (int(seed) * 1_000_003 + int(trial) * 9_176_941 + int(rank) * 7919 + 17) % (2**63 - 1)


# ---- confidence intervals ------------------------------------------------------------------------------------


def median_ci_halfwidth(values: Sequence[float], z: float = 1.96) -> float:
    """Half the width of a distribution-free ~95% interval of the median: the order statistics n/2 -+ z*sqrt(n)/2
    (the binomial's normal approximation), clamped to the sample. For 5 values it is half the range, so a stop
    rule built on it needs every one of them close; it narrows as 1/sqrt(n). inf for fewer than 2 values."""
    xs = sorted(float(v) for v in values)
    n = len(xs)
    if n < 2:
        return math.inf
    half = z * math.sqrt(n) / 2.0
    lo = max(0, math.floor(n / 2.0 - half))
    hi = min(n - 1, math.ceil(n / 2.0 + half) - 1)
    return (xs[hi] - xs[lo]) / 2.0

CI_LEVEL = 0.95  # two-sided
BOOTSTRAP_RESAMPLES = 2000
NO_DIFFERENCE = "no measurable difference"  # the label of a ratio whose interval contains 1.0


def bootstrap_ci(samples: Sequence[Sequence[float]], statistic: Callable[..., np.ndarray], *,
                 resamples: int = BOOTSTRAP_RESAMPLES, level: float = CI_LEVEL, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of `statistic` over independent samples: each sample is resampled with
    replacement on its own, `resamples` times (seeded: the same inputs give the same interval). `statistic`
    takes one (resamples, n_i) array per sample and returns one value per resample."""
    rng = np.random.default_rng(seed)
    drawn = [rng.choice(np.asarray(x, dtype=float), size=(resamples, len(x)), replace=True) for x in samples]
    values = statistic(*drawn)
    tail = (1.0 - level) / 2.0
    lo, hi = np.quantile(values, [tail, 1.0 - tail])
    return float(lo), float(hi)


def _median_ratio(seed: np.ndarray, candidate: np.ndarray) -> np.ndarray:
    return np.median(seed, axis=1) / np.median(candidate, axis=1)


def speedup_ci(seed_ms: Sequence[float] | None, candidate_ms: Sequence[float] | None, *,
               seed: int = 0) -> list[float] | None:
    """[lo, hi]: the CI_LEVEL bootstrap interval of median(seed) / median(candidate) from the two runs' timed
    iterations (unpaired: they were measured one after the other). None (absent) when either side carries
    fewer than 2 positive finite times."""
    if not seed_ms or not candidate_ms or len(seed_ms) < 2 or len(candidate_ms) < 2:
        return None
    if not all(math.isfinite(x) and x > 0 for x in [*seed_ms, *candidate_ms]):
        return None
    lo, hi = bootstrap_ci([seed_ms, candidate_ms], _median_ratio, seed=seed)
    return [lo, hi]


def mean_ci(values: Sequence[float], *, seed: int = 0) -> list[float] | None:
    """[lo, hi]: the CI_LEVEL bootstrap interval of the mean of `values` (None for fewer than 2)."""
    if len(values) < 2:
        return None
    lo, hi = bootstrap_ci([values], lambda a: a.mean(axis=1), seed=seed)
    return [lo, hi]


def no_measurable_difference(ci: Sequence[float] | None) -> bool:
    """Whether an interval of a ratio contains 1.0 (False when the interval is absent)."""
    return ci is not None and len(ci) == 2 and ci[0] <= 1.0 <= ci[1]


def ratio_label(ci: Sequence[float] | None) -> str:
    """What a table says beside a ratio: NO_DIFFERENCE when its interval contains 1.0, "no interval" when it is
    absent, else ""."""
    if ci is None:
        return "no interval"
    return NO_DIFFERENCE if no_measurable_difference(ci) else ""
