"""Bootstrap intervals on speed-ups (evaluate.stats), the label they give tables, and the statistics of
benchmarks/search/search_vs_random.py."""
from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path

import pytest

from cuco_kit.evaluate import stats
from cuco_kit.evaluate.api import RESULT_VERSION, EvalRequest, EvalResult
from cuco_kit.evaluate.simulated import SimulatedEvaluator
from cuco_kit.workbench.report import claim, ratio_text

ROOT = Path(__file__).resolve().parents[3]


def _times(mean: float, n: int = 20, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return [mean * (1 + rng.gauss(0, 0.02)) for _ in range(n)]


def test_interval_covers_the_ratio_and_is_seeded() -> None:
    seed, fast = _times(1.0, seed=1), _times(0.8, seed=2)
    ci = stats.speedup_ci(seed, fast)
    assert ci is not None and ci[0] < 1.25 < ci[1] and ci[0] > 1.0
    assert stats.speedup_ci(seed, fast) == ci  # same inputs, same interval
    assert stats.ratio_label(ci) == ""
    same = stats.speedup_ci(seed, _times(1.0, seed=3))
    assert stats.no_measurable_difference(same) and stats.ratio_label(same) == stats.NO_DIFFERENCE


def test_interval_is_absent_without_iterations() -> None:
    assert stats.speedup_ci(None, [1.0, 1.1]) is None
    assert stats.speedup_ci([1.0], [1.0, 1.1]) is None
    assert stats.speedup_ci([1.0, float("nan")], [1.0, 1.1]) is None
    assert stats.ratio_label(None) == "no interval" and not stats.no_measurable_difference(None)
    assert stats.mean_ci([1.0]) is None
    lo, hi = stats.mean_ci([1.0, 2.0, 3.0, 4.0]) or (0.0, 0.0)
    assert 1.0 <= lo < 2.5 < hi <= 4.0


def test_results_carry_the_interval_and_old_ones_read_as_version_1(tmp_path: Path) -> None:
    wl = ROOT / "tests" / "data" / "toy_workload"
    code = next(wl.glob("*.cu")).read_text() if any(wl.glob("*.cu")) else "int x;\n"
    res = SimulatedEvaluator(seed=0, fail_rate=0.0).evaluate(EvalRequest(code, str(wl), iters=12))
    assert res.version == RESULT_VERSION and res.passed
    assert res.seed_iteration_ms is not None and len(res.seed_iteration_ms) == 12
    assert res.speedup_ci == stats.speedup_ci(res.seed_iteration_ms, res.iteration_ms, seed=0)
    old = EvalResult.from_dict({"level_reached": "L3", "verdict": "pass", "speedup": 1.01})
    assert old.version == 1 and old.speedup_ci is None


def test_tables_and_widgets_say_no_measurable_difference() -> None:
    assert claim(None, None) == ""
    assert claim(1.01, [0.98, 1.04]) == stats.NO_DIFFERENCE
    assert claim(1.2, [1.1, 1.3]) == ""
    assert ratio_text(1.01, [0.98, 1.04]) == "1.01x [0.98, 1.04], no measurable difference"
    assert ratio_text(1.2, None) == "1.20x, no interval"


def _svr():
    path = ROOT / "benchmarks" / "search" / "search_vs_random.py"
    spec = importlib.util.spec_from_file_location("svr_under_test", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_exact_rank_test_matches_scipy() -> None:
    svr = _svr()
    a, b = [1.31, 1.22, 1.40, 1.35, 1.28], [1.05, 1.12, 1.30, 1.01, 1.09]
    p = svr.mann_whitney_exact(a, b)
    assert p == pytest.approx(8 / 252)  # U = 23 of 25: four splits as extreme on each side, twice
    assert svr.mann_whitney_exact(a, a) == 1.0
    scipy_stats = pytest.importorskip("scipy.stats")
    assert p == pytest.approx(scipy_stats.mannwhitneyu(a, b, alternative="two-sided", method="exact").pvalue)


def test_summary_cuts_runs_to_an_equal_budget() -> None:
    svr = _svr()

    def run(method: str, seed: int, ups: list[float | None]) -> dict:
        return {"landscape": "w", "method": method, "seed": seed,
                "candidates": [{"speedup": u} for u in ups]}

    runs = [run("search", 0, [1.1, 1.5, 2.0]), run("search", 1, [1.2, 1.3]),
            run("random", 0, [1.0, None]), run("random", 1, [None, None, 3.0]), run("search", 2, []),
            run("random", 2, [1.1, 1.2, 1.3])]
    s = svr.summarise(runs, ["w"], [0, 1, 2])["w"]
    assert s["candidates_per_run"] == 2 and s["dropped_runs"] == ["search seed 2"]
    assert s["search"]["best_speedup_per_seed"] == [1.5, 1.3]
    assert s["random"]["best_speedup_per_seed"] == [1.0, 0.0, 1.2]  # the 3.0 came after the shared budget
    assert s["rank_test"]["p"] is not None and "Mann-Whitney" in s["rank_test"]["method"]


def test_wall_cap_answers_unavailable_without_building() -> None:
    svr = _svr()

    class Inner:
        badge = "real"
        calls: list[str] = []

        def prebuild(self, request: EvalRequest) -> bool:
            self.calls.append("prebuild")
            return True

        def evaluate(self, request: EvalRequest, progress: object = None) -> EvalResult:
            self.calls.append("evaluate")
            return EvalResult("L3", "pass", speedup=1.1)

    inner = Inner()
    req = EvalRequest("int x;\n", "w")
    assert svr.PrebuildingEvaluator(inner, deadline=float("inf")).evaluate(req).speedup == 1.1
    assert inner.calls == ["prebuild", "evaluate"]
    late = svr.PrebuildingEvaluator(inner, deadline=0.0).evaluate(req)
    assert late.verdict == "unavailable" and late.reason == svr.WALL_CAP_REASON and inner.calls == ["prebuild",
                                                                                                  "evaluate"]


def test_seed_iterations_follow_the_timing_that_scored() -> None:
    from cuco_kit.evaluate.gpu_evaluator import seed_iterations

    seed = EvalResult("L3", "pass", iteration_ms=[1.0, 1.1],
                      timing={"score": "device", "device": {"iteration_ms": [0.5, 0.6]},
                              "end_to_end": {"iteration_ms": [1.0, 1.1]}})
    cand = EvalResult("L3", "pass", iteration_ms=[0.9, 1.0], timing={"score": "end_to_end"})
    assert seed_iterations(cand, seed) == [1.0, 1.1]
    cand.timing = {"score": "device"}
    assert seed_iterations(cand, seed) == [0.5, 0.6]
    assert seed_iterations(EvalResult("L3", "pass"), EvalResult("L3", "pass", iteration_ms=[2.0])) == [2.0]
    assert EvalResult.from_dict({"level_reached": "L3", "verdict": "pass", "timing": {"score": "device"}}).version == 2
