"""The GEMM + AllGather sample: workload definition, reference, tolerance and the baseline's knob block."""
from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch

from cuco_kit.errors import BadInput
from cuco_kit.evaluate.rank.harness import rel_error
from cuco_kit.source import markers, static_check
from cuco_kit.workload import DTYPES

SAMPLE = Path(__file__).resolve().parents[3] / "sample_kernels" / "gemm_allgather"
TINY = {"M": 16, "N": 8, "K": 16}


def test_loads_with_files_and_presets(wl):
    assert wl.name == "gemm_allgather"
    assert wl.params == {"M": 8192, "N": 8192, "K": 8192}
    assert [t.name for t in wl.tensors] == ["x", "w", "y"]
    assert [t.role for t in wl.tensors] == ["input", "input", "output"]
    assert all(t.dtype == "bf16" for t in wl.tensors)
    for f in [*wl.seeds.values(), wl.baseline]:
        assert wl.path(f).is_file(), f
    assert wl.seed_for("nccl").name == "seed_nccl.cu"
    assert wl.seed_for("symm").name == "seed_copy.cu"
    assert wl.size_presets["small"] == {"M": 1024, "N": 1024, "K": 1024}
    assert set(wl.size_presets) == {"small", "4096", "8192"}
    for preset in wl.size_presets.values():
        wl.resolve(preset)  # every preset names known parameters only


