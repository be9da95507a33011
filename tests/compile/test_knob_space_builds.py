"""Compile tier: every sample candidate (the files a search starts from, tests/unit/workloads/test_knob_spaces.py)
builds at corners of its knob space, and not past its knob rules.

Per candidate, for the first backend it declares (nccl: the real NCCL device API): the default (the file itself),
the valid point with the smallest values, the one with the largest (knob_rules.corner: each knob at its first /
last value as far as the rules allow) and a seeded random valid point. The ends of the ranges are where register,
shared-memory and launch-bound limits bite first (ptxas refuses more than the 227 KiB of shared memory a CTA may
have on sm_90). Each must build.

Then, for every knob rule, a point that breaks that rule and no other must not build: the samples' rules are the
attention kernel's static_assert, so a rule that stopped matching its limit shows here. (A rule for a limit that
only a launch shows would need the gpu tier.)
"""
from __future__ import annotations

import random
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from cuco_kit.evaluate import build as B
from cuco_kit.source import knob_rules, markers
from tests.unit.workloads.test_knob_spaces import CANDIDATES, past

ROOT = Path(__file__).resolve().parents[2]
MAX_WORKERS = 2  # CI machines have two cores
BUDGET_S = 6 * 60  # this module's share of the compile tier's 15 minutes

pytestmark = pytest.mark.timeout(BUDGET_S + 60)


def _points(path: Path) -> dict[str, dict[str, str]]:
    code = path.read_text()
    knobs, rules = markers.knobs(code), knob_rules.rules(code)
    points: dict[str, dict[str, str] | None] = {
        "default": {k.name: k.value for k in knobs},
        "smallest": knob_rules.corner(knobs, rules),
        "largest": knob_rules.corner(knobs, rules, largest=True),
        "random": knob_rules.sample(knobs, rules, random.Random(zlib.crc32(path.name.encode()))),
    }
    for i, rule in enumerate(rules):
        points[f"past rule {i + 1}"] = past(knobs, rules, rule)
    missing = [name for name, p in points.items() if p is None]
    assert not missing, f"{path.name}: no {missing} point"
    return {name: p for name, p in points.items() if p is not None}


CASES = [(path, name) for path in CANDIDATES for name in _points(path)]


def _case_id(case: tuple[Path, str]) -> str:
    return f"{case[0].parent.name}/{case[0].name}[{case[1]}]"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, toolchain: B.BuildConfig) -> dict:
    cfg = toolchain
    cache = tmp_path_factory.mktemp("knob_space_builds")
    jobs = {}
    for path in CANDIDATES:
        code = path.read_text()
        backend = B.supported_backends(code)[0]
        for name, point in _points(path).items():
            jobs[(path, name)] = (markers.set_knobs(code, point), backend, B.for_workload(cfg, path.parent), point)
    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=MAX_WORKERS) as pool:
        futures = {case: pool.submit(B.build, src, backend, c, cache)
                   for case, (src, backend, c, _) in jobs.items()}
        results = {case: f.result() for case, f in futures.items()}
    return {"results": results, "points": {case: job[3] for case, job in jobs.items()},
            "wall_s": time.monotonic() - t0}


@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_corners_build_and_a_point_past_a_rule_does_not(built: dict, case: tuple[Path, str]) -> None:
    res, point = built["results"][case], built["points"][case]
    if case[1].startswith("past rule"):
        assert not res.ok, f"{_case_id(case)} builds although it breaks a knob rule: {point}"
        assert "error" in res.log, res.log[-2000:]  # the static_assert names the limit
    else:
        assert res.ok, f"{_case_id(case)} at {point} failed to build:\n{res.log[-4000:]}"


def test_knob_space_build_time(built: dict, capsys: pytest.CaptureFixture[str]) -> None:
    rows = sorted(((r.seconds, r.cached, _case_id(c)) for c, r in built["results"].items()), reverse=True)
    with capsys.disabled():
        print(f"\nknob space builds: {len(rows)} on {MAX_WORKERS} workers in {built['wall_s']:.1f} s wall")
        for secs, cached, name in rows:
            print(f"  {secs:6.1f} s  {name}{'  (cached)' if cached else ''}")
    assert built["wall_s"] < BUDGET_S
