"""How much of the possible overlap of compute and communication a program achieved, from its kernel timeline.

The model is the teaching notebook's (`teaching.overlap_bound`): with compute time C and communication time M on
one rank, running them one after the other takes C + M (serial) and perfect overlap takes max(C, M) (ideal). The
measured time T of the step sits somewhere between, so

    fraction = (serial - T) / (serial - ideal), clipped to [0, 1]

is 0 for a program that overlapped nothing and 1 for one that hid the shorter side entirely. It is undefined
(None, with the reason) when serial == ideal: a step with no communication kernel or no compute kernel has
nothing to overlap, and a fraction there would be a made-up number.

C, M and T come from the per-rank timeline an evaluation records (`EvalRequest.timeline`, rows {rank, iteration,
stream, name, start_us, dur_us}): C and M are the lengths of the unions of the compute and communication kernels'
intervals, T the span from the first to the last of them, per rank and profiled iteration, counting only kernels
that start after the harness's last device barrier of that iteration (before it: the harness's input preparation).
Which kernel is which is read from its name (`OverlapConfig`): a fused kernel that computes and communicates counts
as communication, so its compute is invisible to this model and the fraction under-states it; the harness's own
kernels (barrier, spin, hold, interference, L2 flush) are left out.
"""
from __future__ import annotations

import re
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

# Kernels that move data between ranks: NCCL's, the copy engine's, and the runtime's and samples' own transfer,
# signal and wait kernels. Matched case-insensitively anywhere in the kernel's name.
COMM_PATTERNS = (r"nccl", r"memcpy", r"\bput_kernel", r"copy_kernel", r"flags_kernel", r"wait_kernel",
                 r"reduce_kernel", r"allgather", r"all_gather", r"alltoall", r"send", r"recv", r"cuco_lsa",
                 r"transfer")
# The harness's own kernels: they frame the step, they are not the program's work.
HARNESS_PATTERNS = (r"barrier_kernel", r"spin_kernel", r"interfere_kernel", r"hold_kernel", r"peer_table_kernel",
                    r"memset", r"fillfunctor", r"flush")


