"""The race-check size: L2 trials at a second, larger size when the request's sizes are too small to race.

A flag raised before the stores it covers is wrong at every size, but the window it opens is as long as those
stores take: at a small preset they land within a microsecond or two, before any peer could look, whatever the
schedule (gemm_allgather at M = N = K = 1024 moves 1 MiB per rank per step; such a race was caught in 0 of 20
seeds there, 20 of 20 at 4096). So when the bytes each rank receives per step (``traffic_bytes``: the workload's
``comm_bytes``, or without one, the share of its output tensors the other ranks write) are under
``EvaluatorConfig.race_size_min_bytes``, a candidate that passed at the requested size runs its L2 trials once
more, perturbed as usual, at the workload's smallest size preset that moves at least that much (``pick``), in a
warm world of its own. A failure there fails the evaluation at L2, its reason naming the size; the scores stay
those of the requested size.

Which preset: among the workload's ``size_presets`` valid at this world size, those moving at least the threshold
and fitting ``race_size_max_gpu_bytes`` of tensors on one GPU (under symm every rank shares it), the one moving the
fewest bytes (then the fewest tensor bytes, then the fewest parameters that differ from the request, then its
name). None fits: the evaluation notes it and L2 ran at the requested size only.

What it costs (docs/timing.md has the measured numbers): once per (workload, race size, world, backend) a world
start (seconds: torch import, communicator, windows; the world then stays warm like the requested size's, and
counts against the pool's recycling the same way), and per passing evaluation one more command in that world: the
stress build (or the timed build, without one) loaded and set up, ``trials`` perturbed L2 trials at the larger
size, each with the torch reference there, and one discarded timed iteration; for a workload whose oracle is its
seed, the seed's own L2 trials there first. Failing evaluations pay nothing (they stop at the requested size).
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cuco_kit.errors import BadInput
from cuco_kit.evaluate.api import EvalResult
from cuco_kit.workload import Params, Workload

MIB = 1 << 20


@dataclass(frozen=True)
class RaceSize:
    """The size the extra L2 trials run at."""

    preset: str
    params: dict[str, int]
    traffic_bytes: float  # per rank and step, at this size
    request_traffic_bytes: float  # the same at the requested size

    def label(self) -> str:
        sizes = ", ".join(f"{k}={v}" for k, v in sorted(self.params.items()))
        return f"the race-check size (preset {self.preset!r}: {sizes})"


def traffic_bytes(wl: Workload, params: Params, world: int) -> float:
    """Bytes each rank receives per step: the workload's ``comm_bytes``, or, for a workload without one, the part of
    its output (and inout) tensors the other ranks' work fills, (world - 1) / world of them."""
    if wl.comm_bytes is not None:
        return float(wl.comm_bytes(params, world))
    outputs = sum(t.capacity_bytes(params, world) for t in wl.tensors if t.role != "input")
    return outputs * (world - 1) / world


def pick(wl: Workload, params: Params, world: int, *, min_bytes: int, max_gpu_bytes: int,
         ranks_per_gpu: int) -> tuple[RaceSize | None, str]:
    """(the race-check size, "") when the request's traffic is under ``min_bytes`` and a preset qualifies;
    (None, "") when the request is large enough to race; (None, why) when none of its presets qualifies.
    ``ranks_per_gpu``: how many ranks share one GPU (the world under symm, 1 under nccl)."""
    request = traffic_bytes(wl, params, world)
    if world < 2 or request >= min_bytes:
        return None, ""
    fits: list[tuple[tuple[float, int, int, str], RaceSize]] = []
    too_big = []
    for name, preset in wl.size_presets.items():
        try:
            p = wl.check(preset, world)
        except BadInput:  # not valid at this world size (a size that does not divide, ...)
            continue
        moved = traffic_bytes(wl, p, world)
        if moved < min_bytes:
            continue
        gpu_bytes = ranks_per_gpu * sum(t.capacity_bytes(p, world) for t in wl.tensors)
        if gpu_bytes > max_gpu_bytes:
            too_big.append(name)
            continue
        differ = sum(p.get(k) != v for k, v in params.items())
        fits.append(((moved, gpu_bytes, differ, name), RaceSize(name, p, moved, request)))
    if fits:
        return min(fits, key=lambda f: f[0])[1], ""
    why = (f"no size preset of {wl.name} moves at least {min_bytes / MIB:g} MiB per rank per step at {world} ranks"
           + (f" within {max_gpu_bytes / MIB:g} MiB of tensors per GPU ({', '.join(sorted(too_big))} would need "
              "more)" if too_big else ""))
    return None, (f"L2 ran at the requested size only: it moves {request / MIB:.3g} MiB per rank per step, too little "
                  f"for a late store to outlast the peer's check, and {why}")


