"""CPU checks of what makes an evaluation fast without loosening it: the seed measured once per world and measured
again on schedule, on a new world and beside a claimed ratio (with a drift check); timed iterations stopped once
the median's interval is tight, on every rank together; the torch reference kept per iteration with a checksum;
and every evaluation's phases in its provenance."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace as NS
from typing import Any

import pytest
import torch

from cuco_kit.evaluate.api import EvalRequest, EvalResult
from cuco_kit.evaluate.gpu_evaluator import EvaluatorConfig, GpuEvaluator, merge_replies
from cuco_kit.evaluate.phase_clock import PhaseClock, slowest_rank
from cuco_kit.evaluate.rank.harness import _Evaluation
from cuco_kit.evaluate.rank.reference_cache import ReferenceCache, checksum
from cuco_kit.evaluate.seed_cache import SeedCache
from cuco_kit.evaluate.stats import median_ci_halfwidth
from cuco_kit.workload import load_workload

ROOT = Path(__file__).resolve().parents[3]
WL = ROOT / "sample_kernels" / "allgather"


# ---- the stop rule ---------------------------------------------------------------------------------------------

def test_median_interval_is_half_the_range_for_five_and_narrows_with_more() -> None:
    assert median_ci_halfwidth([1.0, 1.02, 0.98, 1.0, 1.01]) == pytest.approx(0.02)
    assert median_ci_halfwidth([5.0]) == float("inf")
    noisy = [1.0, 2.0] * 10
    assert median_ci_halfwidth(noisy) == pytest.approx(0.5)  # a bimodal step never looks tight
    assert median_ci_halfwidth([1.0] * 19 + [9.0]) == 0.0  # one outlier does not hold the rule back


class _Steps:
    def __init__(self, times: list[float]) -> None:
        self.times, self.n = times, 0

    def __call__(self, *, trial: int, what: str, level: str, verify: bool, jitter_ns: int = 0,
                 capture: bool = False, held: bool = False) -> tuple[float, bool]:
        if trial >= 2000 and held:
            self.n += 1
            return self.times[(self.n - 1) % len(self.times)], False
        return 1.0, False


def _timed(times: list[float], *, peer_tight: bool = True, rule: dict[str, Any] | None = None) -> tuple[dict, Any]:
    ev = _Evaluation.__new__(_Evaluation)
    votes: list[int] = []

    def host_max(code: int) -> int:
        votes.append(code)
        return max(code, 0 if peer_tight else 1)

    ev.h = NS(workload=NS(timing="device"), world=2, rank=0, unholdable=set(), _progress=lambda *a, **k: None,
              _host_max=host_max)
    ev.cmd = {"so_path": "x.so", "warmup": 1, "iters": 12, "verify_every": 3, "seed": 0,
              "stop": rule if rule is not None else {"min_iters": 5, "rel_ci": 0.01}}
    ev.seed, ev.step_limit_s, ev.notes, ev.stalls, ev.holdable, ev.clock = 0, 1.0, [], 0, True, PhaseClock()
    ev._step = _Steps(times)  # type: ignore[method-assign,assignment]
    return ev._timed(), ev


def test_timing_stops_at_the_minimum_once_tight_on_every_rank() -> None:
    out, ev = _timed([1.0, 1.001, 0.999])
    assert len(out["times_ms"]) == 5 and len(out["e2e_ms"]) == 5
    assert any("stopped after 5 of 12" in n for n in ev.notes)
    assert set(ev.clock.seconds) >= {"warmup", "device_timing", "e2e_timing"}


def test_noise_or_a_loose_peer_keeps_timing_to_the_end() -> None:
    out, _ = _timed([1.0, 1.3, 0.8, 1.1])
    assert len(out["times_ms"]) == 12
    out, ev = _timed([1.0], peer_tight=False)  # this rank is tight, a peer is not: all go on together
    assert len(out["times_ms"]) == 12 and not any("stopped" in n for n in ev.notes)


def test_without_a_rule_every_iteration_is_timed() -> None:
    out, _ = _timed([1.0], rule={})
    assert len(out["times_ms"]) == 12


# ---- the seed cache ----------------------------------------------------------------------------------------------

def _seed(ms: float) -> EvalResult:
    return EvalResult("L3", "pass", median_ms=ms, iteration_ms=[ms] * 5)


def test_a_seed_measurement_serves_its_world_until_the_schedule_says_again() -> None:
    cache, world = SeedCache(remeasure_every=3), object()
    assert cache.reusable("k", world) is None
    assert cache.store("k", world, _seed(1.0)) == ""
    assert cache.reusable("k", world) is not None and cache.reusable("k", world) is not None
    assert cache.reusable("k", world) is None  # served 3: measure again
    assert cache.reusable("k", object()) is None  # another world (a restart): measure again


def test_another_protocol_in_the_same_world_overwrites_the_oracle_record() -> None:
    cache, world = SeedCache(remeasure_every=5), object()
    cache.store("a", world, _seed(1.0))
    cache.store("b", world, _seed(1.0))
    assert cache.reusable("a", world) is None and cache.reusable("b", world) is not None


def test_drift_beyond_the_tolerance_is_reported() -> None:
    cache, world = SeedCache(drift_tolerance=0.03), object()
    cache.store("k", world, _seed(1.0))
    assert cache.store("k", world, _seed(1.02)) == ""
    note = cache.store("k", world, _seed(1.10))
    assert "+7.8%" in note and "drift tolerance" in note


def test_a_new_best_or_a_flagged_ratio_claims_a_fresh_seed() -> None:
    cache = SeedCache()
    res = EvalResult("L3", "pass", speedup=1.05)
    assert cache.claims("k", res)
    cache.scored("k", res)
    assert not cache.claims("k", EvalResult("L3", "pass", speedup=1.04))
    assert not cache.claims("k", EvalResult("L3", "pass", speedup=0.9))
    assert cache.claims("k", EvalResult("L3", "pass", speedup=0.9, flagged=True))
    assert not SeedCache(beside_claims=False).claims("k", res)


class _Group:
    """A warm world that answers eval commands as four ranks would: the seed at `seed_ms`, candidates at
    `cand_ms`; it counts the commands per role."""

    def __init__(self, seed_ms: list[float], cand_ms: float) -> None:
        self.seed_ms, self.cand_ms = seed_ms, cand_ms
        self.roles: list[str] = []
        self.started_s, self.isolation, self.info = 0.0, None, []

    def request(self, cmd: dict[str, Any], **_: Any) -> list[dict[str, Any]]:
        self.roles.append(cmd["role"])
        ms = self.seed_ms[min(len(self.roles) - 1, len(self.seed_ms) - 1)] if cmd["role"] == "seed" else self.cand_ms
        assert cmd["role"] == "seed" or cmd.get("stop") == {"min_iters": 5, "rel_ci": 0.01}
        return [{"verdict": "pass", "times_ms": [ms] * 5, "phases": {"e2e_timing": 0.1 * (r + 1)}} for r in range(4)]

    def tails(self) -> dict[str, str]:
        return {}


def _run(ev: GpuEvaluator, group: _Group, n: int) -> list[EvalResult]:
    ev.pool = NS(starts=1, group=lambda *a, **k: group, close=lambda: None)  # type: ignore[assignment]
    wl = load_workload(WL)
    out = []
    for _ in range(n):
        ev._clock = PhaseClock()
        req = EvalRequest("// candidate", str(WL), world_size=4, backend="symm", iters=5)
        out.append(ev._run_gpu(req, wl, wl.resolve({}), Path("cand.so"), Path("seed.so"), None, {}, {}, [], None))
    return out


def test_the_evaluator_reuses_the_seed_and_measures_it_again_beside_a_claim(tmp_path: Path) -> None:
    ev = GpuEvaluator(EvaluatorConfig(scratch_root=tmp_path, seed_every=4, race_size=False))
    ev._gpus = [{"name": "fake"}]
    ev._helpers = tmp_path / "helpers.so"
    group = _Group(seed_ms=[2.0, 2.0, 2.0], cand_ms=2.0)  # no claim: ratio 1.0
    res = _run(ev, group, 6)
    assert group.roles == ["seed", "candidate", "candidate", "candidate", "candidate", "seed", "candidate",
                           "candidate"]
    assert [r.provenance["seed_measured"].split()[0] for r in res] == ["now,", "reused", "reused", "reused", "now,",
                                                                      "reused"]
    assert all(r.speedup == pytest.approx(1.0) for r in res)
    assert res[0].provenance["_rank_phases"]["e2e_timing"] == pytest.approx(0.4)  # the slowest rank's
    assert ev._clock.seconds.keys() == {"candidate"}  # the last one reused the seed: no seed phase
    ev.close()


def test_a_claimed_ratio_is_scored_against_a_seed_measured_right_after_it(tmp_path: Path) -> None:
    ev = GpuEvaluator(EvaluatorConfig(scratch_root=tmp_path, race_size=False))
    ev._gpus = [{"name": "fake"}]
    ev._helpers = tmp_path / "helpers.so"
    # the seed measured 2.0 first; beside the claim it measures 1.5 (the GPU got faster): the claim shrinks
    group = _Group(seed_ms=[2.0, 1.5], cand_ms=1.5)
    first, second = _run(ev, group, 2)
    assert first.speedup == pytest.approx(2.0 / 1.5) and first.provenance["seed_measured"].startswith("now")
    assert group.roles[:2] == ["seed", "candidate"]
    # the second candidate (1.33x against the reused seed) is not a new best: reused
    assert second.provenance["seed_measured"].startswith("reused")
    ev2 = GpuEvaluator(EvaluatorConfig(scratch_root=tmp_path / "2", race_size=False))
    ev2._gpus, ev2._helpers = [{"name": "fake"}], tmp_path / "helpers.so"
    group2 = _Group(seed_ms=[2.0, 2.0, 1.5], cand_ms=1.5)
    group2.cand_ms = 2.0
    _run(ev2, group2, 1)  # ratio 1.0: the best so far is 1.0
    group2.cand_ms = 1.5
    (claimed,) = _run(ev2, group2, 1)  # 1.33x against the reused seed: a new best, so the seed runs again
    assert group2.roles == ["seed", "candidate", "candidate", "seed"]
    assert claimed.provenance["seed_measured"].startswith("again, right after")
    assert claimed.speedup == pytest.approx(1.5 / 1.5)
    assert any("moved -25.0%" in n for n in claimed.provenance.get("notes", []))
    ev.close()
    ev2.close()


def test_the_slowest_ranks_phases_travel_in_the_merged_reply() -> None:
    replies = [{"verdict": "pass", "times_ms": [1.0], "phases": {"load_setup": 0.2, "teardown": 0.1}},
               {"verdict": "pass", "times_ms": [1.0], "phases": {"load_setup": 0.3}}]
    res = merge_replies(replies, {})  # type: ignore[arg-type]
    assert res.provenance["_rank_phases"] == {"load_setup": 0.3, "teardown": 0.1}
    assert slowest_rank([None, {"a": 1.0}]) == {"a": 1.0}
    clock = PhaseClock()
    with clock.phase("x"):
        pass
    clock.add("x", 0.5)
    assert clock.seconds["x"] >= 0.5 and json.dumps(clock.rounded())


# ---- the reference cache ---------------------------------------------------------------------------------------

def test_the_reference_is_computed_once_per_iteration_and_checked_on_each_use() -> None:
    cache, calls = ReferenceCache(1 << 20), []

    def compute() -> dict[str, torch.Tensor]:
        calls.append(1)
        return {"y": torch.arange(16, dtype=torch.float32)}

    a = cache.get_or_compute((0, 1), compute)
    b = cache.get_or_compute((0, 1), compute)
    assert len(calls) == 1 and torch.equal(a["y"], b["y"]) and cache.hits == 1
    b["y"][3] = 99.0  # a stray store into the cached copy
    c = cache.get_or_compute((0, 1), compute)
    assert len(calls) == 2 and cache.corrupted == 1 and float(c["y"][3]) == 3.0
    cache.get_or_compute((0, 2), compute)
    assert cache.bytes == 2 * 64


def test_the_reference_cache_is_bounded_oldest_first() -> None:
    cache = ReferenceCache(100)
    for t in range(3):
        cache.get_or_compute((0, t), lambda: {"y": torch.zeros(16)})  # 64 bytes each: one fits
    assert cache.bytes == 64 and cache.misses == 3
    cache.get_or_compute((0, 2), lambda: {"y": torch.zeros(16)})
    assert cache.hits == 1
    big = ReferenceCache(10)
    big.get_or_compute((0, 0), lambda: {"y": torch.zeros(16)})
    assert big.bytes == 0  # larger than the whole budget: used, never kept


def test_the_checksum_sees_a_swap_of_two_words() -> None:
    x = torch.tensor([1.0, 2.0, 3.0, 4.0])
    y = torch.tensor([2.0, 1.0, 3.0, 4.0])
    assert checksum(x) != checksum(y)
    assert checksum(torch.zeros(3, dtype=torch.uint8)) == 0


def test_l0_runs_once_per_source_and_a_prebuild_skips_what_it_rejects(monkeypatch: pytest.MonkeyPatch,
                                                                     tmp_path: Path) -> None:
    from cuco_kit.evaluate import gpu_evaluator as G
    from cuco_kit.source import static_check

    calls: list[str] = []
    monkeypatch.setattr(static_check, "check_candidate",
                        lambda code, parent: calls.append(code) or NS(ok="bad" not in code, reasons=["fopen"]))
    monkeypatch.setattr(G, "_L0_SEEN", {})
    assert G.run_l0("// good", None)[0] is True and G.run_l0("// good", None)[0] is True
    assert calls == ["// good"]
    built: list[str] = []
    monkeypatch.setattr(G, "build", lambda code, *a: built.append(code) or NS(ok=True))
    cfg = EvaluatorConfig(cache_dir=tmp_path)
    assert G.prebuild(cfg, EvalRequest("// bad", str(WL))) is False and built == []
    assert G.prebuild(cfg, EvalRequest("// good", str(WL))) is True and built == ["// good"]
    assert calls == ["// good", "// bad"]  # the good one's verdict was remembered
