"""The comparison behind the launch-bias check (launch_bias.py says what it measures and why): the product's time
in a profiled step, a side's bias (its held device time over that product time) and the harness's bias against
torch's, each with a percentile bootstrap interval from cuco_kit.evaluate.stats, and the verdict.

A side is its timed held iterations (device_ms) and its profiled held steps (kernel rows {name, start_us, dur_us},
one list per step). The check fails only when the interval of harness bias / torch bias lies entirely outside
1 +- bar; a missing side or interval fails too (nothing to claim).
"""
from __future__ import annotations

import re
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from cuco_kit.evaluate.stats import bootstrap_ci, speedup_ci

# The harness's own kernels in a held step (runtime/harness_helpers.cu): the hold and, under the harness, the
# device barrier after it. The product is whatever the step ran after the last of them. No word boundaries: a
# mangled name (_ZN12_GLOBAL__N_111hold_kernelEPKmmmPVi) must match too.
HARNESS_OWN = re.compile(r"(hold|barrier)_kernel")

Rows = Sequence[Mapping[str, Any]]


def steps_of(timeline: Rows) -> list[list[Mapping[str, Any]]]:
    """One rank's timeline (EvalResult.timeline at world size 1; rows with "iteration") -> one list of rows per
    profiled step."""
    steps: dict[int, list[Mapping[str, Any]]] = {}
    for r in timeline:
        steps.setdefault(int(r.get("iteration", 0)), []).append(r)
    return [steps[i] for i in sorted(steps)]


def product_us(step: Rows) -> float | None:
    """The product's time in one profiled held step: from the start of the first kernel (or copy) after the
    harness's own hold/barrier kernels to the end of the last one, gaps between them included. None when the
    step has no hold (it was not held) or ran nothing after it."""
    rows = sorted(step, key=lambda r: float(r["start_us"]))
    own = [i for i, r in enumerate(rows) if HARNESS_OWN.search(str(r["name"]))]
    after = rows[own[-1] + 1:] if own else []
    if not after:
        return None
    return max(float(r["start_us"]) + float(r["dur_us"]) for r in after) - float(after[0]["start_us"])


def side_bias(device_ms: Sequence[float] | None, steps: Sequence[Rows]) -> dict[str, Any]:
    """One side: median held device time, the product's time per profiled step, and bias = median(device) /
    median(product) with its interval (speedup_ci is that very bootstrap: median(first) / median(second))."""
    products = [p for p in (product_us(s) for s in steps) if p]
    device = [float(x) for x in device_ms or []]
    product_ms = [p / 1000.0 for p in products]
    bias = statistics.median(device) / statistics.median(product_ms) if device and product_ms else None
    return {"device_median_ms": statistics.median(device) if device else None, "product_us": products,
            "product_median_us": statistics.median(products) if products else None, "bias": bias,
            "bias_ci": speedup_ci(device, product_ms)}


def _bias_ratio(h_dev: np.ndarray, h_prod: np.ndarray, t_dev: np.ndarray, t_prod: np.ndarray) -> np.ndarray:
    def bias(dev: np.ndarray, prod: np.ndarray) -> np.ndarray:
        return np.median(dev, axis=1) / np.median(prod, axis=1)
    return bias(h_dev, h_prod) / bias(t_dev, t_prod)


def outside(ci: Sequence[float], bar: float) -> bool:
    """Whether an interval of a ratio lies entirely outside 1 +- bar."""
    return ci[0] > 1.0 + bar or ci[1] < 1.0 - bar


def compare(harness_device_ms: Sequence[float] | None, harness_steps: Sequence[Rows],
            torch_device_ms: Sequence[float] | None, torch_steps: Sequence[Rows], bar: float) -> dict[str, Any]:
    """Both sides' biases and the harness's against torch's: {"harness": side, "torch": side, "bias_ratio",
    "bias_ratio_ci", "ok"}. Each side's samples are resampled on their own (unpaired: the timed and the profiled
    steps are different iterations)."""
    h, t = side_bias(harness_device_ms, harness_steps), side_bias(torch_device_ms, torch_steps)
    ratio = h["bias"] / t["bias"] if h["bias"] and t["bias"] else None
    ci = None
    if h["bias_ci"] is not None and t["bias_ci"] is not None:  # both sides have 2+ positive finite samples each
        samples = [harness_device_ms or [], [p / 1000.0 for p in h["product_us"]], torch_device_ms or [],
                   [p / 1000.0 for p in t["product_us"]]]
        ci = list(bootstrap_ci(samples, _bias_ratio))
    return {"harness": h, "torch": t, "bias_ratio": ratio, "bias_ratio_ci": ci,
            "ok": ci is not None and not outside(ci, bar)}
