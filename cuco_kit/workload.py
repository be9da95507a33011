"""Workloads: what a candidate computes, on which tensors and sizes, and how the harness checks it.

A workload is a folder under ``sample_kernels/`` holding the seeds, the device-initiated baseline and a
``workload.py`` that defines ``WORKLOAD = Workload(...)``. The harness reads everything it needs from here:
tensor shapes per rank, how to fill inputs (fresh per trial and rank, never zeros), the torch reference and the
tolerance. Nothing here imports CUDA-only packages at module load, so workloads load on a CPU machine too.
"""
from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import math
import re
import threading
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from cuco_kit.errors import BadInput

Params = Mapping[str, int]
Role = Literal["input", "output", "inout"]

# The most ranks a world may have (CUCO_MAX_RANKS in cuco_abi.h).
MAX_RANKS = 64
# Parameters travel to the candidate as int64_t (cuco_ctx_t.params in cuco_abi.h).
MAX_PARAM = 2**63 - 1
# No GPU holds more than this per rank: a size whose tensors need more is a typo, refused before any work.
MAX_BYTES_PER_RANK = 1 << 40

# Which time scores (Workload.timing; docs/timing.md): the step's device time with its launches queued ahead of
# it, or the end-to-end time that includes the host's launches.
TIMINGS = ("device", "end_to_end")
# The file-name convention of a workload folder: these are its seeds and its baseline when workload.py names none,
# so a folder copied from a sample needs no list edited anywhere.
SEED_FILES = {"nccl": "seed_nccl.cu", "symm": "seed_copy.cu"}
BASELINE_FILE = "device_lsa.cu"
# The folder's device-initiated variant over GIN (one-sided puts and signals), when it has one: a second starting
# point of API type "gin" (cuco_kit.search.api_type), checked under symm through runtime/gin_compat.h.
GIN_BASELINE_FILE = "device_gin.cu"
SAMPLES_DIR = "sample_kernels"  # the repository's sample workloads, one folder each

# What a candidate's outputs are checked against (Workload.oracle; docs/contracts.md): the workload's torch
# reference, or the workload's own seed run on the same fresh inputs in the same world (differential
# verification, for an imported program whose reference nobody has written yet).
Oracle = Literal["reference", "seed"]
ORACLES: tuple[str, ...] = ("reference", "seed")
ORACLE_LABELS = {"reference": "the torch reference", "seed": "the seed's outputs (differential)"}

