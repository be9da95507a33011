"""The fast path: a host-collective seed -> a correct device-initiated candidate with EVOLVE blocks.

``pipeline`` holds the loop (`FastPath`, its config, attempts and outcomes), ``steps`` the deterministic checks
and the fallback annotator, ``sanitizer`` the compute-sanitizer rerun of an illegal memory access. The
`cuco fastpath` command is `cuco_kit.commands.fastpath`; docs/fastpath.md walks through a run.
"""
from cuco_kit.fastpath.pipeline import (
                                        BACKENDS,
                                        GIN_UNAVAILABLE,
                                        NO_GPU,
                                        Attempt,
                                        FastPath,
                                        FastPathConfig,
                                        FastPathResult,
                                        StageOutcome,
)
from cuco_kit.fastpath.sanitizer import SanitizerReport, sanitize
from cuco_kit.fastpath.steps import L0Check

__all__ = ["Attempt", "BACKENDS", "FastPath", "FastPathConfig", "FastPathResult", "GIN_UNAVAILABLE", "L0Check",
           "NO_GPU", "SanitizerReport", "StageOutcome", "sanitize"]
