"""CPU checks of device timing and race amplification: the rank harness's held/end-to-end iterations and its
fallback when a step stalls the hold, the stress trials' late rank and pauses, merging both timings across ranks,
comparing candidate and seed on the same timing, and the evaluators and tables that carry both timings."""
from __future__ import annotations

import ctypes
from pathlib import Path
from types import SimpleNamespace as NS
from typing import Any

import pytest

from cuco_kit.errors import BadInput
from cuco_kit.evaluate import build as B
from cuco_kit.evaluate.api import EvalRequest, EvalResult, timing_medians
from cuco_kit.evaluate.gpu_evaluator import compare_timings, merge_replies
from cuco_kit.evaluate.phase_clock import PhaseClock
from cuco_kit.evaluate.rank import harness
from cuco_kit.evaluate.rank.harness import NO_HOLD_NOTE, _Evaluation
from cuco_kit.evaluate.simulated import SimulatedEvaluator
from cuco_kit.store import Store
from cuco_kit.widgets.plots import _hover
from cuco_kit.workbench.report import run_frame
from cuco_kit.workload import Workload

ROOT = Path(__file__).resolve().parents[3]


class _Steps:
    """Stands in for _Evaluation._step: records each call, returns a time per kind and stalls the holds listed."""

    def __init__(self, stall_holds: set[int] = frozenset()) -> None:  # type: ignore[assignment]
        self.calls: list[dict[str, Any]] = []
        self.stall_holds = stall_holds
        self.holds = 0

    def __call__(self, *, trial: int, what: str, level: str, verify: bool, plan: Any = None,
                 capture: bool = False, held: bool = False) -> tuple[float, bool]:
        self.calls.append({"trial": trial, "verify": verify, "held": held, "plan": plan,
                           "jitter_ns": plan.jitter_ns if plan is not None else 0})
        if held:
            self.holds += 1
            return 1.0, self.holds in self.stall_holds
        return 1.5, False


def _evaluation(steps: _Steps, *, timing: str = "device", world: int = 1, rank: int = 0, seed: int = 0,
                cmd: dict[str, Any] | None = None, lib: Any = None) -> _Evaluation:
    ev = _Evaluation.__new__(_Evaluation)
    ev.h = NS(workload=NS(timing=timing), world=world, rank=rank, unholdable=set(), sm_count=132,
              _progress=lambda *a, **k: None, helpers=NS(error_name=str))
    ev.cmd = {"so_path": "/cache/cand.so", "warmup": 2, "iters": 6, "verify_every": 3, "seed": seed, **(cmd or {})}
    ev.seed, ev.step_limit_s, ev.notes, ev.stalls, ev.holdable = seed, 1.0, [], 0, True
    ev.lib = lib
    ev.clock = PhaseClock()
    ev._step = steps  # type: ignore[method-assign,assignment]
    return ev


def test_each_timed_iteration_is_measured_held_and_end_to_end() -> None:
    steps = _Steps()
    out = _evaluation(steps)._timed()
    assert out["timing"] == "device" and out["times_ms"] == out["device_ms"] == [1.0] * 6
    assert out["e2e_ms"] == [1.5] * 6
    timed = [c for c in steps.calls if c["trial"] >= 2000]
    assert [c["held"] for c in timed] == [True, False] * 6
    assert all(c["held"] for c in steps.calls if 1000 <= c["trial"] < 2000)  # warm-up is held
    # verification (first iteration at least) happens on the scoring timing only
    assert timed[0]["verify"] and not timed[1]["verify"]
    assert not any(c["verify"] for c in timed if not c["held"])


def test_end_to_end_scoring_workload_verifies_and_scores_the_unheld_step() -> None:
    steps = _Steps()
    out = _evaluation(steps, timing="end_to_end")._timed()
    assert out["timing"] == "end_to_end" and out["times_ms"] == [1.5] * 6 and out["device_ms"] == [1.0] * 6
    timed = [c for c in steps.calls if c["trial"] >= 2000]
    assert timed[1]["verify"] and not any(c["verify"] for c in timed if c["held"])


def test_one_stall_is_retried_two_end_device_timing_for_the_library() -> None:
    once = _evaluation(_Steps(stall_holds={1}))
    out = once._timed()
    assert out["timing"] == "device" and len(out["device_ms"]) == 6 and once.holdable
    steps = _Steps(stall_holds={1, 2})
    ev = _evaluation(steps)
    out = ev._timed()
    assert out["timing"] == "end_to_end" and out["device_ms"] is None and out["times_ms"] == [1.5] * 6
    assert NO_HOLD_NOTE in ev.notes and "/cache/cand.so" in ev.h.unholdable
    assert steps.holds == 2  # nothing held after the second stall
    timed = [c for c in steps.calls if c["trial"] >= 2000]
    assert timed[0]["verify"] and not timed[0]["held"]  # the end-to-end step is verified instead


