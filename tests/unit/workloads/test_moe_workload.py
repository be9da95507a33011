"""The MoE dispatch -> experts -> combine sample: workload definition, uneven tokens through valid bytes, routing
skew, reference against a direct computation, tolerance, the baseline's knob block and the sources' headers."""
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

SAMPLE = Path(__file__).resolve().parents[3] / "sample_kernels" / "moe_dispatch_combine"
TINY = {"T": 6, "H": 8, "I": 8, "E": 4, "K": 2, "SKEW": 100}
KNOBS = {"kPlacement", "kSyncScope", "kIssuer", "kCombine", "kPutBlocks", "kChunkRows"}
SCRATCH = ("send", "recv", "out", "ret", "counts")


# ----------------------------------------------------------------------------------------------- definition

def test_loads_with_files_presets_and_dsv3_shapes(wl):
    assert wl.name == "moe_dispatch_combine"
    assert wl.params == {"T": 4096, "H": 7168, "I": 2048, "E": 256, "K": 8, "SKEW": 100, "FP8": 0}
    assert [(t.name, t.role, t.dtype) for t in wl.tensors] == [
        ("x", "input", "bf16"), ("topk_idx", "input", "i32"), ("topk_w", "input", "f32"),
        ("w_gate_up", "input", "bf16"), ("w_down", "input", "bf16"), ("y", "output", "bf16")]
    for f in [*wl.seeds.values(), wl.baseline]:
        assert wl.path(f).is_file(), f
    assert wl.seed_for("nccl").name == "seed_nccl.cu" and wl.seed_for("symm").name == "seed_copy.cu"
    assert (SAMPLE / "README.md").is_file()
    small = wl.resolve(wl.size_presets["small"])
    assert (small["H"], small["I"], small["T"], small["E"], small["K"]) == (1024, 512, 256, 8, 2)
    dsv3 = wl.resolve(wl.size_presets["dsv3"])
    assert (dsv3["H"], dsv3["I"], dsv3["T"], dsv3["K"]) == (7168, 2048, 4096, 8)
    assert any(p.get("SKEW", 100) >= 500 for p in wl.size_presets.values())
    for preset in wl.size_presets.values():
        p = wl.resolve(preset)
        for world in (1, 2, 4):
            for t in wl.tensors:
                t.dims(p, world)
                if t.valid_bytes is not None:
                    assert 0 < t.valid_bytes(p, world, world - 1) <= t.capacity_bytes(p, world)


@pytest.mark.parametrize("world", [1, 2, 4])
def test_shapes_capacities_and_valid_bytes_per_rank(wl, wl_module, world, tensor):
    p = {**TINY, "E": 8, "T": 16}
    T, H, inter, E, K = (p[n] for n in ("T", "H", "I", "E", "K"))
    EL = E // world
    assert tensor(wl, "x").dims(p, world) == (T, H)
    assert tensor(wl, "topk_idx").dims(p, world) == (T, K)
    assert tensor(wl, "topk_w").dims(p, world) == (T, K)
    assert tensor(wl, "w_gate_up").dims(p, world) == (EL, H, 2 * inter)
    assert tensor(wl, "w_down").dims(p, world) == (EL, inter, H)
    assert tensor(wl, "y").dims(p, world) == (T, H)
    assert tensor(wl, "y").capacity_bytes(p, world) == T * H * 2
    seen = []
    for r in range(world):
        Tr = wl_module.valid_tokens(p, world, r)
        seen.append(Tr)
        assert T // 2 < Tr <= T
        assert tensor(wl, "x").valid_bytes(p, world, r) == Tr * H * 2
        assert tensor(wl, "y").valid_bytes(p, world, r) == Tr * H * 2
        assert tensor(wl, "topk_idx").valid_bytes(p, world, r) == Tr * K * 4
        assert tensor(wl, "topk_w").valid_bytes(p, world, r) == Tr * K * 4
        assert tensor(wl, "w_gate_up").valid_bytes is None  # weights: the whole capacity
    assert seen[0] == T and (world == 1 or len(set(seen)) == world)  # uneven from world size 2 on
    cap = T * min(K, EL)
    rows = wl_module.scratch_rows(p, world)
    assert rows == {"send": T * K, "recv": max(1, (world - 1) * cap), "out": world * cap, "ret": T * K}
    nbytes = wl_module.scratch_bytes(p, world)
    assert list(nbytes) == list(SCRATCH)
    assert nbytes["counts"] == world * E * 4 and nbytes["out"] == world * cap * H * 2


