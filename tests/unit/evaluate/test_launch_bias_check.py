"""The launch-bias comparison (benchmarks/harness/bias_check.py) on synthetic numbers: the product's time in a
profiled step, each side's bias and the harness's against torch's with intervals; noise and a different cuBLAS
kernel pass, time the harness adds to its window fails."""
from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[3]
_spec = importlib.util.spec_from_file_location("bias_check_under_test",
                                               ROOT / "benchmarks" / "harness" / "bias_check.py")
assert _spec is not None and _spec.loader is not None
bias_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bias_check)

HOLD = "(anonymous namespace)::hold_kernel(unsigned long const*, unsigned long, unsigned long, int volatile*)"
BARRIER = "(anonymous namespace)::barrier_kernel(unsigned long* const*, unsigned long, int, int, unsigned long)"
GEMM = "nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_NNN"


def _row(name: str, start: float, dur: float) -> dict[str, Any]:
    return {"name": name, "start_us": start, "dur_us": dur}


def _step(product_us: float, *, barrier: bool = True, extra: float = 0.0) -> list[dict[str, Any]]:
    """One held step as a profiler sees it: input preparation and the L2 flush, the hold (it spins until the host
    releases it), the barrier under the harness, then the product; rows not in time order."""
    rows = [_row("void at::native::normal_kernel", 0.0, 3.0), _row("fill_kernel (L2 flush)", 4.0, 80.0),
            _row(HOLD, 90.0, 40.0)]
    start = 131.0
    if barrier:
        rows.append(_row(BARRIER, start, 2.0))
        start += 3.0
    rows.append(_row(GEMM, start, product_us))
    if extra:
        rows.append(_row("splitKreduce_kernel", start + product_us + 0.5, extra))
    return rows[::-1]


def _side(rng: np.random.Generator, kernel_us: float, overhead_us: float, *, n: int = 30, profiled: int = 20,
          jitter_us: float = 0.1, barrier: bool = True) -> tuple[list[float], list[list[dict[str, Any]]]]:
    """Timed held iterations (ms) = the kernel + what the timing adds + noise, and profiled steps of the kernel."""
    device = list((kernel_us + overhead_us + rng.normal(0.0, jitter_us, n)) / 1000.0)
    steps = [_step(float(k), barrier=barrier) for k in kernel_us + rng.normal(0.0, jitter_us / 2, profiled)]
    return device, steps


def test_the_product_is_everything_after_the_harness_own_kernels() -> None:
    assert bias_check.product_us(_step(6.3)) == pytest.approx(6.3)
    assert bias_check.product_us(_step(6.3, barrier=False)) == pytest.approx(6.3)  # torch: the hold alone
    assert bias_check.product_us(_step(6.3, extra=2.0)) == pytest.approx(6.3 + 0.5 + 2.0)  # a second kernel, gap too
    unheld = [r for r in _step(6.3) if r["name"] not in (HOLD, BARRIER)]
    assert bias_check.product_us(unheld) is None  # no hold: nothing tells the product from the preparation
    assert bias_check.product_us([r for r in _step(6.3) if r["name"] != GEMM]) is None
    mangled = [{**r, "name": "_ZN12_GLOBAL__N_111hold_kernelEPKmmmPVi"} if r["name"] == HOLD else r
               for r in _step(6.3, barrier=False)]
    assert bias_check.product_us(mangled) == pytest.approx(6.3)


def test_timeline_rows_are_split_per_profiled_step() -> None:
    rows = [{**r, "iteration": i} for i in (1, 0) for r in _step(5.0 + i)]
    steps = bias_check.steps_of(rows)
    assert [bias_check.product_us(s) for s in steps] == [pytest.approx(5.0), pytest.approx(6.0)]


def test_noise_and_a_different_cublas_kernel_pass() -> None:
    rng = np.random.default_rng(1)
    # 1024: the harness's 8.7 us around a 6.3 us kernel; torch picks a faster kernel and carries as much around it
    h_dev, h_steps = _side(rng, 6.3, 2.4)
    t_dev, t_steps = _side(rng, 5.9, 2.3, barrier=False)
    out = bias_check.compare(h_dev, h_steps, t_dev, t_steps, 0.03)
    assert out["ok"], out["bias_ratio_ci"]
    assert out["harness"]["bias"] == pytest.approx(8.7 / 6.3, rel=0.02)
    lo, hi = out["bias_ratio_ci"]
    assert lo < out["bias_ratio"] < hi and hi - lo < 0.1
    assert h_dev and np.median(h_dev) / np.median(t_dev) > 1.03  # the device times alone differ by more than 3%


def test_at_8192_a_slower_torch_kernel_no_longer_fails_the_harness() -> None:
    rng = np.random.default_rng(2)
    h_dev, h_steps = _side(rng, 1385.6, 8.4, jitter_us=3.0)
    t_dev, t_steps = _side(rng, 1440.0, 8.6, jitter_us=6.0, barrier=False)
    out = bias_check.compare(h_dev, h_steps, t_dev, t_steps, 0.03)
    assert out["ok"] and abs(out["bias_ratio"] - 1.0) < 0.01, out["bias_ratio_ci"]
    assert np.median(h_dev) / np.median(t_dev) < 0.97


@pytest.mark.parametrize("added_us", [40.0, 1.0])
def test_time_the_harness_adds_to_its_window_fails(added_us: float) -> None:
    # 40 us: host launches inside the window (as before the hold); 1 us: a sync or a barrier inside it
    rng = np.random.default_rng(3)
    h_dev, h_steps = _side(rng, 6.3, 2.4 + added_us)
    t_dev, t_steps = _side(rng, 6.3, 2.4, barrier=False)
    out = bias_check.compare(h_dev, h_steps, t_dev, t_steps, 0.03)
    assert not out["ok"]
    assert out["bias_ratio_ci"][0] > 1.03
    assert out["bias_ratio"] == pytest.approx((8.7 + added_us) / 8.7, rel=0.05)


def test_a_wide_interval_is_not_a_failure_and_a_missing_side_is() -> None:
    rng = np.random.default_rng(4)
    h_dev, h_steps = _side(rng, 6.3, 2.4 + 0.4, n=6, profiled=4, jitter_us=1.5)
    t_dev, t_steps = _side(rng, 6.3, 2.4, n=6, profiled=4, jitter_us=1.5, barrier=False)
    noisy = bias_check.compare(h_dev, h_steps, t_dev, t_steps, 0.03)
    lo, hi = noisy["bias_ratio_ci"]
    assert noisy["ok"] and lo < 1.03 and hi - lo > 0.1  # not shown to be outside: passes, and the width says why
    gone = bias_check.compare(h_dev, h_steps, None, [], 0.03)
    assert not gone["ok"] and gone["bias_ratio"] is None and gone["bias_ratio_ci"] is None
    unheld = bias_check.compare(h_dev, h_steps, t_dev, [[r for r in s if r["name"] != HOLD] for s in t_steps], 0.03)
    assert not unheld["ok"] and unheld["torch"]["product_us"] == []


def test_outside_means_the_whole_interval() -> None:
    assert bias_check.outside([1.031, 1.2], 0.03) and bias_check.outside([0.5, 0.969], 0.03)
    assert not bias_check.outside([0.9, 0.98], 0.03) and not bias_check.outside([1.02, 1.5], 0.03)
