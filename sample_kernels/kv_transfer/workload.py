"""KV-cache transfer, disaggregated prefill -> decode: the prefill rank computes each layer's K/V and ships it, layer
by layer, into the decode rank's KV cache.

Roles. Rank 0 is the prefill rank; ranks 1..W-1 are decode ranks and every one of them receives the WHOLE KV
(W = 2 is the paper's setting; W > 2 stands for decode replicas). At world size 1 rank 0 plays both roles and
the transfer is a local copy. Per layer l (L layers; sequence S tokens, hidden D, KV width KVD):

    KV_l = H @ Wkv_l          H [S, D], Wkv_l [D, 2*KVD], KV_l [S, 2*KVD] = [K_l | V_l] per token, bf16 out

(one bf16 tensor-core GEMM, the stand-in for the layer's K/V projection; the same H feeds every layer, where a
real model would feed layer l-1's output). Tensors, identical capacity on every rank (windows are symmetric):

    h           [S, D]             input   prefill's hidden states        valid on rank 0 only (W >= 2)
    wkv         [L, D, 2*KVD]      input   prefill's K/V projections      valid on rank 0 only (W >= 2)
    page_table  [S/PAGE] (or [1])  input   int32, logical -> physical page of THIS rank's cache
                                           valid on decode ranks only, and only when PAGE > 0
    kv_cache    [L, S, 2*KVD]      output  the decode cache: contiguous (PAGE = 0)
                [L, S/PAGE, PAGE, 2*KVD]   or paged: logical page j of layer l lives at physical page
                                           page_table[j], i.e. tokens [j*PAGE, (j+1)*PAGE) of KV_l land in
                                           kv_cache[l, page_table[j], :, :]

Asymmetric roles through valid vs capacity bytes (the decision this sample documents): the decode cache is the
only verified output. On the prefill rank (W >= 2) kv_cache has valid_bytes 0 and the reference returns an
EMPTY tensor for it, so the harness (which compares the reference's length, the valid prefix) verifies nothing
there; the prefill rank's K/V lives in a scratch staging window ("kv_stage", L*S*2*KVD bf16) that candidates
declare. Inputs a rank does not own are filled so misuse fails loudly: h and wkv are NaN on decode ranks (a
decode rank that recomputes KV instead of receiving it produces NaN), and each rank draws its own random page
table (a prefill rank that pushes with its OWN table instead of the decode rank's scatters pages wrongly).

Tolerance: inputs are exact bf16 values, so each product is exact in fp32 and the fp32 accumulation over D terms
adds ~sqrt(D) * 2**-24 relative; what remains is rounding the fp32 result to the bf16 cache: unit roundoff 2**-8,
a relative RMS error near 1.6e-3 over the tensor (the unit tests measure it). 5e-3 leaves ~3x headroom for
cuBLAS's tile order and still fails a candidate whose cache has a single stale or misplaced token row in the
small preset (one row of L*S = 2048 costs ~3e-2), and unwritten bytes are NaN poison, which never passes.
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
VECTOR_BYTES = 16  # kernels move token rows as 16-byte vectors
BF16_PER_VECTOR = VECTOR_BYTES // BF16_BYTES
PREFILL_RANK = 0
CONTIGUOUS = 0  # PAGE value: no paging
REL_TOLERANCE = 5e-3

DEFAULT_PARAMS = {"L": 8, "S": 2048, "D": 4096, "KVD": 512, "PAGE": CONTIGUOUS}
SIZE_PRESETS = {
    # quick runs, and 2-4 ranks sharing one GPU under symm
    "small": {"L": 4, "S": 512, "D": 1024, "KVD": 128, "PAGE": CONTIGUOUS},
    "small_paged": {"L": 4, "S": 512, "D": 1024, "KVD": 128, "PAGE": 16},
    "default": dict(DEFAULT_PARAMS),
    "default_paged": {**DEFAULT_PARAMS, "PAGE": 16},
    # the paper's upper end: sequence 4096, KV width 1024
    "paper": {"L": 8, "S": 4096, "D": 4096, "KVD": 1024, "PAGE": CONTIGUOUS},
    "paper_paged": {"L": 8, "S": 4096, "D": 4096, "KVD": 1024, "PAGE": 16},
}


def validate(params: Params, world: int) -> None:
    """Raise BadInput naming the first parameter (or world size) the kernels cannot use."""
    if world < 1:
        raise BadInput(f"kv_transfer: world size must be >= 1, not {world}")
    for name in ("L", "S", "D", "KVD", "PAGE"):
        if name not in params:
            raise BadInput(f"kv_transfer: parameter {name} is missing (have {', '.join(params) or 'none'})")
    for name in ("L", "S", "D", "KVD"):
        if int(params[name]) <= 0:
            raise BadInput(f"kv_transfer: {name} must be positive, not {params[name]}")
    S, D, KVD, PAGE = (int(params[n]) for n in ("S", "D", "KVD", "PAGE"))
    if PAGE < 0:
        raise BadInput(f"kv_transfer: PAGE must be 0 (contiguous cache) or a page size in tokens, not {PAGE}")
    if PAGE > 0 and S % PAGE:
        raise BadInput(f"kv_transfer: S={S} is not a multiple of PAGE={PAGE}; the sequence must fill whole pages "
                       "(pick PAGE dividing S, e.g. 16)")
    if (2 * KVD) % BF16_PER_VECTOR:
        raise BadInput(f"kv_transfer: KVD={KVD} must be a multiple of {BF16_PER_VECTOR // 2} so each token's "
                       f"[K | V] row (2*KVD bf16) moves as whole {VECTOR_BYTES}-byte vectors")
    if D % BF16_PER_VECTOR:
        raise BadInput(f"kv_transfer: D={D} must be a multiple of {BF16_PER_VECTOR} (16-byte aligned rows of h "
                       "for the tensor-core GEMM)")


def _dims(params: Params, world: int) -> tuple[int, int, int, int, int]:
    validate(params, world)
    return tuple(int(params[n]) for n in ("L", "S", "D", "KVD", "PAGE"))  # type: ignore[return-value]


def n_pages(params: Params, world: int) -> int:
    """Entries of the page table: S/PAGE, or 1 (an unused placeholder) for the contiguous cache."""
    _, S, _, _, PAGE = _dims(params, world)
    return S // PAGE if PAGE else 1


def is_decode(world: int, rank: int) -> bool:
    return world == 1 or rank != PREFILL_RANK


def is_prefill(world: int, rank: int) -> bool:
    return rank == PREFILL_RANK


def h_shape(params: Params, world: int) -> tuple[int, int]:
    _, S, D, _, _ = _dims(params, world)
    return (S, D)


def wkv_shape(params: Params, world: int) -> tuple[int, int, int]:
    L, _, D, KVD, _ = _dims(params, world)
    return (L, D, 2 * KVD)


def page_table_shape(params: Params, world: int) -> tuple[int]:
    return (n_pages(params, world),)


def kv_cache_shape(params: Params, world: int) -> tuple[int, ...]:
    L, S, _, KVD, PAGE = _dims(params, world)
    return (L, S // PAGE, PAGE, 2 * KVD) if PAGE else (L, S, 2 * KVD)


def _nbytes(shape: Sequence[int], elem_bytes: int) -> int:
    return math.prod(shape) * elem_bytes


def h_valid(params: Params, world: int, rank: int) -> int:
    return _nbytes(h_shape(params, world), BF16_BYTES) if is_prefill(world, rank) else 0


def wkv_valid(params: Params, world: int, rank: int) -> int:
    return _nbytes(wkv_shape(params, world), BF16_BYTES) if is_prefill(world, rank) else 0


def page_table_valid(params: Params, world: int, rank: int) -> int:
    if not int(params["PAGE"]) or not is_decode(world, rank):
        return 0
    return _nbytes(page_table_shape(params, world), I32_BYTES)


def kv_cache_valid(params: Params, world: int, rank: int) -> int:
    return _nbytes(kv_cache_shape(params, world), BF16_BYTES) if is_decode(world, rank) else 0


def stage_bytes(params: Params, world: int) -> int:
    """Bytes of the "kv_stage" scratch window the candidates declare: every layer's KV_l, bf16, [L, S, 2*KVD]."""
    L, S, _, KVD, _ = _dims(params, world)
    return L * S * 2 * KVD * BF16_BYTES


