"""A SIMULATED landscape evaluator for tests and smoke runs: every number it returns is made up, deterministic
and badged "simulated" (widgets show the badge; nothing here may be reported as a measurement).

Latency is a function of the candidate's knob values: each (knob, value) has an effect and each pair of knob
values an interaction, drawn from a hash of the simulator's seed, so the landscape has structure (some values
win, some combinations clash) that a search can learn. Along a numeric range knob the effect is a smooth bowl
around a hashed optimum, and interactions see only the knob's bucket (markers.cell_value), as real tuning
constants behave. Some combinations fail at L1 ("build") or L2
("verification") with a reason; per-iteration noise comes from an RNG seeded by (seed, code, request seed), so
the same request always gets the same result. L0 is the real static check (cuco_kit.source.static_check) when the
request carries the parent's code; edits outside the knob block perturb the latency a little (a hash of the code).

Like a GPU evaluator it has a set of GPUs it may use: ``visible_devices`` (an executor's slot gives it), else the
process's CUDA_VISIBLE_DEVICES (a Ray actor's); provenance reports it, so tests of the executors can check which
GPU set evaluated what, without GPUs.
"""
from __future__ import annotations

import hashlib
import math
import os
import random
import statistics
import threading
import time
from dataclasses import replace
from typing import Any

from cuco_kit.errors import BadInput
from cuco_kit.evaluate.api import FLAG_SPEEDUP, EvalRequest, EvalResult, Progress
from cuco_kit.evaluate.stats import speedup_ci
from cuco_kit.source import markers


def _u(*parts: object) -> float:
    """A uniform number in [0, 1) from a hash of the parts (stable across processes, unlike hash())."""
    h = hashlib.sha256("\x1f".join(map(str, parts)).encode("utf-8")).digest()
    return int.from_bytes(h[:8], "big") / 2.0 ** 64