def test_flops_and_comm_bytes(wl, wl_module):
    p = wl.resolve()
    tokens = sum(wl_module.valid_tokens(p, 4, r) for r in range(4)) / 4
    assert wl.flops(p, 4) == pytest.approx(2.0 * tokens * 8 * 3 * 7168 * 2048)
    assert wl.flops(p, 1) == pytest.approx(2.0 * 4096 * 8 * 3 * 7168 * 2048)
    assert wl.comm_bytes(p, 1) == 0
    assert wl.comm_bytes(p, 4) == pytest.approx(2.0 * tokens * 8 * 0.75 * 7168 * 2)


# ------------------------------------------------------------------------------------------------- params

@pytest.mark.parametrize(
    "change, world, needle",
    [
        ({"E": 6}, 4, "E=6 experts do not split over the world size 4"),
        ({"K": 5}, 1, "K=5 picks more experts than exist"),
        ({"H": 12}, 1, "H=12 must be a multiple of 8"),
        ({"I": 4}, 1, "I=4 must be a multiple of 8"),
        ({"SKEW": 50}, 1, "SKEW=50"),
        ({"SKEW": 20000}, 1, "SKEW=20000"),
        ({"T": 0}, 1, "T must be positive"),
        ({"E": 2048, "K": 2}, 1, "E=2048 is more than 1024"),
        ({}, 0, "world size"),
        ({"FP8": 2}, 1, "FP8=2 must be 0"),
        ({"FP8": 1, "H": 1000}, 1, "FP8=1 needs H to be a multiple of 512"),
    ],
)
def test_bad_parameters_name_what_is_wrong(wl, change, world, needle):
    params = {**TINY, **change}
    for t in wl.tensors:
        with pytest.raises(BadInput, match=re.escape(needle)):
            t.dims(params, world)


def test_missing_unknown_parameters_and_bad_ranks_are_refused(wl, wl_module, tensor):
    with pytest.raises(BadInput, match="parameter SKEW is missing"):
        tensor(wl, "x").dims({k: v for k, v in TINY.items() if k != "SKEW"}, 1)
    with pytest.raises(BadInput, match="'TOPK'"):
        wl.resolve({"TOPK": 4})
    with pytest.raises(BadInput, match="rank 2 is outside world size 2"):
        wl_module.valid_tokens(TINY, 2, 2)


# ------------------------------------------------------------------------------------------------- inputs

def test_make_inputs_routing_padding_and_seeding(wl, wl_module, inputs_for):
    p = {**TINY, "T": 32, "E": 8, "K": 3}
    a, b, c = (inputs_for(wl, p, 2, seed=s, widened=True) for s in (1, 1, 2))
    raw = wl.make_inputs(p, 2, 1, torch.Generator().manual_seed(5))
    assert raw["x"].dtype == torch.bfloat16 and raw["topk_idx"].dtype == torch.int32
    assert raw["topk_w"].dtype == torch.float32 and raw["w_gate_up"].dtype == torch.bfloat16
    for r in range(2):
        Tr = wl_module.valid_tokens(p, 2, r)
        idx, w, x = a[r]["topk_idx"], a[r]["topk_w"], a[r]["x"]
        assert ((idx[:Tr] >= 0) & (idx[:Tr] < 8)).all()
        assert all(len(set(row.tolist())) == 3 for row in idx[:Tr])  # K distinct experts per token
        assert torch.allclose(w[:Tr].sum(-1), torch.ones(Tr), atol=1e-6) and (w[:Tr] > 0).all()
        assert torch.isfinite(x[:Tr]).all()
        # past T_r: misuse fails loudly
        assert (idx[Tr:] == -1).all() and torch.isnan(w[Tr:]).all() and torch.isnan(x[Tr:]).all()
    assert a[0]["w_gate_up"].std().item() == pytest.approx(1 / math.sqrt(p["H"]), rel=0.2)
    assert a[0]["w_down"].std().item() == pytest.approx(1 / math.sqrt(p["I"]), rel=0.2)
    assert torch.equal(a[1]["topk_idx"], b[1]["topk_idx"]) and torch.equal(a[0]["w_down"], b[0]["w_down"])
    assert not torch.equal(a[1]["topk_idx"], c[1]["topk_idx"]) and not torch.equal(a[0]["x"][:4], c[0]["x"][:4])
    assert not torch.equal(a[0]["w_gate_up"], a[1]["w_gate_up"])  # each rank's experts are its own