@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_shapes_and_capacities_per_world_size(wl, wl_module, world):
    p = wl.resolve(wl.size_presets["small"])
    shapes = {t.name: t.dims(p, world) for t in wl.tensors}
    assert shapes == {"x": (1024 // world, 1024), "w": (1024, 1024 // world), "y": (1024, 1024 // world)}
    caps = {t.name: t.capacity_bytes(p, world) for t in wl.tensors}
    assert caps["x"] == 1024 * 1024 * 2 // world
    assert caps["w"] == caps["x"] and caps["y"] == 1024 * 1024 * 2 // world
    assert wl_module.scratch_bytes(p, world) == 1024 * 1024 * 2  # the whole gathered X, on every rank


def test_flops_and_comm_bytes(wl):
    p = wl.resolve()
    assert wl.flops(p, 4) == 2.0 * 8192 * 8192 * 2048
    assert wl.flops(p, 1) == 4 * wl.flops(p, 4)
    assert wl.comm_bytes(p, 1) == 0
    assert wl.comm_bytes(p, 4) == 3 * 2048 * 8192 * DTYPES["bf16"][1]


@pytest.mark.parametrize(
    "params, world, needle",
    [
        ({"M": 1000, "N": 1024, "K": 1024}, 3, "M=1000"),
        ({"M": 1024, "N": 1000, "K": 1024}, 16, "N=1000"),
        ({"M": 1024, "N": 1024, "K": 1020}, 2, "K=1020"),
        ({"M": 0, "N": 1024, "K": 1024}, 1, "M must be positive"),
        ({"M": 1024, "N": 1024, "K": 1024}, 0, "world size"),
    ],
)
def test_parameter_validation_names_the_bad_parameter(wl, params, world, needle):
    with pytest.raises(BadInput, match=re.escape(needle)):
        for t in wl.tensors:
            t.dims(params, world)


def test_unknown_parameter_is_refused(wl):
    with pytest.raises(BadInput, match="'Q'"):
        wl.resolve({"Q": 4})


def test_make_inputs_bf16_scaled_and_seeded(wl, inputs_for):
    p = {"M": 64, "N": 64, "K": 256}
    a = inputs_for(wl, p, 2, seed=1)
    b = inputs_for(wl, p, 2, seed=1)
    c = inputs_for(wl, p, 2, seed=2)
    assert a[0]["x"].dtype == torch.bfloat16 and a[0]["w"].dtype == torch.bfloat16
    assert tuple(a[1]["x"].shape) == (32, 256) and tuple(a[1]["w"].shape) == (256, 32)
    assert torch.equal(a[0]["x"], b[0]["x"]) and torch.equal(a[1]["w"], b[1]["w"])
    assert not torch.equal(a[0]["x"], c[0]["x"])
    assert not torch.equal(a[0]["x"], a[1]["x"])  # ranks draw different shards
    # w ~ N(0, 1/K) so Y ~ N(0, 1) whatever K is
    assert a[0]["w"].float().std().item() == pytest.approx(1 / math.sqrt(256), rel=0.1)
    assert a[0]["x"].float().std().item() == pytest.approx(1.0, rel=0.1)


def test_reference_matches_direct_computation(wl, inputs_for):
    world = 2
    ins = inputs_for(wl, TINY, world, seed=3)
    ref = wl.reference(ins, TINY, world)
    assert len(ref) == world
    M, K = TINY["M"], TINY["K"]
    for r in range(world):
        y = ref[r]["y"]
        assert tuple(y.shape) == (M, TINY["N"] // world) and y.dtype == torch.float32
        # element by element: row i of X lives on rank i // (M/W), row i % (M/W)
        rows = M // world
        for i in (0, rows - 1, rows, M - 1):
            xrow = ins[i // rows]["x"][i % rows].double()
            for j in range(y.shape[1]):
                want = sum(float(xrow[k]) * float(ins[r]["w"][k, j]) for k in range(K))
                assert float(y[i, j]) == pytest.approx(want, rel=1e-6, abs=1e-6)


def test_reference_refuses_wrong_rank_count(wl, inputs_for):
    ins = inputs_for(wl, TINY, 2)
    with pytest.raises(BadInput, match="2 ranks"):
        wl.reference(ins, TINY, 4)


def test_tolerance_passes_bf16_rounding_and_fails_one_bad_row(wl, inputs_for):
    # The documented figure: a correct kernel (fp32 accumulation, bf16 output) lands near 2e-3.
    p = {"M": 1024, "N": 128, "K": 256}
    world = 2
    ins = inputs_for(wl, p, world, seed=5)
    ref = wl.reference(ins, p, world)[0]["y"]
    xg = torch.cat([i["x"].float() for i in ins])
    good = (xg @ ins[0]["w"].float()).to(torch.bfloat16)
    err = rel_error(good, ref)
    assert 5e-4 < err < wl.tolerance.rel / 2
    assert wl.tolerance.passes(err)
    # One row of Y (1/1024 of the output) zeroed or computed from stale data must fail.
    zero_row = good.clone()
    zero_row[700] = 0
    assert not wl.tolerance.passes(rel_error(zero_row, ref))
    stale = good.clone()
    stale[700] = (torch.randn(256, generator=torch.Generator().manual_seed(9)) @ ins[0]["w"].float()).to(stale)
    assert not wl.tolerance.passes(rel_error(stale, ref))
    nan = good.clone()
    nan[3, 4] = float("nan")
    assert not wl.tolerance.passes(rel_error(nan, ref))


# ---------------------------------------------------------------------------------------- the .cu files

def _code(name: str) -> str:
    return (SAMPLE / name).read_text()


EXPECTED_KNOBS = {
    "kPlacement": ("Placement::kSequential", "Placement::kTwoStream", "Placement::kPersistent"),
    "kSync": ("Sync::kBarrier", "Sync::kChunkFlags"),
    "kIssuer": ("Issuer::kThread", "Issuer::kWarp", "Issuer::kCta"),
    "kChunks": ("1", "2", "4", "8"),
}


def test_baseline_knob_block_parses():
    knobs = {k.name: k for k in markers.knobs(_code("device_lsa.cu"))}
    assert {n: k.allowed for n, k in knobs.items()} == EXPECTED_KNOBS
    for k in knobs.values():
        assert k.value in k.allowed


@pytest.mark.parametrize("name", ["device_lsa.cu", "seed_nccl.cu", "seed_copy.cu"])
def test_sample_sources_pass_l0(name):
    code = _code(name)
    report = static_check.check_candidate(code, code)
    assert report.ok, report.reasons


def test_baseline_has_mutable_blocks_besides_knobs():
    names = [b.name for b in markers.blocks(_code("device_lsa.cu"))]
    assert names[0] == "knobs"
    assert {"put_kernel", "schedule"} <= set(names)


def test_every_knob_combination_is_an_l0_valid_child():
    parent = _code("device_lsa.cu")
    space = markers.knob_space(parent)
    assert len(space) == 3 * 2 * 3 * 4
    for values in space:
        child = markers.set_knobs(parent, values)
        report = static_check.check_candidate(child, parent)
        assert report.ok, (values, report.reasons)
        assert report.knob_values == values


def test_backend_declarations():
    build = pytest.importorskip("cuco_kit.evaluate.build")
    assert build.supported_backends(_code("seed_nccl.cu")) == ("nccl", "symm")  # symm: runtime/symm_nccl/nccl.h
    assert set(build.supported_backends(_code("seed_copy.cu"))) == {"nccl", "symm"}
    assert set(build.supported_backends(_code("device_lsa.cu"))) == {"nccl", "symm"}


@pytest.mark.parametrize("name", ["device_lsa.cu", "seed_nccl.cu", "seed_copy.cu"])
def test_sources_declare_the_xg_scratch(name):
    code = _code(name)
    assert "cuco_declare_scratch" in code and '"xg"' in code
