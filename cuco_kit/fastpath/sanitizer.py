"""compute-sanitizer in the fast path: rerun a failing attempt at world size 1 under the tool and name the
faulting kernel, so the retry prompt says where the illegal memory access happened.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cuco_kit.evaluate.api import EvalRequest, EvalResult, Evaluator, Sanitizes

# CUDA's "illegal memory access" (cudaErrorIllegalAddress = 700) as rank logs spell it.
ILLEGAL_ACCESS_RE = re.compile(r"illegal memory access|cudaErrorIllegalAddress|CUDA error[^\n]{0,40}\b700\b|"
                               r"\berror(?: code)? 700\b", re.IGNORECASE)


@dataclass
class SanitizerReport:
    """What compute-sanitizer said about one world-size-1 rerun. available False: no hook or no tool."""

    available: bool
    kernel: str | None = None
    location: str | None = None
    log: str = ""
    message: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"available": self.available, "kernel": self.kernel, "location": self.location,
                "message": self.message, "log": self.log[-4000:]}


# compute-sanitizer spells the faulting frame two ways depending on the version:
#   "=========     at 0x70 in /tmp/x.cu:5:kern(int *)"    and    "=========     at kern(int *)+0x70 in /tmp/x.cu:5"
_SAN_ERR = re.compile(r"=+\s+(Invalid __global__ (?:read|write)[^\n]*|Out-of-range[^\n]*|"
                      r"Misaligned[^\n]*|Program hit [^\n]*|Barrier error[^\n]*)")
_SAN_AT_OLD = re.compile(r"=+\s+at 0x[0-9a-fA-F]+ in (?P<loc>[^\n]*?):(?P<fn>[A-Za-z_~][^\n(]*)\(")
_SAN_AT_NEW = re.compile(r"=+\s+at (?P<fn>[A-Za-z_~][^\n(]*)\([^\n]*?\)(?:\+0x[0-9a-fA-F]+)?(?: in (?P<loc>\S+))?")


def parse_sanitizer(log: str) -> tuple[str | None, str | None]:
    """(faulting kernel, file:line) from compute-sanitizer's output; None where it names none."""
    m = _SAN_ERR.search(log)
    tail = log[m.end():] if m else log
    for pat in (_SAN_AT_OLD, _SAN_AT_NEW):
        a = pat.search(tail)
        if a:
            fn = a.group("fn").strip()
            fn = re.sub(r"^(?:void|__global__)\s+", "", fn)
            return fn or None, (a.group("loc") or None)
    return None, None


def has_illegal_access(texts: Any) -> bool:
    """True when any log text (a str, or a dict/list of them) reports an illegal memory access."""
    if isinstance(texts, str):
        return bool(ILLEGAL_ACCESS_RE.search(texts))
    if isinstance(texts, dict):
        return any(has_illegal_access(v) for v in texts.values())
    if isinstance(texts, (list, tuple)):
        return any(has_illegal_access(v) for v in texts)
    return False


def sanitize(evaluator: Evaluator, request: EvalRequest, so_path: str | Path | None = None, *,
             timeout_s: float = 300.0) -> SanitizerReport:
    """Rerun `request` at world size 1 under compute-sanitizer to name the faulting kernel.

    The rank worker belongs to the evaluator, so this asks it, when it `Sanitizes`:
    `evaluator.sanitize(request, so_path=, timeout_s=)` returning compute-sanitizer's output as a str, a dict of
    logs, or an EvalResult whose logs hold it. Without that hook: "sanitizer unavailable"."""
    if not isinstance(evaluator, Sanitizes):
        return SanitizerReport(False, message="sanitizer unavailable: the evaluator has no sanitize() hook")
    req = EvalRequest(**{**asdict(request), "world_size": 1})
    try:
        out = evaluator.sanitize(req, so_path=so_path, timeout_s=timeout_s)
    except Exception as exc:  # noqa: BLE001 - the hook failing is a finding to show, not a crash of the loop
        return SanitizerReport(False, message=f"sanitizer unavailable: {type(exc).__name__}: {exc}")
    if isinstance(out, SanitizerReport):
        return out
    if isinstance(out, EvalResult):
        text = "\n".join(f"[{k}]\n{v}" for k, v in out.logs.items())
    elif isinstance(out, dict):
        text = "\n".join(f"[{k}]\n{v}" for k, v in out.items())
    else:
        text = str(out or "")
    kernel, loc = parse_sanitizer(text)
    msg = (f"compute-sanitizer names kernel {kernel}" + (f" at {loc}" if loc else "")) if kernel else \
        "compute-sanitizer ran but named no faulting kernel"
    return SanitizerReport(True, kernel, loc, text, msg)
