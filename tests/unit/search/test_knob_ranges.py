"""Numeric range knobs (`range LO..HI step S`, `pow2 LO..HI`): parsing, L0, Optuna distributions, archive
buckets."""
from __future__ import annotations

import pytest

from cuco_kit.errors import BadInput
from cuco_kit.search import archive, design_space
from cuco_kit.source import markers, static_check

CODE = """// EVOLVE-BLOCK-START knobs
constexpr int kThreads = 512;  // knob: range 128..1024 step 128
constexpr int kBatch = 4;  // knob: pow2 1..16
constexpr int kChunks = 4;  // knob: {1, 2, 4, 8}
// EVOLVE-BLOCK-END
__global__ void k() {}
"""


def test_ranges_expand_in_order_and_keep_their_spec() -> None:
    ks = {k.name: k for k in markers.knobs(CODE)}
    assert ks["kThreads"].allowed == ("128", "256", "384", "512", "640", "768", "896", "1024")
    assert ks["kThreads"].spec == "range 128..1024 step 128"
    assert ks["kBatch"].allowed == ("1", "2", "4", "8", "16") and ks["kBatch"].spec == "pow2 1..16"
    assert ks["kChunks"].range is None and ks["kChunks"].spec == "{1, 2, 4, 8}"
    assert markers.space_size(CODE) == 8 * 5 * 4
    assert markers.knobs(markers.set_knobs(CODE, {"kThreads": 1024, "kBatch": 1}))[0].value == "1024"
    with pytest.raises(BadInput, match="range 128..1024 step 128"):
        markers.set_knobs(CODE, {"kThreads": 100})


@pytest.mark.parametrize("spec, message", [
    ("range 1..10 step 4", "multiple of a step"), ("range 9..3", "LO < HI"), ("pow2 3..16", "powers of two"),
    ("range 0..100000", "coarser step"), ("pow2 1..x", "neither"),
])
def test_bad_ranges_are_one_line_problems(spec: str, message: str) -> None:
    bad = CODE.replace("pow2 1..16", spec)
    found, problems = markers.scan_knobs(bad, markers.blocks(bad))
    assert len(problems) == 1 and message in problems[0] and "kBatch" in problems[0]
    assert "kBatch" not in {k.name for k in found}


def test_l0_rejects_a_widened_range() -> None:
    child = CODE.replace("range 128..1024 step 128", "range 128..2048 step 128")
    report = static_check.check_candidate(child, CODE)
    assert not report.ok and any("kThreads" in r and "range 128..1024 step 128" in r for r in report.reasons)


def test_cells_bucket_ranges_into_three_runs() -> None:
    ks = markers.knobs(CODE)
    cells = {markers.design_cell(markers.knobs(markers.set_knobs(CODE, {"kThreads": v}))) for v in ks[0].allowed}
    assert len(cells) == markers.RANGE_CELL_BUCKETS
    assert markers.cell_value(ks[0]) == "512..768" and markers.cell_value(ks[2]) == "4"
    knobs, cell = archive.cell_of(CODE, "symm", ())
    assert knobs["kThreads"] == "512" and "kThreads=512..768" in cell


def test_optuna_distributions_round_trip_range_values() -> None:
    optuna = pytest.importorskip("optuna")
    ks = markers.knobs(CODE)
    by_name = {k.name: k for k in ks}
    dists = design_space.distributions(ks)
    assert isinstance(dists["kThreads"], optuna.distributions.IntDistribution) and dists["kThreads"].step == 128
    assert (dists["kBatch"].low, dists["kBatch"].high) == (0, 4)  # pow2: the exponent
    assert isinstance(dists["kChunks"], optuna.distributions.CategoricalDistribution)
    for values in ({"kThreads": "128", "kBatch": "16", "kChunks": "8"}, {"kThreads": "640", "kBatch": "1",
                                                                         "kChunks": "1"}):
        params = design_space.to_params(by_name, values)
        assert all(dists[n]._contains(dists[n].to_internal_repr(v)) for n, v in params.items())
        assert design_space.from_params(by_name, params) == values
