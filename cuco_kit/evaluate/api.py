"""The evaluation contract: a serialisable request in, a result out, behind a one-method protocol.

The search, the fast path and the widgets talk to evaluators only through this module, so a GPU evaluator, the
replay evaluator (committed real measurements) and the SIMULATED landscape used in tests are interchangeable,
and a request can travel to another process or machine as JSON.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:  # pragma: no cover - typing only
    from cuco_kit.evaluate.recordings import RecordedConfig

Level = Literal["L0", "L1", "L2", "L3"]
Verdict = Literal["pass", "fail", "error", "unavailable"]
# What the numbers of a result are: measured on this machine's GPU, served from a recorded real run, made up by a
# synthetic landscape, or absent ("unmeasured": no GPU to measure on, so only L0/L1 ran).
Badge = Literal["real", "replayed", "simulated", "unmeasured"]
LEVELS: tuple[Level, ...] = ("L0", "L1", "L2", "L3")
# The result contract (docs/contracts.md). 2: `timing` (device and end-to-end times beside the score). 3:
# `seed_iteration_ms` and `speedup_ci`, and `version` itself; a stored result without one is version 1 or 2. 4:
# `oracle`.
RESULT_VERSION = 4

# A progress callback receives small dicts such as
#   {"level": "L2", "rank": 1, "step": "verify", "done": 3, "total": 10}
# It is called from the evaluating thread; widgets must marshal to their own lock.
Progress = Callable[[dict[str, Any]], None]


@dataclass
class EvalRequest:
    """One unit of work. Everything is plain data so it serialises (to_json) for an executor or a cluster."""

    candidate_code: str
    workload_dir: str
    params: dict[str, int] = field(default_factory=dict)  # overrides of the workload's defaults
    world_size: int = 1
    backend: str = "nccl"  # "nccl" | "symm"
    parent_code: str | None = None  # for L0's frozen-bytes check; None skips that part
    iters: int = 20  # timed iterations
    warmup: int = 3
    verify_every: int = 3  # verify about one timed iteration in this many, at random, plus the first
    trials: int = 3  # L2: fresh-input verification trials before timing
    seed: int = 0  # seeds inputs per (trial, rank) and the choice of verified iterations
    measure_seed: bool = True  # score against the workload's seed measured in the same world (seed_cache.py)
    timeline: bool = False  # after timing, profile more (untimed) iterations: per-rank kernel timeline
    timeline_iters: int = 1  # how many iterations `timeline` profiles, each on its own (rows carry "iteration")
    label: str = ""  # free text for logs (program id, name)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> EvalRequest:
        return cls(**json.loads(text))


@dataclass
class EvalResult:
    level_reached: Level
    verdict: Verdict
    reason: str = ""
    median_ms: float | None = None  # the score: median over timed iterations of the slowest rank's time
    spread_ms: float | None = None  # (p90 - p10) of the same
    iteration_ms: list[float] | None = None  # per timed iteration, max over ranks
    per_rank_median_ms: list[float] | None = None
    seed_median_ms: float | None = None  # the seed measured in the same world
    speedup: float | None = None  # seed_median_ms / median_ms
    seed_iteration_ms: list[float] | None = None  # the seed's timed iterations in the same run (max over ranks)
    # [lo, hi]: 95% bootstrap interval of the speed-up from both runs' timed iterations (evaluate.stats.speedup_ci);
    # None when absent (no seed iterations, or fewer than 2 on a side)
    speedup_ci: list[float] | None = None
    max_rel_err: float | None = None
    flagged: bool = False  # speed-up above 3x over the seed: a human looks before it counts
    badge: Badge = "real"
    # {rank, iteration, stream, name, start_us, dur_us} per kernel of the profiled iterations (request.timeline;
    # request.timeline_iters of them, iteration counting from 0): start_us counts from the start of that rank's
    # profile of that iteration.
    timeline: list[dict[str, Any]] | None = None
    # Both timings of a passing result: {"score": "device" | "end_to_end" (which one median_ms is), "device":
    # {median_ms, spread_ms, iteration_ms} or None (the step cannot be held), "end_to_end": {...}, "note": str}.
    timing: dict[str, Any] | None = None
    # What the outputs were checked against (cuco_kit.workload.ORACLES): "reference" (the workload's torch
    # reference) or "seed" (the seed's own outputs on the same inputs in the same world); None when nothing was
    # verified (L0/L1 only, or numbers that were not measured here).
    oracle: str | None = None
    logs: dict[str, str] = field(default_factory=dict)  # "build", "rank0", ... (tails, never parsed for results)
    provenance: dict[str, Any] = field(default_factory=dict)  # gpu, driver, cuda, nccl, mps, git, date, world...
    version: int = RESULT_VERSION

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EvalResult:
        return cls(**{"version": 2 if d.get("timing") else 1, **d})  # written before results carried a version


class EvaluatorLost(RuntimeError):
    """The evaluator itself went away mid-evaluation (its process, GPU, actor or node), so the request has no
    result: infrastructure, never the candidate's failure. An executor retries the request elsewhere."""