class SimulatedEvaluator:
    """``SimulatedEvaluator(seed)``: see the module doc. ``delay_s`` makes each evaluation take that long (for
    tests of concurrency and kill/resume); ``fail_rate`` is the share of knob combinations that fail;
    ``visible_devices`` the GPU set (CUDA_VISIBLE_DEVICES syntax) it reports as its own."""

    badge = "simulated"

    def __init__(self, seed: int = 0, *, seed_ms: float = 1.0, baseline_factor: float = 1.5,
                 effect: float = 0.25, interaction: float = 0.08, noise: float = 0.02, fail_rate: float = 0.12,
                 delay_s: float = 0.0, check_l0: bool = True, host_ms: float = 0.045,
                 visible_devices: str | None = None) -> None:
        self.seed = seed
        self.host_ms = host_ms  # the end-to-end time adds this (host launches) to the device time
        self.seed_ms = seed_ms
        self.baseline_factor = baseline_factor
        self.effect = effect
        self.interaction = interaction
        self.noise = noise
        self.fail_rate = fail_rate
        self.delay_s = delay_s
        self.check_l0 = check_l0
        self.visible_devices = visible_devices
        self.calls = 0
        self.prebuilt: set[str] = set()
        self._lock = threading.Lock()

    # -- landscape ------------------------------------------------------------------------------------------
    def true_ms(self, knobs: dict[str, str], code: str = "", world_size: int = 1) -> float:
        """The noise-free latency of a knob assignment (tests use it to know the landscape's optimum)."""
        base = self.seed_ms * (1.0 + 0.15 * (world_size - 1))
        if not knobs:
            return base
        log_t = math.log(self.baseline_factor)
        names = sorted(knobs)
        ranges = _range_knobs(code)
        coarse = dict(knobs)  # pairs see a range knob's bucket only, so the landscape stays smooth along it
        for n in names:
            k = ranges.get(n)
            if k is not None and knobs[n] in k.allowed:
                coarse[n] = markers.cell_value(replace(k, value=knobs[n]))
                # A bowl along the range: -effect at a hashed optimum, +effect at the farthest end.
                pos = k.allowed.index(knobs[n]) / max(1, len(k.allowed) - 1)
                opt = _u(self.seed, "optimum", n)
                d = abs(pos - opt) / max(opt, 1.0 - opt)
                log_t += (2.0 * d * d - 1.0) * self.effect
            else:
                log_t += (_u(self.seed, "effect", n, knobs[n]) - 0.5) * 2 * self.effect
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                log_t += (_u(self.seed, "pair", a, coarse[a], b, coarse[b]) - 0.5) * 2 * self.interaction
        if code:
            log_t += (_u(self.seed, "code", _outside_knobs(code)) - 0.5) * 0.1
        return base * math.exp(log_t)

    def failure(self, knobs: dict[str, str]) -> tuple[str, str] | None:
        """(level, reason) when this combination fails, else None."""
        if not knobs:
            return None
        combo = "|".join(f"{k}={knobs[k]}" for k in sorted(knobs))
        if _u(self.seed, "fail", combo) >= self.fail_rate:
            return None
        if _u(self.seed, "fail-level", combo) < 0.4:
            return "L1", f"simulated build failure for {combo}: error: no instance of overloaded function matches"
        return "L2", (f"simulated verification failure for {combo}: max relative error "
                      f"{self._fail_err(knobs):.3g} > tolerance 0.02")

    def _fail_err(self, knobs: dict[str, str]) -> float:
        return 0.05 + _u(self.seed, "err", "|".join(f"{k}={knobs[k]}" for k in sorted(knobs)))

    # -- Evaluator ------------------------------------------------------------------------------------------
    def prebuild(self, request: EvalRequest) -> None:
        with self._lock:
            self.prebuilt.add(hashlib.sha256(request.candidate_code.encode()).hexdigest())

    def evaluate(self, request: EvalRequest, progress: Progress | None = None) -> EvalResult:
        with self._lock:
            self.calls += 1
        prov = {"gpu": "SIMULATED (no GPU)", "simulated": True, "simulator_seed": self.seed,
                "world": request.world_size, "backend": request.backend,
                "cuda_visible_devices": self.visible_devices if self.visible_devices is not None
                else os.environ.get("CUDA_VISIBLE_DEVICES")}
        code = request.candidate_code

        def step(level: str, name: str) -> None:
            if progress is not None:
                progress({"level": level, "step": name})

        step("L0", "static check")
        knobs, problem = _knobs(code)
        if problem is None and self.check_l0 and request.parent_code is not None:
            from cuco_kit.source import static_check

            report = static_check.check_candidate(code, request.parent_code)
            problem = None if report.ok else "; ".join(report.reasons[:3])
        if problem is not None:
            return EvalResult("L0", "fail", reason=problem, badge="simulated", provenance=prov,
                              logs={"l0": problem})
        if self.delay_s:
            time.sleep(self.delay_s)
        step("L1", "build")
        fail = self.failure(knobs)
        if fail is not None and fail[0] == "L1":
            return EvalResult("L1", "fail", reason=fail[1], badge="simulated", provenance=prov,
                              logs={"build": fail[1] + "\n(simulated compiler log)"})
        step("L2", "verify")
        if fail is not None:
            return EvalResult("L2", "fail", reason=fail[1], badge="simulated", provenance=prov,
                              logs={"rank0": fail[1]}, max_rel_err=self._fail_err(knobs))
        step("L3", "bench")
        ch = hashlib.sha256(code.encode("utf-8")).hexdigest()
        rng = random.Random(f"{self.seed}/{ch}/{request.seed}")
        truth = self.true_ms(knobs, code, request.world_size)
        iters = [truth * math.exp(rng.gauss(0.0, self.noise)) for _ in range(max(1, request.iters))]
        median = statistics.median(iters)
        seed_ms = seed_iters = None
        if request.measure_seed:
            srng = random.Random(f"{self.seed}/seed/{ch}/{request.seed}")
            base = self.true_ms({}, "", request.world_size)
            seed_iters = [base * math.exp(srng.gauss(0.0, self.noise)) for _ in range(max(1, request.iters))]
            seed_ms = statistics.median(seed_iters)
        q = statistics.quantiles(iters, n=10) if len(iters) >= 2 else [median] * 9
        speedup = seed_ms / median if seed_ms else None
        e2e = [t + self.host_ms for t in iters]
        timing = {"score": "device",
                  "device": {"median_ms": median, "spread_ms": q[-1] - q[0], "iteration_ms": iters},
                  "end_to_end": {"median_ms": statistics.median(e2e), "spread_ms": q[-1] - q[0], "iteration_ms": e2e}}
        return EvalResult(
            "L3", "pass", median_ms=median, spread_ms=q[-1] - q[0], iteration_ms=iters,
            per_rank_median_ms=[median * (1.0 - 0.01 * r) for r in range(request.world_size)],
            seed_median_ms=seed_ms, speedup=speedup, seed_iteration_ms=seed_iters,
            speedup_ci=speedup_ci(seed_iters, iters, seed=request.seed), max_rel_err=1e-3 * _u(self.seed, "rel", ch),
            flagged=bool(speedup and speedup > FLAG_SPEEDUP), badge="simulated", timing=timing, provenance=prov,
            timeline=_timeline(median, request.world_size, _u(self.seed, "overlap", ch)) if request.timeline else None)


