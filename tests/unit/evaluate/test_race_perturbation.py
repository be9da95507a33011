"""CPU checks of the L2 trials' schedule perturbation (rank/perturb.py, harness._verify_trials and _perturb): which
trial and rank gets what, that every rank plans a trial alike, that the plan is deterministic per seed, and that the
harness launches what the plan says, where it says."""
from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace as NS
from typing import Any

import pytest

from cuco_kit.evaluate.gpu_evaluator import start_delay_us
from cuco_kit.evaluate.rank import perturb as P
from cuco_kit.evaluate.rank.harness import _Evaluation

ROOT = Path(__file__).resolve().parents[3]
KNOBS = P.Knobs(jitter_ns=200_000, stress_max_ns=50_000, interference_max_hold_ns=200_000, sm_share=66.0)


def _plans(seed: int, trial: int, world: int, knobs: P.Knobs = KNOBS) -> list[P.TrialPlan]:
    return [P.plan_trial(seed, trial, r, world, knobs) for r in range(world)]


@pytest.mark.parametrize("world", [2, 3, 4])
def test_one_late_rank_per_trial_each_rank_in_turn_and_every_rank_agrees(world: int) -> None:
    for seed in range(5):
        late = []
        for t in range(world):
            plans = _plans(seed, t, world)
            assert len({p.late_rank for p in plans}) == 1  # every rank names the same late rank
            assert [p.is_late for p in plans].count(True) == 1
            late.append(plans[0].late_rank)
            assert plans[plans[0].late_rank].is_late
        assert sorted(late) == list(range(world))  # each rank is the late one once in `world` trials


def test_only_the_late_rank_is_late_pauses_and_interferes() -> None:
    for seed in range(20):
        for t in range(3):
            for p in _plans(seed, t, 2):
                if p.is_late:
                    assert KNOBS.jitter_ns <= p.jitter_ns <= 2 * KNOBS.jitter_ns
                    assert p.stress_max_ns == KNOBS.stress_max_ns and p.interference is not None
                else:
                    assert 0 <= p.jitter_ns <= KNOBS.jitter_ns
                    assert p.stress_max_ns == 0 and p.interference is None


def test_plans_are_deterministic_per_seed_and_differ_between_seeds_and_trials() -> None:
    assert _plans(7, 1, 4) == _plans(7, 1, 4)
    late = [next(p for p in _plans(s, t, 2) if p.is_late) for s in range(4) for t in range(3)]
    assert len({(p.jitter_ns, p.interference) for p in late}) == len(late)
    assert len({p.stress_seed for s in range(4) for t in range(3) for p in _plans(s, t, 2)}) == 24


def test_nothing_is_perturbed_at_world_one_or_with_every_knob_off() -> None:
    none = P.TrialPlan(late_rank=None, is_late=False, jitter_ns=0, stress_seed=0, stress_max_ns=0, interference=None)
    assert P.plan_trial(3, 0, 0, 1, KNOBS) == none
    assert _plans(3, 0, 2, P.Knobs(0, 0, 0, 66.0)) == [none, none]
    assert P.describe(P.Knobs(0, 0, 0, 66.0), None) == []


def test_each_knob_alone() -> None:
    jitter = P.Knobs(200_000, 0, 0, 66.0)
    assert all(p.interference is None and p.stress_max_ns == 0 for p in _plans(1, 0, 2, jitter))
    interference = P.Knobs(0, 0, 200_000, 66.0)
    plans = _plans(1, 0, 2, interference)
    assert all(p.jitter_ns == 0 for p in plans) and sum(p.interference is not None for p in plans) == 1
    stress = P.Knobs(0, 50_000, 0, 66.0)
    assert sorted(p.stress_max_ns for p in _plans(1, 0, 2, stress)) == [0, 50_000]


