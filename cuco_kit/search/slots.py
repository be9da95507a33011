"""`SlotExecutor`: evaluations spread over slots, each a warm evaluator on its own GPU set, refilled as results
come back, with builds on a CPU pool ahead of the GPUs.

A slot is anything with ``evaluate(request, progress)``: ``LocalSlot`` holds an evaluator in this process (the GPU
evaluator's ranks get the slot's CUDA_VISIBLE_DEVICES); ``cuco_kit.search.ray_executor`` has slots that are Ray
actors on other machines. One thread per slot takes the next request from one queue, so a fast slot never waits
for a slow one.

Faults: a slot that loses its evaluator mid-evaluation (``SlotLost``: a process, actor, GPU or node gone) does not
fail the candidate. The request goes back to the front of the queue for a different slot; lost a second time it
becomes an infrastructure error (verdict "error", provenance ``infrastructure_error``), which the search records
and never feeds back as a candidate failure. A slot lost ``retire_after`` times in a row is retired. What the
driver's death leaves in flight is the engine's business (resume re-runs it).

Progress: every evaluation's progress callback also gets ``{"step": "slot_start" | "slot_done" | "slot_lost",
"slot": i, "slot_label": ..., ...}`` (the engine publishes them as ``evaluation_progress`` events), and
``slot_table()`` says what each slot evaluates now and its throughput (``cuco_kit.search.slot_board`` reads the
events for the CLI and the dashboard).
"""
from __future__ import annotations

import collections
import concurrent.futures as cf
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from cuco_kit.errors import BadInput
from cuco_kit.evaluate.api import (
    Badge,
    EvalRequest,
    EvalResult,
    Evaluator,
    EvaluatorLost,
    Progress,
    close_evaluator,
)
from cuco_kit.evaluate.spec import EvaluatorSpec
from cuco_kit.search.executor import error_result
from cuco_kit.search.gpu_sets import GpuSet, plan

log = logging.getLogger("cuco_kit.search")


class SlotLost(Exception):
    """A slot's evaluator went away mid-evaluation (infrastructure, not the candidate)."""


class Slot(Protocol):
    label: str  # "slot 1 [GPU 2,3]", "actor 0 on 10.0.0.5 [GPU 0]"
    gpus: str  # the GPU set, CUDA_VISIBLE_DEVICES syntax

    def evaluate(self, request: EvalRequest, progress: Progress | None = None) -> EvalResult:
        """The result, or SlotLost when the slot lost its evaluator (other exceptions: an evaluator bug)."""
        ...

    def close(self) -> None: ...


class LocalSlot:
    """A slot in this process: an evaluator made for one GPU set by ``make(visible_devices)``. An evaluator that
    raises EvaluatorLost is closed and replaced by a fresh one before the slot takes more work."""

    def __init__(self, gpu_set: GpuSet, make: Callable[[str], Evaluator]) -> None:
        self.label = gpu_set.label
        self.gpus = gpu_set.visible_devices
        self._make = make
        self.evaluator: Evaluator = make(self.gpus)

    def evaluate(self, request: EvalRequest, progress: Progress | None = None) -> EvalResult:
        try:
            return self.evaluator.evaluate(request, progress)
        except EvaluatorLost as exc:
            self.close()
            self.evaluator = self._make(self.gpus)
            raise SlotLost(str(exc)) from exc

    def close(self) -> None:
        close_evaluator(self.evaluator)


@dataclass
class _Job:
    request: EvalRequest
    progress: Progress | None
    future: cf.Future[EvalResult]
    lost: list[str] = field(default_factory=list)  # "<slot label>: <why>" per lost attempt
    avoid: set[int] = field(default_factory=set)  # slots that lost it


@dataclass
class SlotStats:
    label: str
    gpus: str
    current: str = ""  # the request label being evaluated, "" when idle
    evaluations: int = 0
    lost: int = 0
    busy_s: float = 0.0
    first_start: float | None = None
    retired: bool = False

    def row(self, now: float) -> dict[str, Any]:
        span = now - self.first_start if self.first_start is not None else 0.0
        return {"slot": self.label, "gpus": self.gpus, "current": self.current, "evaluations": self.evaluations,
                "lost": self.lost, "retired": self.retired, "busy_s": round(self.busy_s, 3),
                "per_hour": round(3600.0 * self.evaluations / span, 1) if span > 0 else 0.0}


def _started(fut: cf.Future[EvalResult]) -> bool:
    """Mark a job's future running (a retried job's already is); False when it was cancelled."""
    return fut.running() or fut.set_running_or_notify_cancel()


