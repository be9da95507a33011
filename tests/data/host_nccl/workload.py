"""Every host NCCL call the symm backend serves, in one step (host_nccl_ops.cu), checked against torch.

World size W, sizes N, M (elements) and the ring's S, D, T, U. Inputs per rank: x (N f32), xb (N bf16) and
xw (W*M f32, one block of M per peer). Outputs per rank r:
    sum_f32, max_f32   all-reduce of x (sum, max)                          [N]
    sum_bf16, max_bf16 all-reduce of xb (sum in place, max)                [N] bf16
    ag                 all-gather of x, in place                           [W*N]
    rs                 reduce-scatter (sum) of xw: block r of the sum      [M]
    a2a                all-to-all of xw: block q from rank q's block r     [W*M]
    bc                 broadcast of x from rank W-1                        [N]
    red                reduce (sum) of x to rank 0; zeros elsewhere        [N]
    gat                gather of x to rank 0; zeros elsewhere              [W*N]
    sct                scatter of xw from rank W-1: its block r            [M]
    ring               one group, receives on a side stream: from rank r-1 its x[0, S_{r-1}) (zero-padded to
                       S_max) and x[S_{r-1}, S_{r-1}+T), then x[0, U) sent to itself; S_q = S + D*q, so every pair
                       moves a different number of bytes           [S_max + T + U]
With the program's chunk cap (16 KiB) every collective and every send runs in several chunks.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cuco_kit.errors import BadInput
from cuco_kit.workload import Params, TensorSpec, Workload


def ring_sizes(p: Params, world: int) -> tuple[int, int]:
    """(S_max, length of the ring output)."""
    s_max = p["S"] + p["D"] * (world - 1)
    if s_max + p["T"] > p["N"] or p["U"] > p["N"]:
        raise BadInput(f"host_nccl_ops: S + D*(W-1) + T = {s_max + p['T']} and U = {p['U']} must not exceed "
                       f"N = {p['N']} on {world} ranks")
    return s_max, s_max + p["T"] + p["U"]


def _reference(inputs: Sequence[Mapping[str, Any]], p: Params, world: int) -> list[dict[str, Any]]:
    import torch  # lazily: workloads load on machines without torch

    N, M, T, U = p["N"], p["M"], p["T"], p["U"]
    xs = [i["x"] for i in inputs]
    xbs = [i["xb"] for i in inputs]
    xws = [i["xw"].reshape(world, M) for i in inputs]
    sum_x = torch.stack(xs).sum(0)
    s_max, ring_len = ring_sizes(p, world)
    out = []
    for r in range(world):
        prev = (r + world - 1) % world
        s_prev = p["S"] + p["D"] * prev
        ring = torch.zeros(ring_len, device=xs[0].device)
        ring[:s_prev] = xs[prev][:s_prev]
        ring[s_max:s_max + T] = xs[prev][s_prev:s_prev + T]
        ring[s_max + T:] = xs[r][:U]
        out.append({
            "sum_f32": sum_x,
            "max_f32": torch.stack(xs).amax(0),
            "sum_bf16": torch.stack(xbs).sum(0),
            "max_bf16": torch.stack(xbs).amax(0),
            "ag": torch.cat(xs),
            "rs": torch.stack([xw[r] for xw in xws]).sum(0),
            "a2a": torch.cat([xw[r] for xw in xws]),
            "bc": xs[world - 1],
            "red": sum_x if r == 0 else torch.zeros(N, device=sum_x.device),
            "gat": torch.cat(xs) if r == 0 else torch.zeros(world * N, device=sum_x.device),
            "sct": xws[world - 1][r],
            "ring": ring,
        })
    return out


def _n(p: Params, w: int) -> tuple[int]:
    return (p["N"],)


def _m(p: Params, w: int) -> tuple[int]:
    return (p["M"],)


def _wn(p: Params, w: int) -> tuple[int]:
    return (w * p["N"],)


def _wm(p: Params, w: int) -> tuple[int]:
    return (w * p["M"],)


WORKLOAD = Workload(
    name="host_nccl_ops",
    directory=Path(__file__).resolve().parent,
    description="every host NCCL call served under symm, checked against torch (tests only)",
    params={"N": 24576, "M": 6144, "S": 5000, "D": 1701, "T": 3001, "U": 2500},
    tensors=[
        TensorSpec("x", "input", "f32", _n),
        TensorSpec("xb", "input", "bf16", _n),
        TensorSpec("xw", "input", "f32", _wm),
        TensorSpec("sum_f32", "output", "f32", _n),
        TensorSpec("max_f32", "output", "f32", _n),
        TensorSpec("sum_bf16", "output", "bf16", _n),
        TensorSpec("max_bf16", "output", "bf16", _n),
        TensorSpec("ag", "output", "f32", _wn),
        TensorSpec("rs", "output", "f32", _m),
        TensorSpec("a2a", "output", "f32", _wm),
        TensorSpec("bc", "output", "f32", _n),
        TensorSpec("red", "output", "f32", _n),
        TensorSpec("gat", "output", "f32", _wn),
        TensorSpec("sct", "output", "f32", _m),
        TensorSpec("ring", "output", "f32", lambda p, w: (ring_sizes(p, w)[1],)),
    ],
    reference=_reference,
    seeds={"nccl": "host_nccl_ops.cu", "symm": "host_nccl_ops.cu"},
    size_presets={"small": {}, "large": {"N": 6 << 20, "M": 3 << 20, "S": 3 << 20, "D": 333331, "T": 1 << 19,
                                         "U": 1 << 18}},
)
