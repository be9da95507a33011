"""Every sample's design space: the search's starting files (each workload's baseline and GIN baseline, found from
the folders under sample_kernels/) have at least MIN_VALID points that keep their knob rules (HELD_BACK: those
below it on purpose, and why), their defaults are among them, and a point that breaks a rule is refused by L0 with
the rule's text. The compile tier builds corners
of these spaces (tests/compile/test_knob_space_builds.py)."""
from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from cuco_kit.source import knob_rules, markers, static_check
from cuco_kit.workload import load_workload

ROOT = Path(__file__).resolve().parents[3]
SAMPLES = ROOT / "sample_kernels"
MIN_VALID = 1000  # the bar of a space worth searching
# Spaces below the bar on purpose, and why. The one test that covers them checks they are still below it, so the
# list cannot outlive its reason; every other check covers them as it covers the rest.
HELD_BACK = {
    "gemm_allgather/device_lsa.cu": "the committed recordings (recordings/) replay this exact source; its range knobs "
                                    "(2,880 points, a reverted commit in the history) land when it is recorded again",
}


def candidate_files() -> list[Path]:
    """Every file a search of a sample starts from: each workload folder's baseline and GIN baseline."""
    out: list[Path] = []
    for folder in sorted(p for p in SAMPLES.iterdir() if (p / "workload.py").is_file()):
        wl = load_workload(folder)
        out += [folder / name for name in (wl.baseline, wl.gin_baseline) if name]
    return out


CANDIDATES = candidate_files()
IDS = [f"{p.parent.name}/{p.name}" for p in CANDIDATES]


def test_every_sample_has_candidates() -> None:
    folders = {p.parent for p in CANDIDATES}
    assert folders == {p for p in SAMPLES.iterdir() if (p / "workload.py").is_file()}
    with_knobs = {p for p in SAMPLES.glob("*/*.cu") if "EVOLVE-BLOCK-START knobs" in p.read_text()}
    assert set(CANDIDATES) == with_knobs  # no knob block outside the files a search starts from, none missing


@pytest.mark.parametrize("path", CANDIDATES, ids=IDS)
def test_space_has_enough_valid_points_and_the_default_is_one(path: Path) -> None:
    code = path.read_text()
    count = knob_rules.count_valid(code)
    print(f"{path.parent.name}/{path.name}: {count.valid:,} valid of {count.total:,}" if count.valid is not None
          else count.note)
    assert count.valid is not None, count.note
    held = HELD_BACK.get(f"{path.parent.name}/{path.name}")
    if held:
        assert count.valid < MIN_VALID, f"{path.name} has {count.valid} points: take it off HELD_BACK"
    else:
        assert count.valid >= MIN_VALID, f"{path.name}: {count.valid} valid points of {count.total}"
    assert count.valid <= count.total
    knobs = markers.knobs(code)
    assert knob_rules.violated(knob_rules.rules(code), {k.name: k.value for k in knobs}) == []
    report = static_check.check_candidate(code, code)
    assert report.ok, report.reasons
    assert report.rules == [r.text for r in knob_rules.rules(code)]


@pytest.mark.parametrize("path", CANDIDATES, ids=IDS)
def test_the_count_agrees_with_sampling(path: Path) -> None:
    # The count walks only rule-linked knobs; uniform draws over the whole product land on valid points at the
    # same rate (within 5 sigma of 4000 draws), so the shortcut cannot have dropped or invented points.
    code = path.read_text()
    knobs, rules = markers.knobs(code), knob_rules.rules(code)
    count = knob_rules.count_valid(code)
    assert count.valid is not None
    rng = random.Random(path.name)
    n = 4000
    hits = sum(knob_rules.is_valid(rules, {k.name: rng.choice(k.allowed) for k in knobs}) for _ in range(n))
    p = count.valid / count.total
    assert abs(hits / n - p) <= 5 * (p * (1 - p) / n) ** 0.5 + 1e-9, (hits / n, p)


@pytest.mark.parametrize("path", [p for p in CANDIDATES if "knob-rule:" in p.read_text()],
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_point_past_each_rule_is_refused_by_l0_naming_the_rule(path: Path) -> None:
    code = path.read_text()
    knobs, rules = markers.knobs(code), knob_rules.rules(code)
    for rule in rules:
        point = past(knobs, rules, rule)
        assert point is not None, f"no point breaks only {rule.text!r}"
        report = static_check.check_candidate(markers.set_knobs(code, point), code)
        assert not report.ok
        assert [r for r in report.reasons if "knob rule" in r] == [rule.describe(point)]


def past(knobs: list[markers.Knob], rules: list[knob_rules.Rule], rule: knob_rules.Rule) -> dict[str, str] | None:
    """A point that breaks `rule` and no other: the default with one knob moved if one does it, else two, else a
    seeded random draw."""
    default = {k.name: k.value for k in knobs}

    def only(point: dict[str, str]) -> bool:
        return [r for r in rules if not r.holds(point)] == [rule]

    mine = [k for k in knobs if k.name in rule.names]
    for k in mine:
        for v in k.allowed:
            if only({**default, k.name: v}):
                return {**default, k.name: v}
    for a in mine:
        for b in mine:
            for va in a.allowed:
                for vb in b.allowed:
                    if a.name < b.name and only({**default, a.name: va, b.name: vb}):
                        return {**default, a.name: va, b.name: vb}
    rng = random.Random(rule.text)
    for _ in range(20000):
        point = {k.name: rng.choice(k.allowed) for k in knobs}
        if only(point):
            return point
    return None


def test_attention_tile_defaults_are_the_kernels_tuned_shapes() -> None:
    # device_lsa.cu's per-head-dim tile knobs start at attn::TileShape<D>, the shapes the seeds run: a retuned
    # TileShape (benchmarks/attention_cp/tile_shapes.py --apply) must move these defaults along.
    header = (SAMPLES / "attention_cp" / "attention_kernel.cuh").read_text()
    values = {k.name: k.value for k in markers.knobs((SAMPLES / "attention_cp" / "device_lsa.cu").read_text())}
    shapes = re.findall(r"struct TileShape<(\d+)> : TileConfig<(\d+), (\d+), (true|false), (\d+)(?:, (\d+))?>",
                        header)
    assert {d for d, *_ in shapes} == {"32", "64", "128"}
    for d, m_tiles, block_k, prefetch, min_ctas, warps in shapes:
        assert values[f"kAttnMTiles{d}"] == m_tiles and values[f"kAttnBlockK{d}"] == block_k, d
        assert values["kAttnPrefetchK"] == str(int(prefetch == "true")) and values["kAttnMinCtas"] == min_ctas, d
        assert values["kAttnWarps"] == (warps or re.search(r"constexpr int kWarps = (\d+);", header).group(1)), d
