"""Workloads: what a candidate computes, on which tensors and sizes, and how the harness checks it.

A workload is a folder under ``sample_kernels/`` holding the seeds, the device-initiated baseline and a
``workload.py`` that defines ``WORKLOAD = Workload(...)``. The harness reads everything it needs from here:
tensor shapes per rank, how to fill inputs (fresh per trial and rank, never zeros), the torch reference and the
tolerance. Nothing here imports CUDA-only packages at module load, so workloads load on a CPU machine too.
"""
from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from cuco_kit.errors import BadInput

Params = Mapping[str, int]
Role = Literal["input", "output", "inout"]

# Sizes of the dtypes the ABI knows (cuco_dtype_t in cuco_abi.h, same order).
DTYPES: dict[str, tuple[int, int]] = {  # name -> (cuco_dtype_t, bytes per element)
    "u8": (0, 1),
    "i32": (1, 4),
    "i64": (2, 8),
    "f16": (3, 2),
    "bf16": (4, 2),
    "f32": (5, 4),
    "fp8_e4m3": (6, 1),
}


@dataclass(frozen=True)
class TensorSpec:
    """One I/O tensor. ``shape`` maps (params, world_size) to this rank's shape; capacity is the same on every
    rank (windows are symmetric). ``valid_bytes`` (optional) maps (params, world, rank) to the bytes that carry
    data this step, for uneven workloads; by default the whole capacity is valid."""

    name: str
    role: Role
    dtype: str
    shape: Callable[[Params, int], Sequence[int]]
    valid_bytes: Callable[[Params, int, int], int] | None = None
    scale: float = 1.0  # inputs are drawn as scale * N(0, 1)

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise BadInput(f"tensor {self.name!r}: unknown dtype {self.dtype!r}; use one of {sorted(DTYPES)}")
        if self.role not in ("input", "output", "inout"):
            raise BadInput(f"tensor {self.name!r}: role must be input, output or inout, not {self.role!r}")

    def dims(self, params: Params, world: int) -> tuple[int, ...]:
        return tuple(int(d) for d in self.shape(params, world))

    def capacity_bytes(self, params: Params, world: int) -> int:
        return math.prod(self.dims(params, world)) * DTYPES[self.dtype][1]


# reference(inputs, params, world) -> outputs, where inputs[r] maps tensor name -> torch tensor of rank r (on
# any device) and the result maps, for every rank r, output name -> expected torch tensor.
Reference = Callable[[Sequence[Mapping[str, Any]], Params, int], Sequence[Mapping[str, Any]]]
# make_inputs(params, world, rank, generator) -> {name: torch tensor}: overrides the default N(0, scale) fill
# where inputs need structure (routing indices, page tables). Must draw from `generator` only.
InputMaker = Callable[[Params, int, int, Any], Mapping[str, Any]]


@dataclass(frozen=True)
class Tolerance:
    """Relative error ||out - ref|| / ||ref|| allowed per output (bf16 operands land between 1e-3 and 1e-2)."""

    rel: float = 2e-2

    def passes(self, rel_err: float) -> bool:
        return math.isfinite(rel_err) and rel_err <= self.rel


@dataclass
class Workload:
    name: str
    directory: Path
    description: str
    params: dict[str, int]
    tensors: list[TensorSpec]
    reference: Reference
    tolerance: Tolerance = field(default_factory=Tolerance)
    make_inputs: InputMaker | None = None
    # backend -> seed file name, e.g. {"nccl": "seed_nccl.cu", "symm": "seed_copy.cu"}
    seeds: dict[str, str] = field(default_factory=dict)
    baseline: str | None = None  # the device-initiated baseline in NCCL-LSA form (has the knob block)
    flops: Callable[[Params, int], float] | None = None  # per rank, for the METHOD floor
    comm_bytes: Callable[[Params, int], float] | None = None  # bytes each rank receives per step
    size_presets: dict[str, dict[str, int]] = field(default_factory=dict)

    def resolve(self, overrides: Mapping[str, int] | None = None) -> dict[str, int]:
        """Default parameters with overrides applied; unknown names are an error, not silently ignored."""
        out = dict(self.params)
        for k, v in (overrides or {}).items():
            if k not in out:
                raise BadInput(f"workload {self.name}: unknown parameter {k!r}; known: {', '.join(out)}")
            out[k] = int(v)
        return out

    def path(self, filename: str) -> Path:
        return self.directory / filename

    def seed_for(self, backend: str) -> Path:
        if backend not in self.seeds:
            raise BadInput(f"workload {self.name}: no seed for backend {backend!r}; has {sorted(self.seeds)}")
        return self.path(self.seeds[backend])


def load_workload(directory: str | Path) -> Workload:
    """Import ``<directory>/workload.py`` and return its ``WORKLOAD``."""
    d = Path(directory)
    f = d / "workload.py"
    if not f.is_file():
        raise BadInput(f"{d}: not a workload directory (no workload.py); try sample_kernels/gemm_allgather")
    spec = importlib.util.spec_from_file_location(f"cuco_workload_{d.name}", f)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    wl = getattr(module, "WORKLOAD", None)
    if not isinstance(wl, Workload):
        raise BadInput(f"{f}: defines no WORKLOAD = Workload(...)")
    wl.directory = d.resolve()
    return wl


def parse_overrides(items: Sequence[str]) -> dict[str, int]:
    """``["M=4096", "K=1024"]`` -> ``{"M": 4096, "K": 1024}`` (the CLI's --size)."""
    out: dict[str, int] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name or not value.strip().lstrip("-").isdigit():
            raise BadInput(f"--size {item!r}: expected NAME=INTEGER, e.g. M=4096")
        out[name.strip()] = int(value)
    return out