def make_inputs(params: Params, world: int, rank: int, generator: Any) -> dict[str, Any]:
    """h ~ N(0, 1), wkv ~ N(0, 1/D) (fan-in init, so KV ~ N(0, 1) at every size), drawn in fp32 and rounded to
    bf16 so kernels and reference see the same exact values; NaN where the rank is not the prefill rank. The page
    table is a random permutation of the physical pages, drawn on every rank (each rank owns its own cache)."""
    import torch

    device = generator.device
    hs, ws = h_shape(params, world), wkv_shape(params, world)
    if is_prefill(world, rank):
        h = torch.randn(hs, generator=generator, device=device, dtype=torch.float32)
        w = torch.randn(ws, generator=generator, device=device, dtype=torch.float32) / math.sqrt(hs[1])
    else:
        h = torch.full(hs, math.nan, device=device, dtype=torch.float32)
        w = torch.full(ws, math.nan, device=device, dtype=torch.float32)
    if int(params["PAGE"]):
        table = torch.randperm(n_pages(params, world), generator=generator, device=device)
    else:
        table = torch.zeros(1, device=device, dtype=torch.int64)  # contiguous: page 0 holds the whole sequence
    return {"h": h.to(torch.bfloat16), "wkv": w.to(torch.bfloat16), "page_table": table.to(torch.int32)}


