"""Schedule perturbation of the L2 trials at two ranks and more: what each rank does to one trial's schedule,
drawn from (request seed, trial), so every rank plans the same trial alike and a result can be reproduced.

A latent race (a flag raised before the stores it covers, a wait that covers too little, a unit speaking for
others) shows only when some rank's work lands later than a peer assumes. One rank per trial is the LATE rank,
each rank in turn (``(trial + seed) % world``); the others run unperturbed, so they finish (and the harness takes
their output snapshot) while the late rank's work is still in flight. What makes the late rank late:

  jitter        its stream starts after everyone else's: the others draw a delay in [0, J], it draws one in
                [J, 2J] (J = the command's ``jitter_us``: the evaluator's floor, or its share of the seed's step
                when that is longer: gpu_evaluator.start_delay_us). Catches a consumer that does not wait at all.
  stress        its pauses inside the runtime's primitives (runtime/cuco_stress.h, the stress build): after a
                signal and before a wait returns. Catches flags raised too early, waits that cover too little,
                but only for candidates that signal through the runtime.
  interference  a helper kernel (runtime/harness_helpers.cu, cuco_h_interfere) on a stream of its own at the
                highest priority, started a random time after the device barrier, whose CTAs hold the SMs this
                rank may use for a random time and free them one by one. The candidate's CTAs there start late and at
                different times, and its later kernels start late: a flag raised by the unit that happens to run
                first shows, whatever the candidate signals with (raw atomics included).

Each is off when its knob is (``jitter_us`` 0, no stress build, no ``interference`` in the command); with all
off there is no late rank. Pure Python (no torch): the plan is unit-tested on the CPU.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

# Threads of one interference CTA (kInterfereThreads in runtime/harness_helpers.cu): two fill an SM.
INTERFERE_THREADS = 1024
CTAS_PER_SM = 2048 // INTERFERE_THREADS
# How much of the late rank's SMs one trial's interference takes, drawn per trial. Half leaves room for small
# grids to start at once; all of them (or more: a second wave) makes every CTA of the candidate wait for SMs that
# come free one by one, but hundreds of SMs come free within microseconds of each other, so a grid starts nearly
# together again. STARVE trials instead leave the candidate a few SMs (STARVE_FREE_SMS) for at least half the hold:
# its CTAs run a few at a time and its copies crawl, so a flag raised by the first unit, or raised before the last
# copies land, stays wrong for tens of microseconds (the raw races at the small preset showed this: caught in
# fewer than 19 of 20 seeds with the one-by-one release alone).
SM_SHARES = (0.5, 1.0, 1.5)
STARVE = 0.5  # chance that a trial's interference starves the candidate instead of taking SM_SHARES
STARVE_FREE_SMS = (1, 2, 4)
BEFORE_STEP = 0.75  # chance that the interference holds the SMs when the step starts (else it comes mid-step)
MID_STEP_MIN_NS = 1_000  # mid-step: log-uniform this long .. the longest hold after the late rank's start


@dataclass(frozen=True)
class Knobs:
    """What one command asks for, as a rank sees it."""

    jitter_ns: int  # J: the late rank's start delay lies in [J, 2J], everyone else's in [0, J]
    stress_max_ns: int  # the stress build's longest pause (0: no stress build loaded)
    interference_max_hold_ns: int  # the longest time an interference CTA holds its SM (0: no interference)
    sm_share: float  # SMs this rank may use (its MPS share of the GPU's SMs)

    @classmethod
    def from_command(cls, cmd: dict[str, Any], stress: dict[str, Any] | None, stress_hooks: bool, sm_count: int,
                     thread_percentage: str | None) -> Knobs:
        """``stress``: the command's stress build (or None); ``stress_hooks``: whether the loaded library exports
        the pause configuration; ``thread_percentage``: this rank's CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, if any."""
        interference = cmd.get("interference") or {}
        pct = float(thread_percentage) if thread_percentage else 100.0
        return cls(jitter_ns=int(float(cmd.get("jitter_us", 200.0)) * 1000),
                   stress_max_ns=int(stress["max_delay_ns"]) if stress and stress_hooks else 0,
                   interference_max_hold_ns=int(interference.get("max_hold_ns", 0)),
                   sm_share=max(1.0, sm_count * min(pct, 100.0) / 100.0))

    @property
    def any(self) -> bool:
        return bool(self.jitter_ns or self.stress_max_ns or self.interference_max_hold_ns)


@dataclass(frozen=True)
class Interference:
    """One trial's interference kernel on the late rank."""

    offset_ns: int  # from the device barrier to its launch (on its own stream)
    hold_ns: int  # each of its CTAs holds an SM for hold_ns / 2 .. hold_ns
    blocks: int  # CTAs of INTERFERE_THREADS threads
    seed: int  # draws each CTA's hold


