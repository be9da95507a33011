"""The KV-cache transfer sample: workload definition, roles through valid bytes, reference, tolerance, the
baseline's knob block and the sources' backend lines."""
from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch

from cuco_kit.errors import BadInput
from cuco_kit.evaluate.build import supported_backends
from cuco_kit.evaluate.rank.harness import rel_error
from cuco_kit.source import markers, static_check

SAMPLE = Path(__file__).resolve().parents[3] / "sample_kernels" / "kv_transfer"
TINY = {"L": 2, "S": 8, "D": 16, "KVD": 4, "PAGE": 0}
TINY_PAGED = {**TINY, "PAGE": 2}
KNOBS = {"kPlacement", "kSyncScope", "kIssuer", "kPutBlocks", "kChunkTokens", "kPutThreads", "kLoadBatch"}


# ----------------------------------------------------------------------------------------------- definition

def test_loads_with_files_and_presets(wl):
    assert wl.name == "kv_transfer"
    assert wl.params == {"L": 8, "S": 2048, "D": 4096, "KVD": 512, "PAGE": 0}
    assert [(t.name, t.role, t.dtype) for t in wl.tensors] == [
        ("h", "input", "bf16"), ("wkv", "input", "bf16"), ("page_table", "input", "i32"),
        ("kv_cache", "output", "bf16")]
    for f in [*wl.seeds.values(), wl.baseline]:
        assert wl.path(f).is_file(), f
    assert wl.seed_for("nccl").name == "seed_nccl.cu"
    assert wl.seed_for("symm").name == "seed_copy.cu"
    assert wl.baseline == "device_lsa.cu"
    assert (SAMPLE / "README.md").is_file()
    paper = wl.resolve(wl.size_presets["paper"])
    assert paper["S"] == 4096 and paper["KVD"] == 1024
    assert wl.resolve(wl.size_presets["small"])["S"] < wl.params["S"]
    assert any(p["PAGE"] > 0 for p in wl.size_presets.values())  # a paged preset exists
    for preset in wl.size_presets.values():
        p = wl.resolve(preset)  # known parameter names only
        for world in (1, 2, 4):
            for t in wl.tensors:
                t.dims(p, world)  # and sizes the kernels accept