def _load_ratio(wl, wl_module, skew: int, seed: int = 0) -> float:
    p = {**TINY, "T": 4096, "E": 8, "K": 2, "SKEW": skew}
    counts = torch.zeros(8)
    for r in range(2):
        g = torch.Generator().manual_seed(seed * 10 + r)
        idx = wl.make_inputs(p, 2, r, g)["topk_idx"][: wl_module.valid_tokens(p, 2, r)]
        counts += torch.bincount(idx.reshape(-1).long(), minlength=8).float()
    hot = wl_module.hot_experts(p, 2)
    return float(counts[:hot].mean() / counts[hot:].mean())


def test_routing_skew_moves_load_to_the_hot_experts(wl, wl_module):
    uniform, two, five = (_load_ratio(wl, wl_module, skew) for skew in (100, 200, 500))
    assert 0.9 < uniform < 1.1
    assert 1.6 < two < 2.1  # below the 2:1 weight: top-2 of 8 is drawn without replacement
    assert 3.2 < five < 5.0 and five > two
    assert _load_ratio(wl, wl_module, 500, seed=1) != five  # fresh per trial


# ---------------------------------------------------------------------------------------------- reference

def direct_y(ins, params, world: int, rank: int) -> torch.Tensor:
    """y of one rank token by token, slot by slot, with explicit float64 arithmetic: the definition."""
    T, H, inter, E, K = (params[n] for n in ("T", "H", "I", "E", "K"))
    EL = E // world
    Tr = T - (rank * T) // (2 * world)
    y = torch.zeros(Tr, H, dtype=torch.float64)
    for t in range(Tr):
        x = ins[rank]["x"][t].double()
        for k in range(K):
            e = int(ins[rank]["topk_idx"][t, k])
            owner, le = divmod(e, EL)
            wgu = ins[owner]["w_gate_up"][le].double()
            wd = ins[owner]["w_down"][le].double()
            gate = torch.tensor([sum(float(x[h]) * float(wgu[h, j]) for h in range(H)) for j in range(inter)],
                                dtype=torch.float64)
            up = torch.tensor([sum(float(x[h]) * float(wgu[h, inter + j]) for h in range(H)) for j in range(inter)],
                              dtype=torch.float64)
            act = gate / (1 + torch.exp(-gate)) * up
            out = torch.tensor([sum(float(act[j]) * float(wd[j, h]) for j in range(inter)) for h in range(H)],
                               dtype=torch.float64)
            y[t] += float(ins[rank]["topk_w"][t, k]) * out
    return y


@pytest.mark.parametrize("world", [1, 2])
def test_reference_matches_direct_computation(wl, wl_module, world, inputs_for, tensor):
    p = {**TINY, "SKEW": 300}
    ins = inputs_for(wl, p, world, seed=3, widened=True)
    refs = wl.reference(ins, p, world)
    assert len(refs) == world
    for r in range(world):
        ref = refs[r]["y"]
        assert ref.dtype == torch.float32
        assert ref.numel() * 2 == tensor(wl, "y").valid_bytes(p, world, r)  # the valid prefix only
        assert torch.allclose(ref.double(), direct_y(ins, p, world, r), rtol=1e-5, atol=1e-6)


def test_reference_refuses_wrong_world_shapes_and_experts(wl, inputs_for):
    ins = inputs_for(wl, TINY, 2, widened=True)
    with pytest.raises(BadInput, match="2 ranks for world size 1"):
        wl.reference(ins, TINY, 1)
    bad = [dict(d) for d in ins]
    bad[1]["x"] = bad[1]["x"][:3]
    with pytest.raises(BadInput, match="rank 1 x has shape"):
        wl.reference(bad, TINY, 2)
    bad = [dict(d) for d in ins]
    bad[0]["topk_idx"] = bad[0]["topk_idx"].clone()
    bad[0]["topk_idx"][0, 0] = 99
    with pytest.raises(BadInput, match="outside"):
        wl.reference(bad, TINY, 2)


# ---------------------------------------------------------------------------------------------- tolerance