@dataclass(frozen=True)
class TrialPlan:
    """What this rank does to one trial's schedule."""

    late_rank: int | None  # None: no perturbation at all (world 1, or every knob off)
    is_late: bool  # this rank is the late one
    jitter_ns: int  # this rank's start delay after the device barrier
    stress_seed: int  # the stress build's pause seed for this (trial, rank)
    stress_max_ns: int  # the stress build's longest pause on this rank (0: none; only the late rank pauses)
    interference: Interference | None  # on the late rank only


def _log_uniform(rng: random.Random, lo: float, hi: float) -> float:
    return math.exp(rng.uniform(math.log(lo), math.log(hi))) if hi > lo else lo


def interference_for(seed: int, trial: int, knobs: Knobs, late_jitter_ns: int) -> Interference:
    """The late rank's interference in (seed, trial): its hold (log-uniform, a tenth of the longest up to the
    longest), the share of the rank's SMs it takes (SM_SHARES, or all but a few in STARVE of the trials), and
    when it starts: in BEFORE_STEP of the trials
    shortly before the late rank's step (its jitter, less up to a quarter of the hold: every CTA, holding at least
    half of it, still holds its SM when the step's CTAs arrive), otherwise a log-uniform time after the step
    started (its later CTAs and kernels)."""
    rng = random.Random(f"interfere:{seed}:{trial}")
    longest = knobs.interference_max_hold_ns
    hold = int(_log_uniform(rng, longest / 10, longest))
    if rng.random() < STARVE:
        blocks = CTAS_PER_SM * max(1, round(knobs.sm_share) - rng.choice(STARVE_FREE_SMS))
    else:
        blocks = max(1, round(CTAS_PER_SM * knobs.sm_share * rng.choice(SM_SHARES)))
    if rng.random() < BEFORE_STEP:
        offset = max(0, late_jitter_ns - int(rng.uniform(0, hold / 4)))
    else:
        offset = late_jitter_ns + int(_log_uniform(rng, MID_STEP_MIN_NS, max(MID_STEP_MIN_NS, longest)))
    return Interference(offset_ns=offset, hold_ns=hold, blocks=blocks, seed=rng.getrandbits(64))


def plan_trial(seed: int, trial: int, rank: int, world: int, knobs: Knobs) -> TrialPlan:
    """This rank's plan for one L2 trial. Deterministic in (seed, trial, rank, world, knobs); every rank agrees on
    the late rank and on the late rank's draws."""
    if world < 2 or not knobs.any:
        return TrialPlan(late_rank=None, is_late=False, jitter_ns=0, stress_seed=0, stress_max_ns=0,
                         interference=None)
    late_rank = (trial + seed) % world
    j = knobs.jitter_ns
    late_jitter = j + random.Random(f"jitter:{seed}:{trial}:{late_rank}").randrange(0, j + 1) if j else 0
    is_late = rank == late_rank
    jitter = late_jitter if is_late else (random.Random(f"jitter:{seed}:{trial}:{rank}").randrange(0, j + 1)
                                          if j else 0)
    interference = (interference_for(seed, trial, knobs, late_jitter)
                    if is_late and knobs.interference_max_hold_ns else None)
    return TrialPlan(late_rank=late_rank, is_late=is_late, jitter_ns=jitter,
                     stress_seed=random.Random(f"stress:{seed}:{trial}:{rank}").getrandbits(64),
                     stress_max_ns=knobs.stress_max_ns if is_late else 0, interference=interference)


def describe(knobs: Knobs, stress: dict[str, Any] | None) -> list[str]:
    """The notes an evaluation carries about its L2 trials' perturbation (the same on every rank). ``stress``: the
    command's stress build, if any (``knobs.stress_max_ns`` is 0 when it exports no pause configuration)."""
    notes = []
    if knobs.any:
        notes.append("L2 trials: one late rank per trial, each rank in turn" + (
            f", starting {knobs.jitter_ns / 1000:g}-{2 * knobs.jitter_ns / 1000:g} us after the device barrier while "
            f"the others start within {knobs.jitter_ns / 1000:g} us" if knobs.jitter_ns else ""))
    if stress:
        notes.append("L2 trials ran on the stress build: " + (
            f"one late rank per trial, with random pauses up to {knobs.stress_max_ns / 1000:g} us after "
            f"{stress['permille'] / 10:g}% of its signals and before as many waits return" if knobs.stress_max_ns else
            "it uses none of the runtime's signalling primitives, so only the harness's own perturbation applies"))
    if knobs.interference_max_hold_ns:
        notes.append(f"L2 trials: an interference kernel holds up to {max(SM_SHARES):g}x the late rank's SMs (or "
                     f"all but {min(STARVE_FREE_SMS)}-{max(STARVE_FREE_SMS)} of them) for up to "
                     f"{knobs.interference_max_hold_ns / 1000:g} us, before or during its step")
    return notes
