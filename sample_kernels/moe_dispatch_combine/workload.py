"""DeepSeek-V3-style expert-parallel MoE layer: dispatch -> expert GEMMs (SwiGLU) -> combine.

World size W, E experts in total, EL = E/W per rank: rank q owns experts [q*EL, (q+1)*EL). Every rank holds up to
T tokens of hidden size H; token t was routed (top-K, weights summing to 1) to K distinct experts. Expert e is a
SwiGLU MLP with intermediate size I:

    expert_e(x) = (silu(x @ Wg_e) * (x @ Wu_e)) @ Wd_e       [Wg_e | Wu_e] = w_gate_up[e]  [H, 2I],  Wd_e [I, H]
    y[t]        = sum_k topk_w[t, k] * expert_{topk_idx[t, k]}(x[t])

computed where the expert lives: tokens travel to the expert's rank (dispatch), results travel back and are
summed at the token's rank (combine). Tensors (identical capacity on every rank, windows are symmetric):

    x           [T, H]         bf16  input   this rank's tokens; the first T_r rows are valid
    topk_idx    [T, K]         i32   input   expert ids per token (distinct per token); -1 past T_r
    topk_w      [T, K]         f32   input   combine weights (softmax over the K picks); NaN past T_r
    w_gate_up   [EL, H, 2I]    bf16  input   this rank's experts, gate columns first, then up
    w_down      [EL, I, H]     bf16  input   this rank's experts' down projections
    y           [T, H]         bf16  output  the layer's output for this rank's tokens; first T_r rows verified

Uneven token counts through valid vs capacity bytes: rank r holds T_r = T - floor(r*T / (2W)) valid tokens
(all T on rank 0, down to a bit over T/2 on the last rank), so x, topk_idx, topk_w and y carry valid_bytes =
T_r rows while their capacity is T rows everywhere. Kernels read T_r from x's valid_bytes; the rows past it are
filled so that using them fails loudly (NaN tokens and weights, expert id -1). The per-step unevenness of the
dispatch itself (how many rows each rank receives) comes from the routing and lives in scratch windows sized
for the worst case (see scratch_rows).

Routing skew: SKEW is the hot:cold selection weight in percent (100 = uniform, 200 = 2:1, 500 = 5:1, the
paper's sweep). The first ceil(E/4) experts are hot; top-K is drawn without replacement with probabilities
proportional to those weights, fresh per trial from the harness generator. Because hot experts are the lowest
numbered, their load lands on the lowest ranks, so skew makes ranks uneven, which is what the slowest-rank
time measures. The realised hot:cold load ratio is below SKEW/100 when K is a large share of E (sampling
without replacement saturates: with E = 8, K = 2 a 5:1 weight gives about 4:1 load); the unit tests measure it.

Dispatch wire format: FP8=0 (the default) moves bf16 token rows; FP8=1 moves DeepSeek-V3-style block-scaled
8-bit rows: per block of 128 consecutive elements one fp32 scale = amax(|block|) / 448 and e4m3 values
x / scale (round to nearest even), half the bytes plus 3%. The quantisation is part of the layer: every routed
row, own rows included, is computed on bf16(e4m3 * scale), and the reference applies the same arithmetic
(fp8_roundtrip), so a kernel that skipped it (moved bf16) would miss by about 3e-2 and fail. The return path
stays bf16. FP8=1 needs H % 512 == 0 (a wire row of H + H/32 bytes in whole 16-byte vectors).

Tolerance. Inputs are exact bf16 values; a kernel rounds to bf16 at four places (the gate/up GEMM output, the
SwiGLU activation fed to the down GEMM, the expert output that travels back, and y), each a relative RMS error
of about 2**-8/sqrt(3) ~ 2.3e-3 on the value rounded; they compound to 3.9e-3 relative RMS on y (measured by the
unit tests on the small presets at 1, 2 and 4 ranks against a bf16-staged emulation of the kernels; fp32
accumulation order adds next to nothing). 1e-2 leaves 2.5x headroom for cuBLAS's tile order and still fails a
kernel that leaves one token row of the small preset unwritten or zero (6.6e-2; NaN poison never passes) or
loses one token's largest-weight expert contribution (3-6e-2). A lost contribution of small weight (0.16) costs
only ~1.5e-2: per-element checks would be tighter, but the harness compares norms.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cuco_kit.errors import BadInput
from cuco_kit.workload import Params, TensorSpec, Tolerance, Workload

BF16_BYTES = 2
I32_BYTES = 4
F32_BYTES = 4
BF16_PER_VECTOR = 8  # token rows move as 16-byte vectors
REL_TOLERANCE = 1e-2
UNIFORM_SKEW = 100  # SKEW is a percentage: 100 means every expert equally likely
MAX_SKEW = 10_000
MAX_EXPERTS = 1024  # the kernels' routing scan runs in one CTA
NO_EXPERT = -1  # topk_idx past a rank's valid tokens
FP8_BLOCK = 128  # elements per fp32 scale of the 8-bit dispatch
E4M3_MAX = 448.0  # largest finite e4m3 value
FP8_ROW_ALIGN = 512  # H % 512 == 0 keeps a wire row whole 16-byte vectors

DSV3 = {"T": 4096, "H": 7168, "I": 2048, "E": 256, "K": 8, "SKEW": UNIFORM_SKEW, "FP8": 0}
SMALL = {"T": 256, "H": 1024, "I": 512, "E": 8, "K": 2, "SKEW": UNIFORM_SKEW, "FP8": 0}
DEFAULT_PARAMS = dict(DSV3)
SIZE_PRESETS = {
    # quick runs, and 2-4 ranks sharing one GPU under symm
    "small": dict(SMALL),
    "small_skew5": {**SMALL, "SKEW": 500},
    # the same with block-scaled e4m3 dispatch
    "small_fp8": {**SMALL, "FP8": 1},
    "small_skew5_fp8": {**SMALL, "SKEW": 500, "FP8": 1},
    # DeepSeek-V3's layer: 256 routed experts, top-8 (~22 GB of expert weights over the world)
    "dsv3": dict(DSV3),
    "dsv3_skew5": {**DSV3, "SKEW": 500},
    # the real per-expert shapes with 32 experts, so 2-4 symm ranks fit on one GPU with the harness's
    # per-rank reference inputs (each rank regenerates every rank's weights to verify)
    "dsv3_e32": {**DSV3, "E": 32},
    "dsv3_e32_fp8": {**DSV3, "E": 32, "FP8": 1},
}
PARAM_NAMES = ("T", "H", "I", "E", "K", "SKEW")


def validate(params: Params, world: int) -> None:
    """Raise BadInput naming the first parameter (or the world size) the kernels cannot use."""
    if world < 1:
        raise BadInput(f"moe_dispatch_combine: world size must be >= 1, not {world}")
    for name in PARAM_NAMES:
        if name not in params:
            raise BadInput(f"moe_dispatch_combine: parameter {name} is missing (have {', '.join(params) or 'none'})")
    for name in ("T", "H", "I", "E", "K"):
        if int(params[name]) <= 0:
            raise BadInput(f"moe_dispatch_combine: {name} must be positive, not {params[name]}")
    T, H, I, E, K, SKEW = (int(params[n]) for n in PARAM_NAMES)
    if E % world:
        raise BadInput(f"moe_dispatch_combine: E={E} experts do not split over the world size {world} (each rank "
                       "owns E/W experts); pick E as a multiple of W")
    if E > MAX_EXPERTS:
        raise BadInput(f"moe_dispatch_combine: E={E} is more than {MAX_EXPERTS} experts (the routing scan runs in "
                       "one CTA)")
    if K > E:
        raise BadInput(f"moe_dispatch_combine: K={K} picks more experts than exist (E={E}); top-K needs K <= E")
    if H % BF16_PER_VECTOR:
        raise BadInput(f"moe_dispatch_combine: H={H} must be a multiple of {BF16_PER_VECTOR} so token rows move "
                       "as 16-byte vectors")
    if I % BF16_PER_VECTOR:
        raise BadInput(f"moe_dispatch_combine: I={I} must be a multiple of {BF16_PER_VECTOR} (16-byte aligned rows "
                       "for the tensor-core GEMMs)")
    if not UNIFORM_SKEW <= SKEW <= MAX_SKEW:
        raise BadInput(f"moe_dispatch_combine: SKEW={SKEW} is the hot:cold expert weight in percent and must lie "
                       f"in [{UNIFORM_SKEW}, {MAX_SKEW}] (100 = uniform, 500 = 5:1)")
    fp8 = int(params.get("FP8", 0))
    if fp8 not in (0, 1):
        raise BadInput(f"moe_dispatch_combine: FP8={fp8} must be 0 (bf16 dispatch) or 1 (block-scaled e4m3)")
    if fp8 and H % FP8_ROW_ALIGN:
        raise BadInput(f"moe_dispatch_combine: FP8=1 needs H to be a multiple of {FP8_ROW_ALIGN} (whole 16-byte "
                       f"vectors per wire row), not H={H}")


def fp8_dispatch(params: Params, world: int) -> bool:
    """Whether token rows travel block-scaled e4m3 (FP8=1; an absent FP8 means bf16)."""
    validate(params, world)
    return int(params.get("FP8", 0)) == 1


def wire_row_bytes(params: Params, world: int) -> int:
    """Bytes of one dispatched token row: 2H (bf16), or H e4m3 bytes and H/128 fp32 scales."""
    H = _dims(params, world)[1]
    return H + (H // FP8_BLOCK) * F32_BYTES if fp8_dispatch(params, world) else H * BF16_BYTES


def fp8_roundtrip(x: Any) -> Any:
    """What a bf16 [n, H] block of token rows becomes after the 8-bit wire format: per 128 elements
    scale = amax / 448 (1 if all zero), q = e4m3(x / scale) rounded to nearest even, back as bf16(q * scale):
    moe_kernels.cuh's quantize_rows / dequantize_rows in torch."""
    import torch

    n, H = x.shape
    xf = x.to(torch.float32).reshape(n, H // FP8_BLOCK, FP8_BLOCK)
    amax = xf.abs().amax(dim=-1, keepdim=True)
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    q = (xf / scale).to(torch.float8_e4m3fn)
    return (q.to(torch.float32) * scale).reshape(n, H).to(torch.bfloat16)


def _dims(params: Params, world: int) -> tuple[int, int, int, int, int, int]:
    validate(params, world)
    return tuple(int(params[n]) for n in PARAM_NAMES)  # type: ignore[return-value]


def experts_per_rank(params: Params, world: int) -> int:
    return _dims(params, world)[3] // world


def valid_tokens(params: Params, world: int, rank: int) -> int:
    """T_r: tokens rank `rank` holds this step (rank 0 all T, the last rank a bit over T/2)."""
    T = _dims(params, world)[0]
    if not 0 <= rank < world:
        raise BadInput(f"moe_dispatch_combine: rank {rank} is outside world size {world}")
    return T - (rank * T) // (2 * world)


def hot_experts(params: Params, world: int) -> int:
    """How many experts (the lowest numbered) carry the SKEW weight."""
    return math.ceil(_dims(params, world)[3] / 4)


def scratch_rows(params: Params, world: int) -> dict[str, int]:
    """Rows in each token-row scratch window the candidates declare (see README.md); send and recv hold wire
    rows (wire_row_bytes), out and ret bf16 rows of H:
    send  T*K        this rank's assignments in expert order (the dispatch source)
    recv  (W-1)*Cap  rows that arrived from other ranks, grouped per local expert (at least 1 row)
    out   W*Cap      expert outputs: own rows first (Cap), then the arrived rows' outputs
    ret   T*K        expert outputs back at the token's rank, in send order (what combine reads)
    where Cap = T * min(K, EL) is the most rows one rank can send to one expert rank."""
    T, _, _, E, K, _ = _dims(params, world)
    cap = T * min(K, E // world)
    return {"send": T * K, "recv": max(1, (world - 1) * cap), "out": world * cap, "ret": T * K}


def scratch_bytes(params: Params, world: int) -> dict[str, int]:
    """Bytes of every scratch window the candidates declare, in declaration order ("counts" is the
    [W, E] int32 matrix of per-(source, expert) row counts)."""
    H = _dims(params, world)[1]
    wire = wire_row_bytes(params, world)
    out = {name: rows * (wire if name in ("send", "recv") else H * BF16_BYTES)
           for name, rows in scratch_rows(params, world).items()}
    out["counts"] = world * _dims(params, world)[3] * I32_BYTES
    return out


def x_shape(params: Params, world: int) -> tuple[int, int]:
    T, H, *_ = _dims(params, world)
    return (T, H)


def topk_shape(params: Params, world: int) -> tuple[int, int]:
    T, _, _, _, K, _ = _dims(params, world)
    return (T, K)


def w_gate_up_shape(params: Params, world: int) -> tuple[int, int, int]:
    _, H, I, _, _, _ = _dims(params, world)
    return (experts_per_rank(params, world), H, 2 * I)


def w_down_shape(params: Params, world: int) -> tuple[int, int, int]:
    _, H, I, _, _, _ = _dims(params, world)
    return (experts_per_rank(params, world), I, H)


def _rows_valid(elem_bytes: int, row_elems: Any) -> Any:
    def valid(params: Params, world: int, rank: int) -> int:
        return valid_tokens(params, world, rank) * row_elems(params, world) * elem_bytes
    return valid


x_valid = _rows_valid(BF16_BYTES, lambda p, w: _dims(p, w)[1])
topk_idx_valid = _rows_valid(I32_BYTES, lambda p, w: _dims(p, w)[4])
topk_w_valid = _rows_valid(F32_BYTES, lambda p, w: _dims(p, w)[4])
y_valid = x_valid


def expert_weights(params: Params, world: int) -> Any:
    """Selection weight of every expert: SKEW/100 for the hot ones, 1 for the rest (float64, CPU)."""
    import torch

    _, _, _, E, _, SKEW = _dims(params, world)
    w = torch.ones(E, dtype=torch.float64)
    w[: hot_experts(params, world)] = SKEW / UNIFORM_SKEW
    return w


def make_inputs(params: Params, world: int, rank: int, generator: Any) -> dict[str, Any]:
    """Tokens x ~ N(0, 1); routing: K distinct experts per token drawn with the skewed weights, combine weights a
    softmax over K N(0, 1) logits; expert weights fan-in scaled (Wg, Wu ~ N(0, 1/H), Wd ~ N(0, 1/I)) so every
    stage stays O(1). Floats drawn in fp32 and rounded to bf16 so kernels and reference see the same values.
    Rows past T_r: NaN tokens and weights, expert id -1. Weights are drawn one expert at a time to bound the
    fp32 transient at the dsv3 shapes."""
    import torch

    T, H, I, E, K, _ = _dims(params, world)
    EL = E // world
    Tr = valid_tokens(params, world, rank)
    device = generator.device
    x = torch.full((T, H), math.nan, device=device, dtype=torch.bfloat16)
    x[:Tr] = torch.randn((Tr, H), generator=generator, device=device, dtype=torch.float32).to(torch.bfloat16)
    probs = expert_weights(params, world).to(device=device, dtype=torch.float32).expand(Tr, E)
    idx = torch.full((T, K), NO_EXPERT, device=device, dtype=torch.int64)
    idx[:Tr] = torch.multinomial(probs, K, replacement=False, generator=generator)
    w = torch.full((T, K), math.nan, device=device, dtype=torch.float32)
    w[:Tr] = torch.softmax(torch.randn((Tr, K), generator=generator, device=device, dtype=torch.float32), dim=-1)
    wgu = torch.empty((EL, H, 2 * I), device=device, dtype=torch.bfloat16)
    wd = torch.empty((EL, I, H), device=device, dtype=torch.bfloat16)
    for e in range(EL):
        wgu[e] = (torch.randn((H, 2 * I), generator=generator, device=device, dtype=torch.float32)
                  / math.sqrt(H)).to(torch.bfloat16)
        wd[e] = (torch.randn((I, H), generator=generator, device=device, dtype=torch.float32)
                 / math.sqrt(I)).to(torch.bfloat16)
    return {"x": x, "topk_idx": idx.to(torch.int32), "topk_w": w, "w_gate_up": wgu, "w_down": wd}


def swiglu_expert(x: Any, wgu: Any, wd: Any) -> Any:
    """(silu(x @ Wg) * (x @ Wu)) @ Wd in x's dtype (the reference's accumulation type)."""
    import torch

    I = wd.shape[0]
    gu = x @ wgu.to(x.dtype)
    return (torch.nn.functional.silu(gu[:, :I]) * gu[:, I:]) @ wd.to(x.dtype)


def reference(inputs: Sequence[Mapping[str, Any]], params: Params, world: int) -> list[dict[str, Any]]:
    """y_r[:T_r] for every rank: each expert applied to the tokens of every rank routed to it, weighted and
    summed at the token's rank; float64 on CPU, float32 elsewhere (both far more precise than the bf16 stages
    of a kernel). Returned in float32, T_r rows (the valid prefix)."""
    import torch

    if len(inputs) != world:
        raise BadInput(f"moe_dispatch_combine reference: got inputs of {len(inputs)} ranks for world size {world}")
    T, H, I, E, K, _ = _dims(params, world)
    EL = E // world
    for r, ins in enumerate(inputs):
        for name, shape in (("x", x_shape), ("topk_idx", topk_shape), ("topk_w", topk_shape),
                            ("w_gate_up", w_gate_up_shape), ("w_down", w_down_shape)):
            if tuple(ins[name].shape) != tuple(shape(params, world)):
                raise BadInput(f"moe_dispatch_combine reference: rank {r} {name} has shape "
                               f"{tuple(ins[name].shape)}, expected {tuple(shape(params, world))}")
    device = inputs[0]["x"].device
    acc = torch.float64 if device.type == "cpu" else torch.float32
    fp8 = fp8_dispatch(params, world)
    xs, idxs, ws, ys = [], [], [], []
    for r in range(world):
        Tr = valid_tokens(params, world, r)
        idx = inputs[r]["topk_idx"][:Tr].to(device=device, dtype=torch.int64)
        if bool(((idx < 0) | (idx >= E)).any()):
            raise BadInput(f"moe_dispatch_combine reference: rank {r} routes a valid token to an expert outside "
                           f"[0, {E})")
        x = inputs[r]["x"][:Tr].to(device)
        xs.append((fp8_roundtrip(x) if fp8 else x).to(dtype=acc))
        idxs.append(idx)
        ws.append(inputs[r]["topk_w"][:Tr].to(device=device, dtype=acc))
        ys.append(torch.zeros((Tr, H), device=device, dtype=acc))
    for e in range(E):
        owner, le = divmod(e, EL)
        wgu = inputs[owner]["w_gate_up"][le].to(device)
        wd = inputs[owner]["w_down"][le].to(device)
        for r in range(world):
            tok, slot = (idxs[r] == e).nonzero(as_tuple=True)
            if tok.numel():
                out = swiglu_expert(xs[r][tok], wgu, wd)
                ys[r].index_add_(0, tok, out * ws[r][tok, slot].unsqueeze(1))
    return [{"y": y.to(torch.float32)} for y in ys]


def flops(params: Params, world: int) -> float:
    """Expert FLOPs per rank and step at the mean load (T_r averaged over ranks): three [n, H] x [H, I] products
    per routed token. Skew moves work to the hot ranks; the slowest rank does more."""
    T, H, I, E, K, _ = _dims(params, world)
    tokens = sum(valid_tokens(params, world, r) for r in range(world)) / world
    return 2.0 * tokens * K * 3 * H * I


def comm_bytes(params: Params, world: int) -> float:
    """Bytes each rank receives per step at the mean load without skew: the (W-1)/W of its routed rows that
    come from other ranks on dispatch (wire rows) and as many back on combine (bf16 rows of H)."""
    T, H, _, _, K, _ = _dims(params, world)
    tokens = sum(valid_tokens(params, world, r) for r in range(world)) / world
    return tokens * K * (world - 1) / world * (wire_row_bytes(params, world) + H * BF16_BYTES)


WORKLOAD = Workload(
    name="moe_dispatch_combine",
    directory=Path(__file__).resolve().parent,
    description="DeepSeek-V3-style expert-parallel MoE layer: top-K dispatch of bf16 or block-scaled e4m3 tokens "
                "(FP8) to the experts' ranks, "
                "SwiGLU expert GEMMs on tensor cores (cuBLAS), weighted combine at the token's rank; skewed routing "
                "and uneven token counts.",
    params=dict(DEFAULT_PARAMS),
    tensors=[
        TensorSpec("x", "input", "bf16", x_shape, valid_bytes=x_valid),
        TensorSpec("topk_idx", "input", "i32", topk_shape, valid_bytes=topk_idx_valid),
        TensorSpec("topk_w", "input", "f32", topk_shape, valid_bytes=topk_w_valid),
        TensorSpec("w_gate_up", "input", "bf16", w_gate_up_shape),
        TensorSpec("w_down", "input", "bf16", w_down_shape),
        TensorSpec("y", "output", "bf16", x_shape, valid_bytes=y_valid),
    ],
    reference=reference,
    tolerance=Tolerance(rel=REL_TOLERANCE),
    make_inputs=make_inputs,
    flops=flops,
    comm_bytes=comm_bytes,
    size_presets={k: dict(v) for k, v in SIZE_PRESETS.items()},
    check_presets=("small_skew5_fp8", "small_skew5", "small_fp8"),  # the gpu tier's; the quick form runs the first
)