def test_the_timeline_profiles_each_iteration_on_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    profiles: list[Any] = []

    class _Profile:  # torch.profiler.profile as the harness uses it: a context whose events() lists the kernels
        def __init__(self, activities: Any) -> None:
            self.index, self.open = len(profiles), False
            profiles.append(self)

        def __enter__(self) -> Any:
            self.open = True
            return self

        def __exit__(self, *exc: Any) -> None:
            self.open = False

        def events(self) -> list[Any]:
            return [NS(device_type="DeviceType.CUDA", name=f"k{self.index}", device_resource_id=7,
                       time_range=NS(start=1.0, end=3.0))]

    class _ProfiledSteps(_Steps):
        def __call__(self, **kw: Any) -> tuple[float, bool]:
            assert profiles and profiles[-1].open, "a profiled step ran outside its own profile"
            return super().__call__(**kw)

    monkeypatch.setattr(harness, "profile", _Profile)
    steps = _ProfiledSteps()
    rows = _evaluation(steps)._profiled_iterations(3)
    assert [(r["iteration"], r["name"], r["rank"], r["dur_us"]) for r in rows] == [
        (0, "k0", 0, 2.0), (1, "k1", 0, 2.0), (2, "k2", 0, 2.0)]
    assert [c["trial"] for c in steps.calls] == [3000, 3001, 3002]  # fresh inputs each
    assert all(c["held"] and not c["verify"] for c in steps.calls)  # held as the device time is; never verified


class _Configure:
    """cuco_stress_configure as ctypes shows it: a callable whose argtypes/restype the harness sets."""

    argtypes: Any = None
    restype: Any = None

    def __init__(self) -> None:
        self.calls: list[tuple[int, int, int]] = []

    def __call__(self, seed: int, max_ns: int, permille: int) -> int:
        self.calls.append((seed, max_ns, permille))
        return 0


class _StressLib:
    def __init__(self) -> None:
        self.cuco_stress_configure = _Configure()
        self.calls = self.cuco_stress_configure.calls


def test_stress_trials_make_each_rank_the_late_one_in_turn() -> None:
    stress = {"so_path": "/cache/stress.so", "max_delay_ns": 50_000, "permille": 500}
    late: dict[int, list[int]] = {}
    for rank in range(2):
        steps, lib = _Steps(), _StressLib()
        ev = _evaluation(steps, world=2, rank=rank, seed=7, cmd={"trials": 4, "jitter_us": 100.0}, lib=lib)
        ev._verify_trials(stress)
        assert lib.calls.pop() == (0, 0, 0)  # after the trials: pauses off, the same library is timed next
        assert len(lib.calls) == 4 and all(c[2] == 500 for c in lib.calls)
        assert len({c[0] for c in lib.calls}) == 4  # new pauses every trial
        late[rank] = [t for t, c in enumerate(lib.calls) if c[1] == 50_000]
        assert all(c[1] == 0 for t, c in enumerate(lib.calls) if t not in late[rank])  # on time: no pauses
        jit = [c["jitter_ns"] for c in steps.calls]
        assert all(jit[t] >= 100_000 for t in late[rank]) and all(jit[t] <= 100_000 for t in range(4)
                                                                  if t not in late[rank])
        assert all(c["verify"] for c in steps.calls)
        assert any("stress build" in n for n in ev.notes)
    assert sorted(late[0] + late[1]) == [0, 1, 2, 3] and late[0] and late[1]


def test_a_library_without_hooks_gets_the_harness_jitter_only() -> None:
    steps = _Steps()
    ev = _evaluation(steps, world=2, rank=0, cmd={"trials": 2}, lib=NS())
    ev._verify_trials({"so_path": "/cache/cand.so", "max_delay_ns": 1000, "permille": 10})
    assert len(steps.calls) == 2 and any("none of the runtime's signalling primitives" in n for n in ev.notes)


def _pass(device: list[float] | None, e2e: list[float], timing: str) -> dict[str, Any]:
    return {"verdict": "pass", "times_ms": device if timing == "device" else e2e, "device_ms": device,
            "e2e_ms": e2e, "timing": timing, "l2_seconds": 0.25}


def test_merge_replies_keeps_both_timings_slowest_rank_first() -> None:
    res = merge_replies([_pass([1.0, 3.0, 2.0], [2.0, 4.0, 3.0], "device"),
                         _pass([2.0, 1.0, 2.5], [3.0, 2.0, 3.5], "device")], {})
    assert res.timing is not None and res.timing["score"] == "device"
    assert res.timing["device"]["iteration_ms"] == [2.0, 3.0, 2.5] and res.median_ms == 2.5
    assert res.timing["end_to_end"]["iteration_ms"] == [3.0, 4.0, 3.5]
    assert timing_medians(res.timing) == ("device", 2.5, 3.5)
    assert res.provenance["l2_seconds"] == 0.25
    res = merge_replies([_pass(None, [2.0, 4.0, 3.0], "end_to_end")], {})
    assert res.timing is not None and res.timing["device"] is None and res.median_ms == 3.0
    assert "note" in res.timing and timing_medians(None) == (None, None, None)