# workload.py runs in the process that loads it: one that has not finished after this long (a loop, or a wait that
# never ends, at module level) is refused rather than hanging the command. Generous: a module may import torch.
LOAD_TIMEOUT_S = 60.0

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
    # backend -> seed file name; empty: SEED_FILES, those of them the folder has
    seeds: dict[str, str] = field(default_factory=dict)
    # the device-initiated baseline in NCCL-LSA form (has the knob block); None: BASELINE_FILE if the folder has it
    baseline: str | None = None
    # the device-initiated variant over GIN; None: GIN_BASELINE_FILE if the folder has it
    gin_baseline: str | None = None
    flops: Callable[[Params, int], float] | None = None  # per rank, for the METHOD floor
    comm_bytes: Callable[[Params, int], float] | None = None  # bytes each rank receives per step
    size_presets: dict[str, dict[str, int]] = field(default_factory=dict)
    # Which time scores (docs/timing.md): "device" (the step's device time with its launches queued ahead of it,
    # the default) or "end_to_end" (host launches included: for workloads where launch overhead is the point).
    # Both are measured and reported either way.
    timing: str = "device"
    # What verification compares with (ORACLES): "reference" (the torch reference above, the default) or "seed"
    # (the seed for the evaluated backend, run by the harness on the same inputs in the same world just before
    # the candidate; the seed itself is then not verified, only run). An imported program starts with "seed".
    oracle: Oracle = "reference"
    # The size presets the gpu tier checks the seeds and the baseline at (L2, 1 and 2 ranks); the first is the one
    # its quick form runs. Each must be a key of size_presets (sample_workloads' callers check).
    check_presets: tuple[str, ...] = ("small",)

    def __post_init__(self) -> None:
        if self.directory is not None:  # None until load_workload sets it (it applies the convention then)
            self.find_sources()
        if self.timing not in TIMINGS:
            raise BadInput(f"workload {self.name}: timing {self.timing!r}; use one of {', '.join(TIMINGS)}")
        if self.oracle not in ORACLES:
            raise BadInput(f"workload {self.name}: oracle {self.oracle!r}; use one of {', '.join(ORACLES)}")

    def find_sources(self) -> None:
        """The file-name convention: seeds and baselines the workload does not name are SEED_FILES, BASELINE_FILE
        and GIN_BASELINE_FILE, those of them its folder has."""
        if not self.seeds:
            self.seeds = {b: f for b, f in SEED_FILES.items() if (self.directory / f).is_file()}
        if self.baseline is None and (self.directory / BASELINE_FILE).is_file():
            self.baseline = BASELINE_FILE
        if self.gin_baseline is None and (self.directory / GIN_BASELINE_FILE).is_file():
            self.gin_baseline = GIN_BASELINE_FILE

    def resolve(self, overrides: Mapping[str, int] | None = None) -> dict[str, int]:
        """Default parameters with overrides applied; unknown names are an error, not silently ignored."""
        out = dict(self.params)
        for k, v in (overrides or {}).items():
            if k not in out:
                raise BadInput(f"workload {self.name}: unknown parameter {k!r}; known: {', '.join(out)}")
            out[k] = int(v)
        return out

    def check(self, overrides: Mapping[str, int] | None, world: int) -> dict[str, int]:
        """The resolved parameters, after checking that they make sense on `world` ranks: the world size is in
        range, every tensor's shape can be computed (a workload's own validation raises BadInput), no dimension
        is zero or negative and the tensors fit a GPU. BadInput (one line) otherwise; nothing is built or run."""
        if not 1 <= world <= MAX_RANKS:
            raise BadInput(f"{world} ranks: a world has 1 to {MAX_RANKS} ranks")
        params = self.resolve(overrides)
        sizes = ", ".join(f"{k}={v}" for k, v in params.items())
        total = 0
        for t in self.tensors:
            try:
                dims = t.dims(params, world)
            except BadInput:
                raise
            except Exception as exc:  # noqa: BLE001 -- a workload's shape function failing is bad input
                raise BadInput(f"workload {self.name}: tensor {t.name!r} has no shape for {sizes} on {world} "
                               f"rank(s) ({type(exc).__name__}: {exc})") from None
            if any(d <= 0 for d in dims):
                raise BadInput(f"workload {self.name}: {sizes} on {world} rank(s) gives tensor {t.name!r} the shape "
                               f"{dims}; sizes must make every dimension positive")
            total += t.capacity_bytes(params, world)
        if total > MAX_BYTES_PER_RANK:
            raise BadInput(f"workload {self.name}: {sizes} on {world} rank(s) needs {total / 2**30:,.0f} GiB per rank "
                           f"(more than {MAX_BYTES_PER_RANK >> 30} GiB); pick smaller sizes")
        return params

    def path(self, filename: str) -> Path:
        return self.directory / filename

    def seed_for(self, backend: str) -> Path:
        if backend not in self.seeds:
            raise BadInput(f"workload {self.name}: no seed for backend {backend!r}; has {sorted(self.seeds)}")
        return self.path(self.seeds[backend])


def sample_workloads(root: str | Path) -> list[Path]:
    """The sample workload folders of the repository at ``root`` (``sample_kernels/<name>/`` with a workload.py),
    sorted by name: what the gpu tier's sample tests, the race amplification and the stress-build test cover, so
    a new folder is covered with no list to edit."""
    return sorted(p.parent for p in (Path(root) / SAMPLES_DIR).glob("*/workload.py"))