def _timeline(median_ms: float, world_size: int, overlap: float) -> list[dict[str, Any]]:
    """A made-up kernel timeline (badged simulated with its result): per rank one compute and one transfer kernel
    whose overlap is `overlap` of the ideal, so the overlap views have something to show without a GPU."""
    step_us = median_ms * 1000.0
    comp, comm = 0.6 * step_us, 0.5 * step_us
    serial, ideal = comp + comm, max(comp, comm)
    span = serial - overlap * (serial - ideal)
    rows: list[dict[str, Any]] = []
    for r in range(max(1, world_size)):
        rows.append({"rank": r, "iteration": 0, "stream": 7, "name": "simulated_compute", "start_us": 0.0,
                     "dur_us": comp})
        rows.append({"rank": r, "iteration": 0, "stream": 13, "name": "simulated_nccl_transfer",
                     "start_us": span - comm, "dur_us": comm})
    return rows


def _range_knobs(code: str) -> dict[str, markers.Knob]:
    """The range knobs of `code`'s knob block by name ({} without code or with a broken block)."""
    if not code:
        return {}
    try:
        return {k.name: k for k in markers.knobs(code) if k.range is not None}
    except BadInput:
        return {}


def _knobs(code: str) -> tuple[dict[str, str], str | None]:
    try:
        return {k.name: k.value for k in markers.knobs(code)}, None
    except BadInput as exc:
        return {}, f"knob block: {exc}"


def _outside_knobs(code: str) -> str:
    """The code with the knob block's lines removed (so a knob move does not also move the code hash term)."""
    try:
        kb = next((b for b in markers.blocks(code) if b.name == markers.KNOB_BLOCK), None)
    except Exception:  # noqa: BLE001 - malformed markers were L0's business
        return code
    return code if kb is None else code[:kb.start_offset] + code[kb.end_offset:]


def landscape_optimum(evaluator: SimulatedEvaluator, code: str, world_size: int = 1) -> tuple[dict[str, str], float]:
    """Brute-force best passing assignment over the (small) knob space of `code` (tests only)."""
    best: tuple[dict[str, str], float] = ({}, float("inf"))
    for k in markers.knob_space(code):
        if evaluator.failure(k) is None:
            t = evaluator.true_ms(k, "", world_size)
            if t < best[1]:
                best = (k, t)
    return best