def test_candidate_and_seed_are_compared_on_the_same_timing() -> None:
    cand = merge_replies([_pass([1.0, 1.0, 1.0], [2.0, 2.0, 2.0], "device")], {})
    seed = merge_replies([_pass([4.0, 4.0, 4.0], [5.0, 5.0, 5.0], "device")], {})
    compare_timings(cand, seed)
    assert cand.median_ms == 1.0 and cand.seed_median_ms == 4.0
    stuck_seed = merge_replies([_pass(None, [6.0, 6.0, 6.0], "end_to_end")], {})
    compare_timings(cand, stuck_seed)  # the seed cannot be held: both end to end
    assert cand.timing is not None and cand.timing["score"] == "end_to_end"
    assert cand.median_ms == 2.0 and cand.seed_median_ms == 6.0 and "end to end" in cand.timing["note"]


def test_workload_timing_is_checked() -> None:
    with pytest.raises(BadInput, match="timing"):
        Workload(name="w", directory=Path("."), description="", params={}, tensors=[], reference=lambda *a: [],
                 timing="wallclock")
    assert Workload(name="w", directory=Path("."), description="", params={}, tensors=[],
                    reference=lambda *a: []).timing == "device"


def test_stress_config_and_which_sources_have_hooks() -> None:
    cfg = B.stress_config(B.BuildConfig(extra_flags=("-DX=1",)))
    assert cfg.extra_flags == ("-DX=1", B.STRESS_DEFINE) and B.stress_config(cfg) == cfg
    assert B.STRESS_DEFINE in B.nvcc_command("a.cu", "a.so", "symm", cfg)
    races = (ROOT / "tests" / "data" / "adversarial" / "flag_before_stores.cu").read_text()
    assert B.has_stress_hooks(races, "symm") and B.has_stress_hooks(races, "nccl")
    copies = (ROOT / "sample_kernels" / "allgather" / "seed_copy.cu").read_text()
    assert not B.has_stress_hooks(copies, "symm") and not B.has_stress_hooks(copies, "nccl")
    # host NCCL waits in the symm layer's flag kernels (which pause); under nccl they are NCCL's own
    host_nccl = (ROOT / "sample_kernels" / "allgather" / "seed_nccl.cu").read_text()
    assert B.has_stress_hooks(host_nccl, "symm") and not B.has_stress_hooks(host_nccl, "nccl")


def test_simulated_results_carry_both_timings() -> None:
    code = (ROOT / "sample_kernels" / "allgather" / "device_lsa.cu").read_text()
    ev = SimulatedEvaluator(3, fail_rate=0.0, check_l0=False, host_ms=0.05)
    res = ev.evaluate(EvalRequest(candidate_code=code, workload_dir=str(ROOT / "sample_kernels" / "allgather")))
    score, dev, e2e = timing_medians(res.timing)
    assert score == "device" and dev is not None and dev == res.median_ms
    assert e2e is not None and abs(e2e - dev - 0.05) < 1e-9
    assert EvalResult.from_dict(res.to_dict()).timing == res.timing


def test_the_hold_entry_points_are_declared_for_ctypes() -> None:
    src = (ROOT / "cuco_kit" / "runtime" / "harness_helpers.cu").read_text()
    for name in ("cuco_h_hold", "cuco_h_release"):
        assert f"CUCO_H_EXPORT int {name}(" in src
    assert ctypes.sizeof(ctypes.c_uint64) == 8


def test_stored_results_show_both_timings_in_tables_and_hover(tmp_path: Path) -> None:
    code = (ROOT / "sample_kernels" / "allgather" / "device_lsa.cu").read_text()
    res = SimulatedEvaluator(1, fail_rate=0.0, check_l0=False).evaluate(
        EvalRequest(candidate_code=code, workload_dir=str(ROOT / "sample_kernels" / "allgather")))
    with Store(tmp_path / "run.sqlite") as store:
        run = store.create_run(workload="allgather", config={}, badge="simulated")
        prog = store.add_program(run_id=run, code=code, parent_id=None, source="seed")
        ev = store.start_evaluation(prog, world_size=1, backend="nccl", badge="simulated", request={})
        store.finish_evaluation(ev, res.to_dict())
        df = run_frame(store, run)
    row = df.iloc[0]
    assert row["timing"] == "device" and row["device_ms"] == res.median_ms
    assert row["e2e_ms"] == timing_medians(res.timing)[2]
    assert "end to end" in _hover(row) and "(device time)" in _hover(row)
