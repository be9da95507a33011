"""The attention + context-parallel sample: workload definition, reference, tolerance, the shared kernel's copies
and the baseline's knob block."""
from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch

from cuco_kit.errors import BadInput
from cuco_kit.evaluate import build
from cuco_kit.evaluate.rank.harness import rel_error
from cuco_kit.source import knob_rules, markers, static_check
from cuco_kit.workload import DTYPES

SAMPLE = Path(__file__).resolve().parents[3] / "sample_kernels" / "attention_cp"
SOURCES = ("seed_nccl.cu", "seed_copy.cu", "device_lsa.cu")


def tiny(causal: int, seq: int = 16, heads: int = 2, d: int = 32) -> dict[str, int]:
    return {"SEQ": seq, "H": heads, "D": d, "CAUSAL": causal}


def gathered(ins, name: str) -> torch.Tensor:
    return torch.cat([i[name] for i in ins], dim=0)


def emulated_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """What a correct bf16 flash kernel produces: exact logits, P rounded to bf16 before P V, bf16 output."""
    S, _, D = q.shape
    s = torch.einsum("qhd,khd->hqk", q.double(), k.double()) / math.sqrt(D)
    if causal:
        s = s.masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), -math.inf)
    p = torch.exp(s - s.amax(-1, keepdim=True))
    row_sum = p.sum(-1, keepdim=True)
    return torch.einsum("hqk,khd->qhd", p.to(torch.bfloat16).double() / row_sum, v.double()).to(torch.bfloat16)


# ------------------------------------------------------------------------------------------- the workload

def test_loads_with_files_and_presets(wl):
    assert wl.name == "attention_cp"
    assert wl.params == {"SEQ": 8192, "H": 16, "D": 64, "CAUSAL": 1}
    assert [t.name for t in wl.tensors] == ["q", "k", "v", "o"]
    assert [t.role for t in wl.tensors] == ["input", "input", "input", "output"]
    assert all(t.dtype == "bf16" for t in wl.tensors)
    for f in [*wl.seeds.values(), wl.baseline]:
        assert wl.path(f).is_file(), f
    assert wl.seed_for("nccl").name == "seed_nccl.cu"
    assert wl.seed_for("symm").name == "seed_copy.cu"
    assert wl.baseline == "device_lsa.cu"
    assert wl.size_presets["small"] == {"SEQ": 1024, "H": 4, "D": 64, "CAUSAL": 1}
    assert wl.size_presets["paper"]["SEQ"] == 8192 and wl.size_presets["paper"]["D"] == 64
    assert wl.size_presets["d128"]["D"] == 128
    assert {p["CAUSAL"] for p in wl.size_presets.values()} == {0, 1}
    for preset in wl.size_presets.values():
        p = wl.resolve(preset)  # every preset names known parameters only
        assert 1024 <= p["SEQ"] <= 8192 and p["D"] in (32, 64, 128)
        for world in (1, 2, 4):
            for t in wl.tensors:
                t.dims(p, world)  # and splits over 1, 2 and 4 ranks