def kernel_like(ins, params, world: int, rank: int) -> torch.Tensor:
    """What a correct kernel computes: fp32-accumulated GEMMs rounded to bf16 at every stage the kernels round
    (gate/up output, SwiGLU activation, expert output), fp32 combine, bf16 y."""
    T, H, inter, E, K = (params[n] for n in ("T", "H", "I", "E", "K"))
    EL = E // world
    Tr = T - (rank * T) // (2 * world)
    bf = torch.bfloat16
    x, idx, w = ins[rank]["x"][:Tr], ins[rank]["topk_idx"][:Tr].long(), ins[rank]["topk_w"][:Tr]
    y = torch.zeros(Tr, H)
    for e in range(E):
        owner, le = divmod(e, EL)
        tok, slot = (idx == e).nonzero(as_tuple=True)
        if not tok.numel():
            continue
        gu = (x[tok] @ ins[owner]["w_gate_up"][le]).to(bf).float()
        act = (torch.nn.functional.silu(gu[:, :inter]) * gu[:, inter:]).to(bf).float()
        out = (act @ ins[owner]["w_down"][le]).to(bf).float()
        y.index_add_(0, tok, out * w[tok, slot].unsqueeze(1))
    return y.to(bf)


@pytest.fixture(scope="module")
def small_case(wl, inputs_for):
    p = wl.resolve(wl.size_presets["small_skew5"])
    ins = inputs_for(wl, p, 2, seed=7, widened=True)
    ref = wl.reference(ins, p, 2)[1]["y"]
    return p, ins, ref, kernel_like(ins, p, 2, 1)


def test_correct_bf16_pipeline_passes_with_headroom(wl, small_case):
    _, _, ref, good = small_case
    err = rel_error(good, ref)
    assert 2e-3 < err < 7e-3  # four bf16 roundings, as workload.py states
    assert wl.tolerance.passes(err) and err * 2 < wl.tolerance.rel


def test_lost_contribution_unwritten_row_and_wrong_expert_fail(wl, small_case):
    p, ins, ref, good = small_case
    idx, w = ins[1]["topk_idx"], ins[1]["topk_w"]
    # one (token, slot) contribution dropped: the combine missed one expert output
    t = int(torch.argmax(w[: ref.shape[0]].max(dim=1).values))
    k = int(torch.argmax(w[t]))
    one = {**ins[1], "topk_w": w.clone()}
    one["topk_w"][t, k] = 0.0
    dropped = kernel_like([ins[0], one], p, 2, 1)
    assert not wl.tolerance.passes(rel_error(dropped, ref))
    unwritten = good.clone()
    unwritten[5, 0] = float("nan")  # the harness's poison left in one element
    assert not wl.tolerance.passes(rel_error(unwritten, ref))
    # every token's first slot sent to the wrong expert (off-by-one in the dispatch offsets)
    shifted = {**ins[1], "topk_idx": idx.clone()}
    Tr = ref.shape[0]
    shifted["topk_idx"][:Tr, 0] = (idx[:Tr, 0] + 1) % p["E"]
    clash = (shifted["topk_idx"][:Tr, 0] == idx[:Tr, 1])
    shifted["topk_idx"][:Tr, 0][clash] = (idx[:Tr, 0][clash] + 2) % p["E"]
    assert not wl.tolerance.passes(rel_error(kernel_like([ins[0], shifted], p, 2, 1), ref))


# ------------------------------------------------------------------------------------- 8-bit dispatch (FP8)

def test_fp8_roundtrip_rounds_to_nearest_even_on_block_scales(wl_module):
    bf = torch.bfloat16
    # block 0: amax 448, so scale 1 and the e4m3 grid itself: 1.0625 and 1.1875 are ties between neighbours
    # (1, 1.125 and 1.125, 1.25) and go to the even mantissa; block 1: zeros stay zeros (scale 1, not 0/0)
    b0 = torch.zeros(128)
    b0[:5] = torch.tensor([448.0, 1.0625, 1.1875, -3.0, 0.0])
    x = torch.cat([b0, torch.zeros(128)]).reshape(1, 256).to(bf)
    got = wl_module.fp8_roundtrip(x).float()[0]
    assert got[:5].tolist() == [448.0, 1.0, 1.25, -3.0, 0.0]
    assert bool((got[128:] == 0).all())
    # random rows: every block's largest magnitude survives, the rest lands within e4m3's half-step of 2**-4
    g = torch.Generator().manual_seed(3)
    x = torch.randn(8, 512, generator=g).to(bf)
    got = wl_module.fp8_roundtrip(x).float().reshape(8, 4, 128)
    xb = x.float().reshape(8, 4, 128)
    amax_at = xb.abs().argmax(dim=-1, keepdim=True)
    assert torch.equal(got.gather(-1, amax_at), xb.gather(-1, amax_at))
    step = xb.abs().amax(dim=-1, keepdim=True) / 448 * 2 ** -9  # e4m3's smallest step, in input units
    assert bool(((got - xb).abs() <= xb.abs() * 2 ** -4 * 1.01 + step).all())
    assert 1e-2 < rel_error(got, xb) < 6e-2