def test_interference_draws_stay_in_their_ranges_and_mostly_precede_the_step() -> None:
    before = starved = 0
    for seed in range(400):
        late = next(p for p in _plans(seed, seed % 3, 2) if p.is_late)
        i = late.interference
        assert i is not None
        assert KNOBS.interference_max_hold_ns / 10 - 1 <= i.hold_ns <= KNOBS.interference_max_hold_ns
        shares = {round(P.CTAS_PER_SM * KNOBS.sm_share * s) for s in P.SM_SHARES}
        starves = {P.CTAS_PER_SM * (round(KNOBS.sm_share) - f) for f in P.STARVE_FREE_SMS}
        assert i.blocks in shares | starves
        starved += i.blocks in starves
        if i.offset_ns <= late.jitter_ns:  # before the step: every CTA still holds its SM when the step's arrive
            assert i.offset_ns >= late.jitter_ns - i.hold_ns / 4
            before += 1
        else:  # mid-step
            assert P.MID_STEP_MIN_NS <= i.offset_ns - late.jitter_ns <= KNOBS.interference_max_hold_ns
    assert 0.65 < before / 400 < 0.85  # BEFORE_STEP = 0.75
    assert 0.4 < starved / 400 < 0.6  # STARVE = 0.5: the candidate keeps a few SMs for at least half the hold


def test_knobs_from_a_command_and_this_ranks_mps_share() -> None:
    cmd = {"jitter_us": 100.0, "interference": {"max_hold_ns": 150_000}}
    stress = {"so_path": "/s.so", "max_delay_ns": 40_000, "permille": 500}
    k = P.Knobs.from_command(cmd, stress, True, 132, "50")
    assert (k.jitter_ns, k.stress_max_ns, k.interference_max_hold_ns, k.sm_share) == (100_000, 40_000, 150_000, 66.0)
    assert P.Knobs.from_command(cmd, stress, False, 132, None).stress_max_ns == 0  # nothing to configure
    assert P.Knobs.from_command(cmd, None, False, 132, None).sm_share == 132.0  # no MPS: the whole GPU
    off = P.Knobs.from_command({"jitter_us": 0.0, "interference": None}, None, False, 132, "25")
    assert not off.any and off.sm_share == 33.0


def test_the_interference_kernel_and_the_plan_agree_on_its_threads() -> None:
    src = (ROOT / "cuco_kit" / "runtime" / "harness_helpers.cu").read_text()
    m = re.search(r"constexpr int kInterfereThreads = (\d+);", src)
    assert m and int(m.group(1)) == P.INTERFERE_THREADS


# ------------------------------------------------------------------------------------ the harness side

class _Steps:
    def __init__(self) -> None:
        self.plans: list[Any] = []

    def __call__(self, *, trial: int, what: str, level: str, verify: bool, plan: Any = None,
                 capture: bool = False, held: bool = False) -> tuple[float, bool]:
        assert verify and level == "L2"
        self.plans.append(plan)
        return 1.0, False


def _evaluation(rank: int, cmd: dict[str, Any], world: int = 2) -> tuple[_Evaluation, _Steps]:
    ev = _Evaluation.__new__(_Evaluation)
    ev.h = NS(world=world, rank=rank, sm_count=132, _progress=lambda *a, **k: None, helpers=NS(error_name=str))
    ev.cmd = {"trials": 4, **cmd}
    ev.seed, ev.step_limit_s, ev.notes, ev.lib = 5, 1.0, [], NS()
    steps = _Steps()
    ev._step = steps  # type: ignore[method-assign,assignment]
    return ev, steps


