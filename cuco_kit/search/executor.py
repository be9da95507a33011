"""Executors: where evaluations run. The unit of work is the serialisable `EvalRequest`, so an executor may
hand it to threads here, to warm rank workers, or (later) to machines of a cluster.

`PoolExecutor` runs any `Evaluator` on N slots (one per GPU or per concurrent evaluation the evaluator can
take) and, when the evaluator has a `prebuild(request)` method, builds upcoming candidates on a separate
thread so compilation overlaps the evaluation of earlier ones.
"""
from __future__ import annotations

import concurrent.futures as cf
import logging
import threading
from typing import Protocol, runtime_checkable

from cuco_kit.errors import BadInput
from cuco_kit.evaluate.api import Badge, EvalRequest, EvalResult, Evaluator, Prebuilds, Progress

log = logging.getLogger("cuco_kit.search")


@runtime_checkable
class Executor(Protocol):
    slots: int
    prebuilds: int  # how many builds were started ahead of their evaluation

    def submit(self, request: EvalRequest, progress: Progress | None = None) -> cf.Future[EvalResult]: ...

    def prebuild(self, request: EvalRequest) -> None: ...

    def shutdown(self, wait: bool = True) -> None: ...


def error_result(request: EvalRequest, exc: BaseException, badge: Badge = "real") -> EvalResult:
    """What a crashed evaluator call becomes: an error the search records and goes on from (never a number)."""
    return EvalResult(level_reached="L0", verdict="error", badge=badge,
                      reason=f"the evaluator raised {type(exc).__name__}: {exc}",
                      logs={"executor": f"{type(exc).__name__}: {exc}"})


class PoolExecutor:
    """Thread-pool executor over one evaluator. ``slots`` evaluations run at once; builds for requests given
    to ``prebuild`` run on their own thread(s) when the evaluator supports them."""

    def __init__(self, evaluator: Evaluator, slots: int = 1, *, build_workers: int = 1) -> None:
        if slots < 1:
            raise BadInput(f"executor slots must be >= 1, got {slots}")
        self.evaluator = evaluator
        self.slots = slots
        self._pool = cf.ThreadPoolExecutor(max_workers=slots, thread_name_prefix="cuco-eval")
        self._prebuilder = evaluator if isinstance(evaluator, Prebuilds) else None
        self._builder = (cf.ThreadPoolExecutor(max_workers=build_workers, thread_name_prefix="cuco-build")
                         if self._prebuilder is not None else None)
        self._lock = threading.Lock()
        self.prebuilds = 0  # how many builds were started ahead of their evaluation

    def submit(self, request: EvalRequest, progress: Progress | None = None) -> cf.Future[EvalResult]:
        def run() -> EvalResult:
            return self.evaluator.evaluate(request, progress)

        return self._pool.submit(run)

    def prebuild(self, request: EvalRequest) -> None:
        builder, prebuilder = self._builder, self._prebuilder
        if builder is None or prebuilder is None:
            return
        with self._lock:
            self.prebuilds += 1

        def build() -> None:
            try:
                prebuilder.prebuild(request)
            except Exception as exc:  # noqa: BLE001 - the evaluation will build again and report it properly
                log.debug("prebuild of %s failed: %s", request.label, exc)

        builder.submit(build)

    def shutdown(self, wait: bool = True) -> None:
        self._pool.shutdown(wait=wait, cancel_futures=not wait)
        if self._builder is not None:
            self._builder.shutdown(wait=wait, cancel_futures=not wait)


def make_executor(evaluator: Evaluator, slots: int = 1) -> PoolExecutor:
    return PoolExecutor(evaluator, slots)