@pytest.fixture(scope="module")
def fp8_case(wl, wl_module, inputs_for):
    p = wl.resolve(wl.size_presets["small_skew5_fp8"])
    ins = inputs_for(wl, p, 2, seed=11, widened=True)
    ref = wl.reference(ins, p, 2)[1]["y"]
    quantised = [{**i, "x": wl_module.fp8_roundtrip(i["x"]).float()} for i in ins]
    return p, ins, ref, quantised


def test_fp8_reference_is_what_a_quantising_kernel_computes(wl, fp8_case):
    p, _, ref, quantised = fp8_case
    err = rel_error(kernel_like(quantised, p, 2, 1), ref)
    assert wl.tolerance.passes(err) and err * 2 < wl.tolerance.rel


def test_fp8_dispatch_that_moves_bf16_rows_fails(wl, fp8_case):
    p, ins, ref, _ = fp8_case
    assert not wl.tolerance.passes(rel_error(kernel_like(ins, p, 2, 1), ref))


def test_fp8_windows_hold_wire_rows_and_comm_bytes_shrink(wl, wl_module):
    p = wl.resolve(wl.size_presets["dsv3_e32_fp8"])
    H = p["H"]
    wire = H + H // 128 * 4
    assert wl_module.wire_row_bytes(p, 4) == wire == 7392
    rows, nbytes = wl_module.scratch_rows(p, 4), wl_module.scratch_bytes(p, 4)
    assert nbytes["send"] == rows["send"] * wire and nbytes["recv"] == rows["recv"] * wire
    assert nbytes["out"] == rows["out"] * H * 2 and nbytes["ret"] == rows["ret"] * H * 2
    bf16 = {**p, "FP8": 0}
    assert wl.comm_bytes(p, 4) == pytest.approx(wl.comm_bytes(bf16, 4) * (wire + 2 * H) / (4 * H))


# ------------------------------------------------------------------------------------------ kernel sources

@pytest.fixture(scope="module")
def baseline_code(wl) -> str:
    return wl.path(wl.baseline).read_text()


def test_knob_block_parses_with_every_value_allowed(baseline_code):
    knobs = {k.name: k for k in markers.knobs(baseline_code)}
    assert set(knobs) == KNOBS
    assert knobs["kPlacement"].allowed == ("Placement::kSequential", "Placement::kTwoStream")
    assert knobs["kSyncScope"].allowed == ("SyncScope::kRank", "SyncScope::kCta")
    assert knobs["kIssuer"].allowed == ("Issuer::kWarp", "Issuer::kCta")
    assert knobs["kCombine"].allowed == ("Combine::kPushBack", "Combine::kPull")
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


def test_sources_declare_backends_scratch_and_no_stray_knobs(wl, wl_module):
    assert supported_backends(wl.path("seed_nccl.cu").read_text()) == ("nccl", "symm")  # symm: symm_nccl/nccl.h
    assert set(supported_backends(wl.path("seed_copy.cu").read_text())) == {"nccl", "symm"}
    assert set(supported_backends(wl.path("device_lsa.cu").read_text())) == {"nccl", "symm"}
    for name in ("seed_nccl.cu", "seed_copy.cu", "device_lsa.cu"):
        code = wl.path(name).read_text()
        # the same five windows, in the order workload.scratch_bytes lists them
        assert '{"send", "recv", "out", "ret", "counts"}' in code, name
        assert "CUCO_EXPORT int cuco_setup" in code and "CUCO_CHECK_ABI(ctx)" in code, name
        assert "refuse_capture(ctx->stream)" in code, name  # host count reads cannot be captured
        if name != "device_lsa.cu":
            assert markers.knobs(code) == [], name
    assert list(wl_module.scratch_bytes(TINY, 1)) == list(SCRATCH)