def infrastructure_error(request: EvalRequest, lost: Sequence[str], badge: Badge) -> EvalResult:
    """What an evaluation lost on every slot it was tried on becomes: an error of the infrastructure, recorded
    with where and why, never a candidate failure."""
    where = "; ".join(lost)
    return EvalResult(level_reached="L0", verdict="error", badge=badge,
                      reason=f"infrastructure error, not the candidate: the evaluation was lost {len(lost)} time(s) "
                             f"({where})",
                      logs={"executor": "\n".join(lost)},
                      provenance={"infrastructure_error": True, "lost": list(lost)})


class SlotExecutor:
    """Executor (cuco_kit.search.executor) over ``slots``; also an Evaluator (``evaluate`` submits and waits), so
    the engine can be given it as its evaluator when no single evaluator exists here (Ray).

    ``build``: called on a pool of ``build_workers`` CPU threads for requests given to ``prebuild`` (the engine
    does that for the requests beyond the first ``slots`` of a batch). ``retries``: how many other slots a lost
    evaluation is tried on. ``badge``: the evaluators' badge (results made here, infrastructure errors, carry it).
    """

    def __init__(self, slots: Sequence[Slot], *, badge: Badge = "real",
                 build: Callable[[EvalRequest], object] | None = None, build_workers: int = 2, retries: int = 1,
                 retire_after: int = 3, on_close: Callable[[], None] | None = None) -> None:
        if not slots:
            raise BadInput("a slot executor needs at least one slot (a GPU set or an actor)")
        self._slots = list(slots)
        self.slots = len(self._slots)
        self.badge = badge
        self.retries = retries
        self.retire_after = retire_after
        self._build = build
        self._builder = (cf.ThreadPoolExecutor(max_workers=max(1, build_workers), thread_name_prefix="cuco-build")
                         if build is not None else None)
        self._on_close = on_close
        self._queue: collections.deque[_Job] = collections.deque()
        self._cv = threading.Condition()
        self._closing = False
        self._stats = [SlotStats(s.label, s.gpus) for s in self._slots]
        self._lost_in_a_row = [0] * self.slots
        self.prebuilds = 0
        self._threads = [threading.Thread(target=self._serve, args=(i,), name=f"cuco-slot-{i}", daemon=True)
                         for i in range(self.slots)]
        for t in self._threads:
            t.start()

    # ------------------------------------------------------------------------------------------- Executor
    def submit(self, request: EvalRequest, progress: Progress | None = None) -> cf.Future[EvalResult]:
        fut: cf.Future[EvalResult] = cf.Future()
        with self._cv:
            if self._closing:
                raise BadInput("this executor is shut down; make a new one")
            if all(s.retired for s in self._stats):
                fut.set_result(infrastructure_error(request, ["every slot is retired after repeated losses"],
                                                    self.badge))
                return fut
            self._queue.append(_Job(request, progress, fut))
            self._cv.notify_all()
        return fut

    def prebuild(self, request: EvalRequest) -> None:
        if self._builder is None or self._build is None:
            return
        build = self._build
        self.prebuilds += 1

        def run() -> None:
            try:
                build(request)
            except Exception as exc:  # noqa: BLE001 - the evaluation builds again and reports it properly
                log.debug("prebuild of %s failed: %s", request.label, exc)

        self._builder.submit(run)

    def evaluate(self, request: EvalRequest, progress: Progress | None = None) -> EvalResult:
        return self.submit(request, progress).result()

    def shutdown(self, wait: bool = True) -> None:
        with self._cv:
            if self._closing:
                return
            self._closing = True
            dropped = list(self._queue)
            self._queue.clear()
            self._cv.notify_all()
        for job in dropped:
            if not job.future.cancel():  # a lost evaluation waiting for its retry is already running
                job.future.set_exception(RuntimeError("the executor was shut down before the retry"))
        if wait:
            for t in self._threads:
                t.join()
        if self._builder is not None:
            self._builder.shutdown(wait=wait, cancel_futures=not wait)
        for s in self._slots:
            try:
                s.close()
            except Exception as exc:  # noqa: BLE001 - one slot's teardown must not keep the others up
                log.warning("closing %s failed: %s", s.label, exc)
        if self._on_close is not None:
            self._on_close()

    def slot_table(self) -> list[dict[str, Any]]:
        """Per slot: label, GPUs, what it evaluates now, evaluations done, losses, busy seconds, evaluations/h."""
        now = time.monotonic()
        with self._cv:
            return [s.row(now) for s in self._stats]

    # ------------------------------------------------------------------------------------------- slots
    def _take(self, i: int) -> _Job | None:
        """The next job slot ``i`` may run (not one it lost, unless every live slot lost it); None to stop."""
        with self._cv:
            while True:
                if self._closing or self._stats[i].retired:
                    return None
                live = {k for k, s in enumerate(self._stats) if not s.retired}
                for job in self._queue:
                    if i not in job.avoid or live <= job.avoid:
                        self._queue.remove(job)
                        return job
                self._cv.wait()

    def _serve(self, i: int) -> None:
        slot, st = self._slots[i], self._stats[i]
        while (job := self._take(i)) is not None:
            if not _started(job.future):
                continue
            t0 = time.monotonic()
            with self._cv:
                st.current = job.request.label
                if st.first_start is None:
                    st.first_start = t0
            self._note(job, "slot_start", i, attempt=len(job.lost) + 1)
            try:
                result = slot.evaluate(job.request, job.progress)
            except SlotLost as exc:
                self._lost(i, job, str(exc), time.monotonic() - t0)
                continue
            except Exception as exc:  # noqa: BLE001 - an evaluator bug is an error result, the slot goes on
                result = error_result(job.request, exc, self.badge)
            seconds = time.monotonic() - t0
            with self._cv:
                st.current = ""
                st.evaluations += 1
                st.busy_s += seconds
                self._lost_in_a_row[i] = 0
                row = st.row(time.monotonic())
            if job.lost:
                result.provenance = {**result.provenance, "lost_before": list(job.lost)}
            result.provenance = {**result.provenance, "slot": st.label}
            self._note(job, "slot_done", i, seconds=round(seconds, 3), slot_evaluations=row["evaluations"],
                       per_hour=row["per_hour"])
            job.future.set_result(result)

    def _lost(self, i: int, job: _Job, why: str, seconds: float) -> None:
        st = self._stats[i]
        log.warning("%s lost %s: %s", st.label, job.request.label, why)
        job.lost.append(f"{st.label}: {why}")
        job.avoid.add(i)
        with self._cv:
            st.current = ""
            st.lost += 1
            st.busy_s += seconds
            self._lost_in_a_row[i] += 1
            if self._lost_in_a_row[i] >= self.retire_after:
                st.retired = True
                log.warning("%s retired after %d losses in a row", st.label, self._lost_in_a_row[i])
            again = len(job.lost) <= self.retries and not all(s.retired for s in self._stats)
            if again:
                self._queue.appendleft(job)
                self._cv.notify_all()
            orphans = list(self._queue) if all(s.retired for s in self._stats) else []
            if orphans:
                self._queue.clear()
        self._note(job, "slot_lost", i, reason=why[:300], retry=again)
        if not again:
            job.future.set_result(infrastructure_error(job.request, job.lost, self.badge))
        for o in orphans:
            if _started(o.future):
                o.future.set_result(infrastructure_error(o.request, [*o.lost, "every slot is retired"], self.badge))

    def _note(self, job: _Job, step: str, i: int, **data: Any) -> None:
        if job.progress is None:
            return
        try:
            job.progress({"step": step, "slot": i, "slot_label": self._stats[i].label,
                          "gpus": self._stats[i].gpus, **data})
        except Exception as exc:  # noqa: BLE001 - a broken progress callback must not break an evaluation
            log.debug("progress callback failed: %s", exc)


def build_workers_default() -> int:
    """CPU threads for builds ahead of the GPUs: nvcc is one process per build, so every core but two (the
    ranks and the driver poll and prepare inputs on those); a cold build cache is nvcc-bound."""
    return max(1, min(32, (os.cpu_count() or 2) - 2))


def local_executor(spec: EvaluatorSpec, gpus: Sequence[str], world_size: int, backend: str, *,
                   build_workers: int | None = None, matrix: str | None = None) -> SlotExecutor:
    """Slots on this host: ``gpus`` split into GPU sets (cuco_kit.search.gpu_sets.plan; ``matrix``: an
    nvidia-smi topology to use instead of asking), one warm evaluator from ``spec`` per set."""
    p = plan(gpus, world_size, backend, matrix=matrix)
    if p.idle:
        log.warning("GPU(s) %s stay idle: they make no whole set of %d for a %s world (%s)", ",".join(p.idle),
                    world_size, backend, p.note)
    slots = [LocalSlot(g, spec.make) for g in p.sets]
    return SlotExecutor(slots, badge=spec.badge, build=spec.prebuild,
                        build_workers=build_workers or build_workers_default())
