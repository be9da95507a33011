"""The numbers both sides of an evaluation agree on, in the standard library only: which timed iterations are
verified, the seed of each rank's inputs, the size of the L2 flush, and how per-rank timings combine into the
reported median and spread.

Ranks use them while measuring (rank.harness); the parent applies iteration_stats to what they report
(gpu_evaluator). Nothing here imports torch or numpy, so the parent can import it without either.
"""
from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from typing import Any

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