def load_workload(directory: str | Path) -> Workload:
    """Import ``<directory>/workload.py`` and return its ``WORKLOAD``.

    workload.py is trusted code: it runs here, in the calling process, with its environment (docs/architecture.md,
    the trust boundary). What is bounded is how it fails: whatever it raises -- ``SystemExit`` included -- and a
    module that does not finish within ``LOAD_TIMEOUT_S`` are one BadInput line; a KeyboardInterrupt stays one."""
    d = Path(directory)
    f = d / "workload.py"
    if not f.is_file():
        raise BadInput(f"{d}: not a workload directory (no workload.py); try sample_kernels/gemm_allgather")
    spec = importlib.util.spec_from_file_location(f"cuco_workload_{d.name}", f)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    loader = spec.loader
    exc = _run_bounded(lambda: loader.exec_module(module), LOAD_TIMEOUT_S,
                       f"{f}: did not finish loading within {LOAD_TIMEOUT_S:g} s (a loop or a wait at module level?); "
                       "fix the file")
    if isinstance(exc, KeyboardInterrupt):
        raise exc
    if isinstance(exc, SyntaxError):  # also a file that is not UTF-8 text
        raise BadInput(f"{f}: cannot be loaded: line {exc.lineno}: {exc.msg}; fix the file") from None
    if isinstance(exc, SystemExit):
        raise BadInput(f"{f}: cannot be loaded: {_where(exc, f)}it called sys.exit({exc.code!r}); a workload.py "
                       "defines WORKLOAD and must not exit; fix the file") from None
    if exc is not None:  # whatever the module raises is the workload's error, not ours
        raise BadInput(f"{f}: cannot be loaded: {_where(exc, f)}{type(exc).__name__}: {exc}; fix the file") \
            from None
    wl = getattr(module, "WORKLOAD", None)
    if not isinstance(wl, Workload):
        raise BadInput(f"{f}: defines no WORKLOAD = Workload(...)")
    wl.directory = d.resolve()
    wl.find_sources()
    return wl


class _Abandoned(BaseException):
    """Raised inside a load that ran out of time, so the code left running there stops at its next step."""


def _run_bounded(body: Callable[[], object], timeout_s: float, too_long: str) -> BaseException | None:
    """Run ``body`` in a helper thread and return what it raised (None when it returned), waiting at most
    ``timeout_s``: a thread can be waited for with a limit from any thread, a notebook's included, where a signal
    cannot. When the time is up the body is abandoned -- :class:`_Abandoned` is raised inside it, which ends a loop
    of Python code at once and a blocking call when it returns -- and BadInput(``too_long``) is raised here."""
    raised: list[BaseException] = []

    def target() -> None:
        try:
            body()
        except BaseException as exc:  # noqa: BLE001 -- handed to the caller, whatever it is
            raised.append(exc)

    thread = threading.Thread(target=target, name="cuco-load-workload", daemon=True)
    thread.start()
    try:
        thread.join(timeout_s)
    finally:  # also when the caller is interrupted while it waits
        if thread.is_alive() and thread.ident is not None:
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(_Abandoned))
    if thread.is_alive():
        raise BadInput(too_long)
    return raised[0] if raised else None


def workload_fingerprint(directory: str | Path) -> str:
    """A hash of the Python files of a workload folder: what a process that loaded it has in memory. Rank
    workers load the workload once when they start, so a change here (a reference approved or edited) means
    they must start again."""
    h = hashlib.sha256()
    for f in sorted(Path(directory).glob("*.py")):
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


_INTEGER = re.compile(r"-?[0-9]+")


def _where(exc: BaseException, f: Path) -> str:
    """"line N: " of the deepest frame of `exc`'s traceback that is in file `f` ("" when none is)."""
    lines = [fr.lineno for fr in traceback.extract_tb(exc.__traceback__) if Path(fr.filename) == f]
    return f"line {lines[-1]}: " if lines else ""


def parse_overrides(items: Sequence[str]) -> dict[str, int]:
    """``["M=4096", "K=1024"]`` -> ``{"M": 4096, "K": 1024}`` (the CLI's --size). Values are integers from 0 to
    the ABI's int64 maximum; whether a value suits the workload is `Workload.check`'s business."""
    out: dict[str, int] = {}
    for item in items:
        name, sep, value = item.partition("=")
        value = value.strip()
        if not sep or not name.strip() or not _INTEGER.fullmatch(value):
            raise BadInput(f"--size {item!r}: expected NAME=INTEGER, e.g. M=4096")
        # The length first: int() of a few thousand digits is refused by Python itself.
        if len(value) > len(str(MAX_PARAM)) or not 0 <= int(value) <= MAX_PARAM:
            raise BadInput(f"--size {item!r}: a size is an integer from 0 to {MAX_PARAM}")
        out[name.strip()] = int(value)
    return out