@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_shapes_and_capacities_per_world_size(wl, wl_module, world):
    p = wl.resolve(wl.size_presets["small"])
    shapes = {t.name: t.dims(p, world) for t in wl.tensors}
    assert shapes == {n: (1024 // world, 4, 64) for n in ("q", "k", "v", "o")}
    for t in wl.tensors:
        assert t.capacity_bytes(p, world) == 1024 // world * 4 * 64 * DTYPES["bf16"][1]
    assert wl_module.scratch_bytes(p, world) == 1024 * 4 * 64 * 2  # the whole gathered K (or V), on every rank


def test_flops_and_comm_bytes(wl):
    full = wl.resolve({"CAUSAL": 0})
    assert wl.flops(full, 4) == 4.0 * 16 * 64 * 2048 * 8192
    assert wl.flops(full, 1) == 4 * wl.flops(full, 4)
    causal = wl.resolve()
    # causal: the last rank is the busiest; at world size 1 half the square (plus the diagonal)
    assert wl.flops(causal, 1) == 4.0 * 16 * 64 * 8192 * 8193 / 2
    assert wl.flops(full, 4) > wl.flops(causal, 4) > wl.flops(causal, 1) / 4
    assert wl.comm_bytes(causal, 1) == 0
    assert wl.comm_bytes(causal, 4) == 2 * 3 * 2048 * 16 * 64 * 2  # K and V of the 3 other ranks


@pytest.mark.parametrize(
    "params, world, needle",
    [
        ({"SEQ": 1000, "H": 4, "D": 64, "CAUSAL": 1}, 3, "SEQ=1000"),
        ({"SEQ": 1024, "H": 4, "D": 48, "CAUSAL": 1}, 2, "D=48"),
        ({"SEQ": 1024, "H": 4, "D": 256, "CAUSAL": 1}, 2, "D=256"),
        ({"SEQ": 1024, "H": 4, "D": 64, "CAUSAL": 2}, 2, "CAUSAL must be 0"),
        ({"SEQ": 1024, "H": 0, "D": 64, "CAUSAL": 1}, 1, "H must be positive"),
        ({"SEQ": 0, "H": 4, "D": 64, "CAUSAL": 1}, 1, "SEQ must be positive"),
        ({"SEQ": 1024, "H": 4, "D": 64}, 1, "CAUSAL is missing"),
        ({"SEQ": 1024, "H": 4, "D": 64, "CAUSAL": 1}, 0, "world size"),
    ],
)
def test_parameter_validation_names_the_bad_parameter(wl, params, world, needle):
    with pytest.raises(BadInput, match=re.escape(needle)):
        for t in wl.tensors:
            t.dims(params, world)


def test_unknown_parameter_is_refused(wl):
    with pytest.raises(BadInput, match="'S'"):
        wl.resolve({"S": 4})


def test_make_inputs_bf16_unit_normal_and_seeded(wl, inputs_for):
    p = tiny(1, seq=256, heads=4, d=64)
    a = inputs_for(wl, p, 2, seed=1)
    b = inputs_for(wl, p, 2, seed=1)
    c = inputs_for(wl, p, 2, seed=2)
    for name in ("q", "k", "v"):
        assert a[0][name].dtype == torch.bfloat16 and tuple(a[1][name].shape) == (128, 4, 64)
        assert torch.equal(a[0][name], b[0][name]) and not torch.equal(a[0][name], c[0][name])
        assert not torch.equal(a[0][name], a[1][name])  # ranks draw different shards
        assert a[0][name].float().std().item() == pytest.approx(1.0, rel=0.1)
    assert not torch.equal(a[0]["q"], a[0]["k"])  # q, k, v are independent draws


# -------------------------------------------------------------------------------------------- reference

def direct_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """softmax(Q K^T / sqrt(D)) V per head in float64, row by row, with explicit masking: the definition."""
    S, H, D = q.shape
    out = torch.empty(S, H, D, dtype=torch.float64)
    for h in range(H):
        for i in range(S):
            keys = range(i + 1) if causal else range(S)
            logits = torch.tensor([float(q[i, h].double() @ k[j, h].double()) / math.sqrt(D) for j in keys],
                                  dtype=torch.float64)
            w = torch.softmax(logits, dim=0)
            out[i, h] = sum(w[n] * v[j, h].double() for n, j in enumerate(keys))
    return out


@pytest.mark.parametrize("causal", [0, 1])
@pytest.mark.parametrize("world", [1, 2, 4])
def test_reference_matches_direct_softmax(wl, causal, world, inputs_for):
    p = tiny(causal)
    ins = inputs_for(wl, p, world, seed=3)
    ref = wl.reference(ins, p, world)
    assert len(ref) == world
    want = direct_attention(gathered(ins, "q"), gathered(ins, "k"), gathered(ins, "v"), bool(causal))
    Sr = 16 // world
    for r in range(world):
        o = ref[r]["o"]
        assert tuple(o.shape) == (Sr, 2, 32) and o.dtype == torch.float32
        torch.testing.assert_close(o.double(), want[r * Sr:(r + 1) * Sr], rtol=1e-5, atol=1e-5)


def test_causal_and_full_differ_and_causal_uses_global_positions(wl, inputs_for):
    ins = inputs_for(wl, tiny(1), 2, seed=4)
    causal = wl.reference(ins, tiny(1), 2)
    full = wl.reference(ins, tiny(0), 2)
    # Rank 1's queries (global 8..15) see rank 0's keys too: not the causal attention of its shard alone.
    alone = wl.reference([ins[1]], tiny(1, seq=8), 1)[0]["o"]
    assert not torch.allclose(causal[1]["o"], alone, atol=1e-3)
    assert not torch.allclose(causal[0]["o"], full[0]["o"], atol=1e-3)
    # The first token attends to itself only: its output is its own v.
    torch.testing.assert_close(causal[0]["o"][0], ins[0]["v"][0].float(), rtol=1e-5, atol=1e-5)


def test_block_results_merged_by_log_sum_exp_equal_the_reference(wl, inputs_for):
    """The merge the kernels rely on: attention over K/V blocks processed separately (local block first), merged
    with O = sum_b exp(lse_b - lse) O_b, equals attention over the gathered sequence, causal included."""
    world = 4
    p = tiny(1)
    ins = inputs_for(wl, p, world, seed=6)
    ref = wl.reference(ins, p, world)
    Sr, r = 4, 2
    q = ins[r]["q"].double()
    outs, lses = [], []
    for src in [r] + [s for s in range(world) if s != r]:
        k, v = ins[src]["k"].double(), ins[src]["v"].double()
        s = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(32)
        qpos = torch.arange(r * Sr, (r + 1) * Sr)[:, None]
        kpos = torch.arange(src * Sr, (src + 1) * Sr)[None, :]
        s = s.masked_fill(kpos > qpos, -math.inf)
        lse = torch.logsumexp(s, dim=-1)  # [H, Sq]; -inf where the whole block is masked
        w = torch.exp(s - torch.where(torch.isinf(lse), 0.0, lse)[..., None])
        outs.append(torch.einsum("hqk,khd->qhd", w, v))
        lses.append(lse)
    total = torch.logsumexp(torch.stack(lses), dim=0)
    merged = sum(torch.exp(part - total).permute(1, 0)[..., None] * o for o, part in zip(outs, lses))
    torch.testing.assert_close(merged, ref[r]["o"].double(), rtol=1e-5, atol=1e-5)


def test_reference_refuses_wrong_rank_count_and_shapes(wl, inputs_for):
    ins = inputs_for(wl, tiny(1), 2)
    with pytest.raises(BadInput, match="2 ranks"):
        wl.reference(ins, tiny(1), 4)
    with pytest.raises(BadInput, match="gathered q"):
        wl.reference(ins, tiny(1, seq=32), 2)


@pytest.mark.parametrize("causal", [0, 1])
def test_tolerance_passes_bf16_kernel_and_fails_real_bugs(wl, causal, inputs_for):
    world = 4
    p = wl.resolve({**wl.size_presets["small"], "CAUSAL": causal})
    ins = inputs_for(wl, p, world, seed=5)
    ref = wl.reference(ins, p, world)
    q, k, v = (gathered(ins, n) for n in ("q", "k", "v"))
    good = emulated_kernel(q, k, v, bool(causal))
    Sr = p["SEQ"] // world
    for r in range(world):
        err = rel_error(good[r * Sr:(r + 1) * Sr], ref[r]["o"])
        assert 1e-3 < err < wl.tolerance.rel / 2, err  # the documented ~2.2e-3
        assert wl.tolerance.passes(err)
    # rank 3 (the one that needs every block, causally too)
    mine = slice(3 * Sr, 4 * Sr)
    want = ref[3]["o"]
    one_row = good[mine].clone()
    one_row[100, 2] = 0
    assert not wl.tolerance.passes(rel_error(one_row, want))
    # one 64-token K/V chunk of rank 0 stale (previous step's data) or never arrived (zeros)
    g = torch.Generator().manual_seed(11)
    for fill in ("stale", "zeros"):
        k2, v2 = k.clone(), v.clone()
        if fill == "stale":
            k2[64:128] = torch.randn(64, 4, 64, generator=g).to(k2)
            v2[64:128] = torch.randn(64, 4, 64, generator=g).to(v2)
        else:
            k2[64:128] = 0
            v2[64:128] = 0
        bad = emulated_kernel(q, k2, v2, bool(causal))[mine]
        assert not wl.tolerance.passes(rel_error(bad, want)), fill
    nan = good[mine].clone()
    nan[3, 1, 4] = float("nan")
    assert not wl.tolerance.passes(rel_error(nan, want))


# ---------------------------------------------------------------------------------------- the .cu files

def _code(name: str) -> str:
    return (SAMPLE / name).read_text()


EXPECTED_KNOBS = {
    "kPlacement": ("Placement::kSequential", "Placement::kOverlapped"),
    "kSync": ("Sync::kBarrier", "Sync::kChunkFlags"),
    "kIssuer": ("Issuer::kWarp", "Issuer::kCta"),
    "kChunks": ("1", "2", "4"),
    "kWaitMode": ("WaitMode::kInKernel", "WaitMode::kWaitKernel"),
}


# The put kernel's and the attention kernel's tuning: range knobs, at the values the seeds and the
# recordings use.
EXPECTED_TUNING = {
    "kPutThreads": ("range 128..1024 step 128", "256"), "kLoadBatch": ("pow2 1..16", "4"),
    "kAttnWarps": ("pow2 1..8", "4"), "kAttnMinCtas": ("range 1..4", "1"), "kAttnPrefetchK": ("range 0..1", "0"),
    **{f"kAttnMTiles{d}": ("range 1..2", m) for d, m in (("32", "1"), ("64", "2"), ("128", "1"))},
    **{f"kAttnBlockK{d}": ("range 16..128 step 16", n) for d, n in (("32", "128"), ("64", "64"), ("128", "64"))},
}


def test_baseline_knob_block_parses():
    knobs = {k.name: k for k in markers.knobs(_code("device_lsa.cu"))}
    assert {n: k.allowed for n, k in knobs.items() if n in EXPECTED_KNOBS} == EXPECTED_KNOBS
    assert {n: (k.spec, k.value) for n, k in knobs.items() if n not in EXPECTED_KNOBS} == EXPECTED_TUNING
    for k in knobs.values():
        assert k.value in k.allowed


@pytest.mark.parametrize("name", SOURCES)
def test_sample_sources_pass_l0(name):
    code = _code(name)
    report = static_check.check_candidate(code, code)
    assert report.ok, report.reasons


def test_baseline_has_mutable_blocks_besides_knobs():
    names = [b.name for b in markers.blocks(_code("device_lsa.cu"))]
    assert names[0] == "knobs"
    assert {"tuning", "put_kernel", "launch_shape", "schedule"} <= set(names)


def test_every_knob_value_is_an_l0_valid_child_where_the_rules_hold():
    # L0 judges each knob line on its own (and the rules on the whole point), so every value once, the others at
    # their defaults, plus the all-non-default design corner covers the 48 designs without parsing the file 48
    # times (the compile tier builds corners of the space). A value whose point breaks a rule is refused.
    parent = _code("device_lsa.cu")
    knobs, rules = markers.knobs(parent), knob_rules.rules(parent)
    default = {k.name: k.value for k in knobs}
    points = [{**default, k.name: v} for k in knobs for v in k.allowed]
    points.append({**default, **{name: next(v for v in allowed if v != default[name])
                                 for name, allowed in EXPECTED_KNOBS.items()}})
    assert math.prod(len(a) for a in EXPECTED_KNOBS.values()) == 48
    refused = 0
    for values in points:
        report = static_check.check_candidate(markers.set_knobs(parent, values), parent)
        assert report.ok == knob_rules.is_valid(rules, values), (values, report.reasons)
        assert report.knob_values == values
        refused += not report.ok
    assert refused  # some single moves break a rule: 16 keys under a 64-row Q tile, say


def test_the_tile_rules_are_the_kernels_static_assert():
    # The Q tile (warps x 16 x m-tiles rows) is staged through 2 x keys rows of K and V buffers (the kernel's
    # static_assert); one rule per head dim, each reading only its own tile knobs and the warps.
    rules = knob_rules.rules(_code("device_lsa.cu"))
    assert [r.names for r in rules] == [("kAttnWarps", f"kAttnMTiles{d}", f"kAttnBlockK{d}") for d in (32, 64, 128)]
    default = {k.name: k.value for k in markers.knobs(_code("device_lsa.cu"))}
    assert knob_rules.is_valid(rules, {**default, "kAttnWarps": "4", "kAttnBlockK64": "64"})  # 4 x 16 x 2 = 128
    assert not knob_rules.is_valid(rules, {**default, "kAttnWarps": "8", "kAttnBlockK64": "64"})
    assert knob_rules.is_valid(rules, {**default, "kAttnWarps": "8", "kAttnBlockK64": "128"})


def test_bad_knob_value_is_refused():
    with pytest.raises(BadInput, match="kChunks"):
        markers.set_knobs(_code("device_lsa.cu"), {"kChunks": "8"})


def test_backend_declarations():
    assert build.supported_backends(_code("seed_nccl.cu")) == ("nccl", "symm")  # symm: runtime/symm_nccl/nccl.h
    assert set(build.supported_backends(_code("seed_copy.cu"))) == {"nccl", "symm"}
    assert set(build.supported_backends(_code("device_lsa.cu"))) == {"nccl", "symm"}


@pytest.mark.parametrize("name", SOURCES)
def test_sources_declare_the_gathered_kv_scratch(name):
    code = _code(name)
    assert "cuco_declare_scratch" in code and '"kg"' in code and '"vg"' in code


@pytest.mark.parametrize("name", SOURCES)
def test_each_source_includes_the_shared_kernel_outside_every_block(wl_module, name):
    code = _code(name)
    line = next(i for i, text in enumerate(code.split("\n"), 1) if text.startswith('#include "attention_kernel.cuh"'))
    assert all(not (b.start_line <= line <= b.end_line) for b in markers.blocks(code))  # frozen library code


def test_build_puts_the_workload_headers_on_the_path_and_in_the_key(wl_module):
    cfg = build.for_workload(build.BuildConfig(nvcc="nvcc"), SAMPLE)
    assert cfg.workload_include == SAMPLE.resolve() and SAMPLE.resolve() in cfg.include_dirs()
    plain = build.for_workload(build.BuildConfig(nvcc="nvcc"), SAMPLE.parent / "allgather")
    assert plain.workload_include is None  # no *.cuh there: command and cache key unchanged
    k1 = build._headers_digest(cfg)
    assert k1 != build._headers_digest(plain)  # the header's bytes are part of the key


def test_kernel_is_a_tensor_core_flash_kernel(wl_module):
    header = (SAMPLE / "attention_kernel.cuh").read_text()
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in header
    assert "ldmatrix.sync.aligned.m8n8.x4.trans" in header and "cp.async" in header
    for d in wl_module.HEAD_DIMS:
        assert f"case {d}: return launch_default<{d}>" in header