@pytest.mark.parametrize("params", [TINY, TINY_PAGED], ids=["contiguous", "paged"])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_shapes_capacities_and_valid_bytes_per_role(wl, wl_module, params, world, tensor):
    L, S, D, KVD, PAGE = (params[k] for k in ("L", "S", "D", "KVD", "PAGE"))
    cache_shape = (L, S // PAGE, PAGE, 2 * KVD) if PAGE else (L, S, 2 * KVD)
    assert tensor(wl, "h").dims(params, world) == (S, D)
    assert tensor(wl, "wkv").dims(params, world) == (L, D, 2 * KVD)
    assert tensor(wl, "page_table").dims(params, world) == ((S // PAGE,) if PAGE else (1,))
    assert tensor(wl, "kv_cache").dims(params, world) == cache_shape
    cache_bytes = L * S * 2 * KVD * 2
    assert tensor(wl, "kv_cache").capacity_bytes(params, world) == cache_bytes  # same for both layouts
    assert wl_module.stage_bytes(params, world) == cache_bytes
    for rank in range(world):
        valid = {t.name: t.valid_bytes(params, world, rank) for t in wl.tensors}
        cap = {t.name: t.capacity_bytes(params, world) for t in wl.tensors}
        prefill, decode = rank == 0, world == 1 or rank != 0
        assert valid["h"] == (cap["h"] if prefill else 0)
        assert valid["wkv"] == (cap["wkv"] if prefill else 0)
        assert valid["kv_cache"] == (cap["kv_cache"] if decode else 0)
        assert valid["page_table"] == (cap["page_table"] if decode and PAGE else 0)
        assert all(0 <= valid[n] <= cap[n] for n in valid)


def test_flops_and_comm_bytes(wl):
    p = wl.resolve()
    assert wl.flops(p, 2) == 2.0 * 8 * 2048 * 4096 * 1024
    assert wl.flops(p, 1) == wl.flops(p, 2)  # the prefill rank's GEMMs are the same at any world size
    assert wl.comm_bytes(p, 1) == 0
    assert wl.comm_bytes(p, 2) == 8 * 2048 * 1024 * 2
    assert wl.comm_bytes(p, 4) == wl.comm_bytes(p, 2)  # per decode rank: each receives the whole KV


# ------------------------------------------------------------------------------------------------- params

@pytest.mark.parametrize(
    "change, world, needle",
    [
        ({"PAGE": 3}, 1, "S=8 is not a multiple of PAGE=3"),
        ({"PAGE": -1}, 2, "PAGE must be 0"),
        ({"KVD": 6}, 2, "KVD=6"),
        ({"D": 12}, 2, "D=12"),
        ({"L": 0}, 1, "L must be positive"),
        ({"S": -8}, 1, "S must be positive"),
        ({}, 0, "world size"),
    ],
)
def test_bad_parameters_name_what_is_wrong(wl, change, world, needle):
    params = {**TINY, **change}
    for t in wl.tensors:
        with pytest.raises(BadInput, match=re.escape(needle)):
            t.dims(params, world)


def test_missing_and_unknown_parameters_are_refused(wl, tensor):
    with pytest.raises(BadInput, match="parameter KVD is missing"):
        tensor(wl, "kv_cache").dims({k: v for k, v in TINY.items() if k != "KVD"}, 1)
    with pytest.raises(BadInput, match="'PAGES'"):
        wl.resolve({"PAGES": 16})


# ------------------------------------------------------------------------------------------------- inputs

def test_make_inputs_roles_seeding_and_page_tables(wl, inputs_for):
    p = {"L": 2, "S": 64, "D": 256, "KVD": 8, "PAGE": 4}
    a = inputs_for(wl, p, 2, seed=1, widened=True)
    b = inputs_for(wl, p, 2, seed=1, widened=True)
    c = inputs_for(wl, p, 2, seed=2, widened=True)
    raw = wl.make_inputs(p, 2, 0, torch.Generator().manual_seed(5))
    assert raw["h"].dtype == torch.bfloat16 and raw["wkv"].dtype == torch.bfloat16
    assert raw["page_table"].dtype == torch.int32
    # the prefill rank's data: finite, fan-in scaled so KV ~ N(0, 1); the decode rank's: NaN (must not be used)
    assert torch.isfinite(a[0]["h"]).all() and torch.isfinite(a[0]["wkv"]).all()
    assert a[0]["h"].std().item() == pytest.approx(1.0, rel=0.1)
    assert a[0]["wkv"].std().item() == pytest.approx(1 / math.sqrt(256), rel=0.1)
    assert torch.isnan(a[1]["h"]).all() and torch.isnan(a[1]["wkv"]).all()
    # every rank's page table is a permutation of its physical pages, its own draw, fresh per seed
    for r in range(2):
        assert sorted(a[r]["page_table"].tolist()) == list(range(16))
    assert not torch.equal(a[0]["page_table"], a[1]["page_table"])
    assert torch.equal(a[1]["page_table"], b[1]["page_table"]) and torch.equal(a[0]["h"], b[0]["h"])
    assert not torch.equal(a[1]["page_table"], c[1]["page_table"]) and not torch.equal(a[0]["h"], c[0]["h"])
    # world size 1: rank 0 plays both roles
    solo = inputs_for(wl, p, 1, seed=1, widened=True)[0]
    assert torch.isfinite(solo["h"]).all() and sorted(solo["page_table"].tolist()) == list(range(16))
    contiguous = inputs_for(wl, {**p, "PAGE": 0}, 2, widened=True)[1]
    assert contiguous["page_table"].tolist() == [0]


# ---------------------------------------------------------------------------------------------- reference

def direct_cache(h: torch.Tensor, wkv: torch.Tensor, table: torch.Tensor, params) -> torch.Tensor:
    """The decode cache built token by token with explicit sums: the definition, not the implementation."""
    L, S, D, KVD, PAGE = (params[k] for k in ("L", "S", "D", "KVD", "PAGE"))
    rows = torch.empty(L, S, 2 * KVD, dtype=torch.float64)
    for layer in range(L):
        for t in range(S):
            for j in range(2 * KVD):
                rows[layer, t, j] = sum(float(h[t, k]) * float(wkv[layer, k, j]) for k in range(D))
    if not PAGE:
        return rows
    cache = torch.full((L, S // PAGE, PAGE, 2 * KVD), math.nan, dtype=torch.float64)
    for layer in range(L):
        for t in range(S):
            cache[layer, int(table[t // PAGE]), t % PAGE] = rows[layer, t]
    assert torch.isfinite(cache).all()  # a permutation fills every physical slot
    return cache


@pytest.mark.parametrize("params", [TINY, TINY_PAGED], ids=["contiguous", "paged"])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_reference_matches_direct_computation(wl, params, world, inputs_for, tensor):
    ins = inputs_for(wl, params, world, seed=3, widened=True)
    refs = wl.reference(ins, params, world)
    assert len(refs) == world
    for r in range(world):
        ref = refs[r]["kv_cache"]
        assert ref.dtype == torch.float32
        if world > 1 and r == 0:
            assert ref.numel() == 0  # the prefill rank verifies nothing: its valid bytes are 0
            continue
        assert tuple(ref.shape) == tensor(wl, "kv_cache").dims(params, world)
        assert ref.numel() * 2 == tensor(wl, "kv_cache").valid_bytes(params, world, r)
        want = direct_cache(ins[0]["h"], ins[0]["wkv"], ins[r]["page_table"], params)
        assert torch.allclose(ref.double(), want, rtol=1e-5, atol=1e-5)
    if world == 3 and params["PAGE"]:  # decode ranks own different page tables, so their caches differ
        assert not torch.equal(refs[1]["kv_cache"], refs[2]["kv_cache"])


def test_reference_refuses_inputs_of_the_wrong_world(wl, inputs_for):
    ins = inputs_for(wl, TINY, 2, widened=True)
    with pytest.raises(BadInput, match="2 ranks for world size 3"):
        wl.reference(ins, TINY, 3)


def test_empty_reference_on_the_prefill_rank_passes_whatever_its_cache_holds(wl, inputs_for, tensor):
    ref = wl.reference(inputs_for(wl, TINY, 2, widened=True), TINY, 2)[0]["kv_cache"]
    poison = torch.full(tensor(wl, "kv_cache").dims(TINY, 2), math.nan)
    assert wl.tolerance.passes(rel_error(poison, ref))


# ---------------------------------------------------------------------------------------------- tolerance

@pytest.fixture(scope="module")
def small_case(wl, inputs_for):
    """The small paged preset at 2 ranks: the decode rank's reference and the cache a correct kernel writes
    (the fp32-accumulated GEMM rounded once to bf16, then placed by the page table)."""
    p = wl.resolve(wl.size_presets["small_paged"])
    ins = inputs_for(wl, p, 2, seed=7, widened=True)
    ref = wl.reference(ins, p, 2)[1]["kv_cache"]
    kv = (ins[0]["h"].unsqueeze(0) @ ins[0]["wkv"]).to(torch.bfloat16).float()
    L, S, KVD, PAGE = p["L"], p["S"], p["KVD"], p["PAGE"]
    good = torch.empty_like(ref)
    good[:, ins[1]["page_table"].long()] = kv.reshape(L, S // PAGE, PAGE, 2 * KVD)
    return p, ins, ref, good.to(torch.bfloat16)


def test_correct_bf16_cache_passes_with_headroom(wl, small_case):
    _, _, ref, good = small_case
    err = rel_error(good, ref)
    assert 5e-4 < err < 3e-3  # bf16 rounding of the output, as workload.py states
    assert wl.tolerance.passes(err) and err * 1.5 < wl.tolerance.rel


def test_one_stale_token_row_unwritten_bytes_and_wrong_paging_fail(wl, wl_module, small_case):
    p, ins, ref, good = small_case
    stale = good.clone()
    stale[2, 5, 3] = torch.randn(stale.shape[-1], generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    assert not wl.tolerance.passes(rel_error(stale, ref))
    unwritten = good.clone()
    unwritten[0, 0, 0, 0] = float("nan")  # the harness's poison left in one element
    assert not wl.tolerance.passes(rel_error(unwritten, ref))
    swapped = good.clone()
    swapped[:, [0, 1]] = good[:, [1, 0]]  # two physical pages exchanged
    assert not wl.tolerance.passes(rel_error(swapped, ref))
    # pushed with the prefill rank's own page table instead of the decode rank's
    kv = wl_module.layer_kv(ins[0]["h"], ins[0]["wkv"])
    own_table = wl_module.to_cache(kv, ins[0]["page_table"], p, 2)
    assert not wl.tolerance.passes(rel_error(own_table, ref))


# ------------------------------------------------------------------------------------------ kernel sources

@pytest.fixture(scope="module")
def baseline_code(wl) -> str:
    return wl.path(wl.baseline).read_text()


def test_knob_block_parses_with_every_value_allowed(baseline_code):
    knobs = {k.name: k for k in markers.knobs(baseline_code)}
    assert set(knobs) == KNOBS
    assert knobs["kPlacement"].allowed == ("Placement::kSequential", "Placement::kTwoStream", "Placement::kPull")
    assert knobs["kSyncScope"].allowed == ("SyncScope::kLayer", "SyncScope::kChunk")
    assert knobs["kIssuer"].allowed == ("Issuer::kWarp", "Issuer::kCta")
    assert all(k.value in k.allowed for k in knobs.values())
    names = [b.name for b in markers.blocks(baseline_code)]
    assert names[0] == markers.KNOB_BLOCK and "kernels" in names and "schedule" in names


def test_baseline_and_every_knob_value_pass_l0(baseline_code):
    report = static_check.check_candidate(baseline_code)
    assert report.ok, report.reasons
    for knob in markers.knobs(baseline_code):
        for value in knob.allowed:
            variant = markers.set_knobs(baseline_code, {knob.name: value})
            r = static_check.check_candidate(variant, baseline_code)
            assert r.ok, (knob.name, value, r.reasons)
            assert r.knob_values[knob.name] == value



def test_sources_declare_backends_scratch_and_no_stray_knobs(wl):
    assert supported_backends(wl.path("seed_nccl.cu").read_text()) == ("nccl", "symm")  # symm: symm_nccl/nccl.h
    assert set(supported_backends(wl.path("seed_copy.cu").read_text())) == {"nccl", "symm"}
    assert set(supported_backends(wl.path("device_lsa.cu").read_text())) == {"nccl", "symm"}
    for name in ("seed_nccl.cu", "seed_copy.cu", "device_lsa.cu"):
        code = wl.path(name).read_text()
        assert '"kv_stage"' in code, name  # the staging window every candidate declares (workload.stage_bytes)
        assert "CUCO_EXPORT int cuco_setup" in code and "CUCO_CHECK_ABI(ctx)" in code, name
        if name != "device_lsa.cu":
            assert markers.knobs(code) == [], name  # seeds carry no design space