def layer_kv(h: Any, wkv: Any) -> Any:
    """KV for every layer, [L, S, 2*KVD]: h @ wkv[l], in float64 on CPU and float32 elsewhere (both far more
    precise than the bf16 cache)."""
    import torch

    acc = torch.float64 if h.device.type == "cpu" else torch.float32
    return h.to(acc).unsqueeze(0) @ wkv.to(device=h.device, dtype=acc)


def to_cache(kv: Any, page_table: Any, params: Params, world: int) -> Any:
    """Place KV [L, S, 2*KVD] into a cache of kv_cache_shape: logical page j -> physical page page_table[j]."""
    import torch

    L, S, _, KVD, PAGE = _dims(params, world)
    if not PAGE:
        return kv
    pages = kv.reshape(L, S // PAGE, PAGE, 2 * KVD)
    cache = torch.empty_like(pages)
    cache[:, page_table.to(device=kv.device, dtype=torch.int64)] = pages
    return cache


def reference(inputs: Sequence[Mapping[str, Any]], params: Params, world: int) -> list[dict[str, Any]]:
    """Every decode rank's cache holds rank 0's KV placed by that rank's own page table; the prefill rank
    (W >= 2) has an empty reference (valid_bytes 0: nothing of it is verified). Returned in float32."""
    import torch

    if len(inputs) != world:
        raise BadInput(f"kv_transfer reference: got inputs of {len(inputs)} ranks for world size {world}")
    src = inputs[PREFILL_RANK]
    if tuple(src["h"].shape) != h_shape(params, world) or tuple(src["wkv"].shape) != wkv_shape(params, world):
        raise BadInput(f"kv_transfer reference: h {tuple(src['h'].shape)} / wkv {tuple(src['wkv'].shape)} do not "
                       f"match {h_shape(params, world)} / {wkv_shape(params, world)}")
    kv = layer_kv(src["h"], src["wkv"])
    out: list[dict[str, Any]] = []
    for r in range(world):
        if is_decode(world, r):
            cache = to_cache(kv, inputs[r]["page_table"], params, world)
            out.append({"kv_cache": cache.to(torch.float32)})
        else:
            out.append({"kv_cache": torch.empty(0, dtype=torch.float32, device=kv.device)})
    return out


def flops(params: Params, world: int) -> float:
    """Floating-point operations of the prefill rank per step (the critical path): L GEMMs [S,D] x [D,2*KVD]."""
    L, S, D, KVD, _ = _dims(params, world)
    return 2.0 * L * S * D * 2 * KVD


def comm_bytes(params: Params, world: int) -> float:
    """Bytes each decode rank receives per step (0 at world size 1, where the transfer is a local copy)."""
    return 0.0 if world == 1 else float(stage_bytes(params, world))


WORKLOAD = Workload(
    name="kv_transfer",
    directory=Path(__file__).resolve().parent,
    description="Disaggregated prefill -> decode: rank 0 computes KV_l = H @ Wkv_l per layer (bf16 tensor cores) "
                "and ships it into every decode rank's KV cache (contiguous or paged by a page table).",
    params=dict(DEFAULT_PARAMS),
    tensors=[
        TensorSpec("h", "input", "bf16", h_shape, valid_bytes=h_valid),
        TensorSpec("wkv", "input", "bf16", wkv_shape, valid_bytes=wkv_valid),
        TensorSpec("page_table", "input", "i32", page_table_shape, valid_bytes=page_table_valid),
        TensorSpec("kv_cache", "output", "bf16", kv_cache_shape, valid_bytes=kv_cache_valid),
    ],
    reference=reference,
    tolerance=Tolerance(rel=REL_TOLERANCE),
    make_inputs=make_inputs,
    flops=flops,
    comm_bytes=comm_bytes,
    size_presets={k: dict(v) for k, v in SIZE_PRESETS.items()},
    check_presets=("small_paged", "small"),  # the gpu tier's; the quick form runs the first
)