def command(cmd: dict[str, Any], race: RaceSize, step_limit_s: float) -> dict[str, Any]:
    """The race-check size's command from the candidate's (or the seed's) at the requested size: its L2 trials
    and one timed iteration, which is discarded. A candidate with a stress build runs the stress build for both, so
    one library is loaded and set up; the stream-capture check already ran at the requested size."""
    out = dict(cmd, iters=1, warmup=0, verify_every=1, capture=False, timeline=False, step_limit_s=step_limit_s,
               oracle_key=f"{cmd.get('oracle_key', '')}:race:{race.preset}")
    if cmd.get("stress"):
        out["so_path"] = cmd["stress"]["so_path"]
    return out


Run = Callable[[dict[str, int], dict[str, Any]], EvalResult]


def check(res: EvalResult, wl: Workload, params: Params, world: int, backend: str, *, cmd: dict[str, Any],
          seed_cmd: dict[str, Any] | None, min_bytes: int, max_gpu_bytes: int, step_limit_s: float,
          run: Run) -> EvalResult:
    """``res``, a pass at the requested ``params``, checked at the race-check size when they are too small to race
    (``pick``; under symm every rank shares one GPU), or noted why it could not be; see ``verify``."""
    race, why = pick(wl, params, world, min_bytes=min_bytes, max_gpu_bytes=max_gpu_bytes,
                     ranks_per_gpu=world if backend == "symm" else 1)
    if race is None:
        if why:
            res.provenance.setdefault("notes", []).append(why)
        return res
    return verify(res, race, cmd, seed_cmd, step_limit_s, run)


def verify(res: EvalResult, race: RaceSize, cmd: dict[str, Any], seed_cmd: dict[str, Any] | None,
           step_limit_s: float, run: Run) -> EvalResult:
    """``res`` (a pass at the requested size) checked once more at ``race``: ``run(params, command)`` runs a
    command in the world of those sizes. ``seed_cmd``: the seed's command when the seed is the oracle (it runs
    there first). Returns ``res`` with a note and ``provenance["race_size"]``, or the failure, whose reason says
    which size caught it."""
    t0 = time.monotonic()
    info: dict[str, Any] = {"preset": race.preset, "params": race.params,
                            "traffic_mib": round(race.traffic_bytes / MIB, 3),
                            "request_traffic_mib": round(race.request_traffic_bytes / MIB, 3)}
    if seed_cmd is not None:
        seed = run(race.params, command(seed_cmd, race, step_limit_s))
        if seed.verdict != "pass":
            info.update(verdict="error", seconds=round(time.monotonic() - t0, 3))
            return EvalResult(seed.level_reached, "error", f"the workload's seed (the oracle) did not pass at "
                              f"{race.label()} ({seed.reason})", logs=seed.logs,
                              provenance={**seed.provenance, "race_size": info})
    got = run(race.params, command(cmd, race, step_limit_s))
    info.update(verdict=got.verdict, seconds=round(time.monotonic() - t0, 3),
                l2_seconds=got.provenance.get("l2_seconds"))
    if got.verdict != "pass":
        level = got.level_reached if got.level_reached in ("L1", "L2") else "L2"
        return EvalResult(level, got.verdict, f"at {race.label()}: {got.reason}", max_rel_err=got.max_rel_err,
                          logs=got.logs, provenance={**got.provenance, "race_size": info})
    res.provenance["race_size"] = info
    res.provenance.setdefault("notes", []).append(
        f"L2 also ran at {race.label()}, moving {race.traffic_bytes / MIB:.3g} MiB per rank per step: the requested "
        f"size moves {race.request_traffic_bytes / MIB:.3g} MiB, too little for a late store to outlast the peer's "
        f"check")
    return res