@dataclass
class OverlapConfig:
    comm_patterns: tuple[str, ...] = COMM_PATTERNS
    harness_patterns: tuple[str, ...] = HARNESS_PATTERNS
    _comm: re.Pattern[str] = field(init=False, repr=False)
    _harness: re.Pattern[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._comm = re.compile("|".join(self.comm_patterns), re.IGNORECASE)
        self._harness = re.compile("|".join(self.harness_patterns), re.IGNORECASE)

    def is_step_start(self, name: str) -> bool:
        """The harness's device barrier: the last one of a profiled iteration ends right before the step."""
        return "barrier_kernel" in name

    def kind(self, name: str) -> str:
        """'harness', 'comm' or 'compute' for a kernel name."""
        if self._harness.search(name):
            return "harness"
        return "comm" if self._comm.search(name) else "compute"


@dataclass(frozen=True)
class Overlap:
    """The overlap of one program's timeline. `fraction` is the median over ranks and profiled iterations of
    each one's fraction (None with `why` when undefined); the times are the medians of the same."""

    fraction: float | None
    why: str  # what the number means, or why there is none
    compute_us: float
    comm_us: float
    measured_us: float
    serial_us: float
    ideal_us: float
    samples: int  # (rank, iteration) pairs that gave a fraction
    badge: str = "real"  # the evaluation's badge: real, replayed or simulated

    def text(self) -> str:
        """'62% of the ideal overlap' or 'overlap: n/a (no communication kernel)', badged when not real."""
        tag = "" if self.badge == "real" else f" [{self.badge.upper() if self.badge == 'simulated' else self.badge}]"
        if self.fraction is None:
            return f"overlap n/a ({self.why}){tag}"
        return f"overlap {self.fraction:.0%} of ideal{tag}"


def _union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total


def fraction(compute_us: float, comm_us: float, measured_us: float) -> tuple[float | None, str]:
    """The model on three numbers: (fraction clipped to [0, 1], or None; what it means)."""
    serial, ideal = compute_us + comm_us, max(compute_us, comm_us)
    if comm_us <= 0:
        return None, "no communication kernel: nothing to overlap"
    if compute_us <= 0:
        return None, "no compute kernel: nothing to overlap"
    if serial - ideal <= 0:
        return None, "nothing to overlap"
    f = (serial - measured_us) / (serial - ideal)
    if f < 0:
        return 0.0, "slower than running compute and communication one after the other (gaps between kernels)"
    if f > 1:
        return 1.0, "at the ideal (the step took no longer than its longer side)"
    return f, "fraction of the shorter side hidden behind the longer one"


def from_timeline(rows: Iterable[Mapping[str, Any]], *, badge: str = "real",
                  config: OverlapConfig | None = None) -> Overlap | None:
    """The overlap of a recorded timeline; None when the timeline has no kernel of the program at all."""
    cfg = config or OverlapConfig()
    rows = list(rows)
    # A profiled iteration also holds the harness's input preparation; the step starts after its device barrier.
    step_start: dict[tuple[int, int], float] = {}
    for r in rows:
        if cfg.is_step_start(str(r.get("name", ""))):
            key = (int(r.get("rank", 0)), int(r.get("iteration", 0)))
            end = float(r.get("start_us", 0.0)) + float(r.get("dur_us", 0.0))
            step_start[key] = max(step_start.get(key, end), end)
    groups: dict[tuple[int, int], dict[str, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        kind = cfg.kind(str(r.get("name", "")))
        if kind == "harness":
            continue
        key = (int(r.get("rank", 0)), int(r.get("iteration", 0)))
        s = float(r.get("start_us", 0.0))
        if s < step_start.get(key, float("-inf")):
            continue  # before the step: input preparation
        groups[key][kind].append((s, s + float(r.get("dur_us", 0.0))))
    if not groups:
        return None
    fracs: list[float] = []
    comp, comm, meas = [], [], []
    reasons: list[str] = []
    for kinds in groups.values():
        every = kinds["compute"] + kinds["comm"]
        c, m = _union(kinds["compute"]), _union(kinds["comm"])
        t = max(e for _, e in every) - min(s for s, _ in every)
        comp.append(c)
        comm.append(m)
        meas.append(t)
        f, why = fraction(c, m, t)
        if f is None:
            reasons.append(why)
        else:
            fracs.append(f)
    c_med, m_med, t_med = statistics.median(comp), statistics.median(comm), statistics.median(meas)
    if fracs:
        value: float | None = statistics.median(fracs)
        why = f"median over {len(fracs)} rank-iteration(s) of (serial - measured) / (serial - ideal)"
    else:
        value, why = None, reasons[0]
    return Overlap(fraction=value, why=why, compute_us=c_med, comm_us=m_med, measured_us=t_med,
                   serial_us=c_med + m_med, ideal_us=max(c_med, m_med), samples=len(fracs), badge=badge)


_SEEN: dict[tuple[Any, ...], Overlap | None] = {}  # finished evaluations never change: views refresh each second
_SEEN_MAX = 4096


def of_evaluation(evaluation: Mapping[str, Any], config: OverlapConfig | None = None) -> Overlap | None:
    """The overlap of a stored evaluation (a `Store.evaluations` row), or None when it recorded no timeline."""
    result = evaluation.get("result") or {}
    rows = result.get("timeline")
    if not rows:
        return None
    key = (evaluation.get("run_id"), evaluation.get("id"), evaluation.get("finished_at"), len(rows))
    if config is None and evaluation.get("finished_at") is not None and key in _SEEN:
        return _SEEN[key]
    ov = from_timeline(rows, badge=str(result.get("badge") or evaluation.get("badge") or "real"), config=config)
    if config is None and evaluation.get("finished_at") is not None:
        if len(_SEEN) >= _SEEN_MAX:
            _SEEN.pop(next(iter(_SEEN)))
        _SEEN[key] = ov
    return ov


def overlap_text(evaluation: Mapping[str, Any] | None) -> str:
    """One short phrase for a view: the overlap, or why there is none."""
    if not evaluation:
        return "overlap: not evaluated"
    if evaluation.get("verdict") != "pass":
        return "overlap: not measured (did not pass)"
    ov = of_evaluation(evaluation)
    if ov is None:
        return "overlap: no timeline recorded"
    return ov.text()