class Evaluator(Protocol):
    """Anything that turns a request into a result. Implementations must not raise for a bad candidate: that is
    a result with verdict "fail"; they raise only for misuse (unknown workload, bad request)."""

    def evaluate(self, request: EvalRequest, progress: Progress | None = None) -> EvalResult: ...


# Optional capabilities. An evaluator has any of them or none; callers narrow with isinstance, so what an
# evaluator may offer is written here rather than in the places that look for it.

@runtime_checkable
class Badged(Protocol):
    """Says what its numbers are (an evaluator without it measures: "real")."""

    badge: Badge


@runtime_checkable
class Prebuilds(Protocol):
    """Builds a request's candidate ahead of its evaluation (thread-safe, no GPU), so nvcc runs while the GPU
    evaluates. Returns whether the build succeeded (None: nothing to build); a failure is reported again by the
    evaluation itself."""

    def prebuild(self, request: EvalRequest) -> bool | None: ...


@runtime_checkable
class Closable(Protocol):
    """Holds something to release (warm rank workers, MPS, a database); close() is idempotent."""

    def close(self) -> None: ...


@runtime_checkable
class Sanitizes(Protocol):
    """Reruns a request under compute-sanitizer and returns what it printed: a str, a dict of logs, or an
    EvalResult whose logs hold it (cuco_kit.fastpath.sanitizer reads any of them)."""

    def sanitize(self, request: EvalRequest, so_path: str | Path | None = None, *,
                 timeout_s: float = 300.0) -> str | dict[str, str] | EvalResult: ...


@runtime_checkable
class HasRecordings(Protocol):
    """Answers from recorded runs, and can list the configurations it has for a workload."""

    def configs(self, workload_dir: str | Path) -> list[RecordedConfig]: ...


def badge_of(evaluator: Evaluator) -> Badge:
    """What an evaluator's numbers are: its own badge, or "real" for one that measures."""
    return evaluator.badge if isinstance(evaluator, Badged) else "real"


def close_evaluator(evaluator: object) -> None:
    """Release what an evaluator holds, when it holds anything."""
    if isinstance(evaluator, Closable):
        evaluator.close()


def checked_against(oracle: str | None) -> str:
    """How every view names a result's oracle (EvalResult.oracle)."""
    return {"reference": "checked against the torch reference",
            "seed": "checked against the seed's outputs (differential)"}.get(oracle or "", "not verified")


FLAG_SPEEDUP = 3.0  # above this over the seed, a result is flagged for review


def timing_medians(timing: dict[str, Any] | None) -> tuple[str | None, float | None, float | None]:
    """(which timing scored, device median ms, end-to-end median ms) of a result's ``timing``; None where a
    result has no such timing (failed, older, or a step that cannot be held)."""
    if not timing:
        return None, None, None
    dev, e2e = timing.get("device"), timing.get("end_to_end")
    return (timing.get("score"), dev.get("median_ms") if dev else None, e2e.get("median_ms") if e2e else None)