def test_verify_trials_hands_each_step_its_plan_and_notes_the_interference(monkeypatch) -> None:
    monkeypatch.setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "50")
    cmd = {"jitter_us": 100.0, "interference": {"max_hold_ns": 200_000}}
    by_rank = {}
    for rank in range(2):
        ev, steps = _evaluation(rank, cmd)
        ev._verify_trials(None)
        assert [p.is_late for p in steps.plans].count(True) == 2  # 4 trials, 2 ranks
        assert all((p.interference is not None) == p.is_late for p in steps.plans)
        assert all(p.interference.blocks <= 2 * 66 * max(P.SM_SHARES) for p in steps.plans if p.interference)
        assert any("interference kernel" in n for n in ev.notes)
        by_rank[rank] = steps.plans
    assert [p.late_rank for p in by_rank[0]] == [p.late_rank for p in by_rank[1]]
    ev, steps = _evaluation(0, {"jitter_us": 0.0}, world=1)
    ev._verify_trials(None)
    assert all(p.late_rank is None for p in steps.plans) and not ev.notes


class _Helpers:
    """cuco_h_spin / cuco_h_interfere as ctypes shows them: record what was launched after what, return a code."""

    def __init__(self, fail: str = "") -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.fail = fail

    def cuco_h_spin(self, ns: int, stream: Any) -> int:
        self.calls.append(("spin", ns, stream.value))
        return 700 if self.fail == "spin" else 0

    def cuco_h_interfere(self, after: Any, offset_ns: int, blocks: int, hold_ns: int, seed: int) -> int:
        self.calls.append(("interfere", after.value, offset_ns, blocks, hold_ns, seed))
        return 700 if self.fail == "interfere" else 0

    @staticmethod
    def error_name(code: int) -> str:
        return f"cudaError({code})"


def _perturbing(helpers: _Helpers) -> _Evaluation:
    ev = _Evaluation.__new__(_Evaluation)
    ev.h = NS(helpers=helpers, stream=NS(cuda_stream=11))
    return ev


def test_perturb_gates_the_interference_on_the_barrier_then_delays_this_ranks_start() -> None:
    helpers = _Helpers()
    plan = P.TrialPlan(late_rank=1, is_late=True, jitter_ns=300_000, stress_seed=1, stress_max_ns=0,
                       interference=P.Interference(offset_ns=250_000, hold_ns=90_000, blocks=132, seed=9))
    _perturbing(helpers)._perturb(plan)
    # the interference waits for what the harness stream holds so far (the device barrier), not for the delay
    assert helpers.calls == [("interfere", 11, 250_000, 132, 90_000, 9), ("spin", 300_000, 11)]
    helpers.calls.clear()
    _perturbing(helpers)._perturb(P.TrialPlan(late_rank=1, is_late=False, jitter_ns=5, stress_seed=1,
                                              stress_max_ns=0, interference=None))
    assert helpers.calls == [("spin", 5, 11)]  # an on-time rank: its own delay only


@pytest.mark.parametrize("fail, what", [("interfere", "interference"), ("spin", "jitter")])
def test_a_failed_launch_is_a_harness_error(fail: str, what: str) -> None:
    plan = P.TrialPlan(late_rank=0, is_late=True, jitter_ns=10, stress_seed=1, stress_max_ns=0,
                       interference=P.Interference(offset_ns=0, hold_ns=20_000, blocks=4, seed=1))
    with pytest.raises(RuntimeError, match=f"{what} launch failed: cudaError\\(700\\)"):
        _perturbing(_Helpers(fail=fail))._perturb(plan)


def test_the_late_start_grows_with_the_seeds_step_and_stays_off_when_off() -> None:
    assert start_delay_us(200.0, 1.0, 0.05) == 200.0  # a 50 us step: the floor
    assert start_delay_us(200.0, 1.0, 1.6) == 1600.0  # a 1.6 ms step: a consumer's own-rows GEMM is hidden no more
    assert start_delay_us(200.0, 0.5, 1.6) == 800.0
    assert start_delay_us(200.0, 1.0, None) == 200.0  # no seed time yet
    assert start_delay_us(0.0, 1.0, 1.6) == 0.0  # the delay off stays off
    assert start_delay_us(200.0, 0.0, 1.6) == 200.0
