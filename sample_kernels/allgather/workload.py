"""All-gather: the minimal workload the harness is checked with.

Every rank holds x, a vector of N_PER_RANK bf16 values; afterwards every rank's y (world * N_PER_RANK) is the
concatenation of all ranks' x in rank order. Pure data movement, so the reference is exact and the tolerance
is zero: a copy either delivered every byte or it did not.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cuco_kit.workload import Params, TensorSpec, Tolerance, Workload

BF16_BYTES = 2


def _reference(inputs: Sequence[Mapping[str, Any]], params: Params, world: int) -> list[dict[str, Any]]:
    import torch  # lazily: workloads load on machines without torch

    gathered = torch.cat([inputs[r]["x"].reshape(-1) for r in range(world)])
    return [{"y": gathered} for _ in range(world)]


WORKLOAD = Workload(
    name="allgather",
    directory=Path(__file__).resolve().parent,
    description="y = concat over ranks of x (bf16); the harness's minimal device-initiated workload",
    params={"N_PER_RANK": 1 << 24},
    tensors=[
        TensorSpec("x", "input", "bf16", shape=lambda p, w: (p["N_PER_RANK"],)),
        TensorSpec("y", "output", "bf16", shape=lambda p, w: (w * p["N_PER_RANK"],)),
    ],
    reference=_reference,
    tolerance=Tolerance(rel=0.0),
    flops=lambda p, w: 0.0,
    comm_bytes=lambda p, w: float((w - 1) * p["N_PER_RANK"] * BF16_BYTES),
    size_presets={
        "tiny": {"N_PER_RANK": 1 << 12},
        "small": {"N_PER_RANK": 1 << 20},
        "default": {"N_PER_RANK": 1 << 24},
        "large": {"N_PER_RANK": 1 << 26},
    },
)
