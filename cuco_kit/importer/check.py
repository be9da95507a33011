"""`cuco check-workload DIR`: what a workload folder still lacks, or where it contradicts itself.

Checked on a CPU machine: workload.py loads; no ``TODO(cuco init)`` place is left; the tolerance is a finite,
non-negative number; there is a small size preset; the reference runs on the CPU at the small preset on 1 and 2
ranks and returns, for every rank, every output with the shape its spec gives; the import plan (when the folder
has one) agrees with the tensor specs; every tensor is used by the seed; the seed compiles (when nvcc is here).
Each finding is one line; nothing is fixed silently.
"""
from __future__ import annotations

import math
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cuco_kit.errors import BadInput
from cuco_kit.evaluate.build import build, for_workload
from cuco_kit.importer.plan import ImportPlan, check_plan
from cuco_kit.importer.seed_writer import TODO
from cuco_kit.importer.workload_writer import PLAN_FILE
from cuco_kit.workload import Workload, load_workload

SMALL = "small"
WORLDS = (1, 2)


@dataclass
class Finding:
    status: str  # ok | todo | error | skipped
    what: str
    message: str

    def line(self) -> str:
        return f"{self.status:7s} {self.what}: {self.message}"


@dataclass
class WorkloadCheck:
    directory: str
    findings: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(f.status in ("ok", "skipped") for f in self.findings)

    def problems(self) -> list[Finding]:
        return [f for f in self.findings if f.status in ("todo", "error")]

    def text(self) -> str:
        return "\n".join(f.line() for f in self.findings)


def _torch_dtype(name: str) -> Any:
    import torch

    return {"u8": torch.uint8, "i32": torch.int32, "i64": torch.int64, "f16": torch.float16,
            "bf16": torch.bfloat16, "f32": torch.float32, "fp8_e4m3": torch.float32}[name]


def cpu_inputs(wl: Workload, params: dict[str, int], world: int, seed: int = 0) -> list[dict[str, Any]]:
    """Every rank's inputs on the CPU, as the harness would draw them (the workload's make_inputs, else
    scale * N(0, 1), integers in [0, 8))."""
    import torch

    out = []
    for r in range(world):
        g = torch.Generator().manual_seed(seed * 1000 + r)
        made = dict(wl.make_inputs(params, world, r, g)) if wl.make_inputs is not None else {}
        ins: dict[str, Any] = {}
        for s in wl.tensors:
            if s.role == "output":
                continue
            if s.name in made:
                ins[s.name] = made[s.name]
                continue
            dims = s.dims(params, world)
            if s.dtype in ("i32", "i64", "u8"):
                ins[s.name] = torch.randint(0, 8, dims, generator=g).to(_torch_dtype(s.dtype))
            else:
                ins[s.name] = (s.scale * torch.randn(dims, generator=g)).to(_torch_dtype(s.dtype))
        out.append(ins)
    return out


def reference_problems(wl: Workload, params: dict[str, int], world: int) -> list[str]:
    """What is wrong with the reference's answer at `params` on `world` ranks (empty: nothing)."""
    import torch

    try:
        outs = wl.reference(cpu_inputs(wl, params, world), params, world)
    except Exception as exc:  # noqa: BLE001 -- whatever the reference raises is the finding
        return [f"the reference raised {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''} "
                f"(on {world} rank(s) at {params})"]
    if len(outs) != world:
        return [f"the reference returned {len(outs)} rank(s) of outputs for {world} rank(s)"]
    problems = []
    want = [s for s in wl.tensors if s.role in ("output", "inout")]
    for r, o in enumerate(outs):
        for s in want:
            t = o.get(s.name) if hasattr(o, "get") else None
            if not isinstance(t, torch.Tensor):
                problems.append(f"rank {r}: the reference returned no tensor {s.name!r}")
                continue
            dims = s.dims(params, world)
            if t.numel() != math.prod(dims):
                problems.append(f"rank {r}: {s.name!r} has shape {tuple(t.shape)}, the spec says {dims}")
            elif t.is_floating_point() and not bool(torch.isfinite(t).all()):
                problems.append(f"rank {r}: {s.name!r} holds NaN or inf")
    return problems


def _seed_files(wl: Workload) -> list[Path]:
    return [wl.path(f) for f in dict.fromkeys(wl.seeds.values())]


def check_workload(directory: str | Path, *, compile_seed: bool = True,
                   builder: Callable[..., Any] | None = None) -> WorkloadCheck:
    """Every finding about the folder (see the module doc). `builder(code, backend, cfg)` replaces nvcc in
    tests."""
    d = Path(directory)
    report = WorkloadCheck(str(d))
    add = report.findings.append
    try:
        wl = load_workload(d)
    except BadInput as exc:
        add(Finding("error", "workload.py", str(exc)))
        return report
    add(Finding("ok", "workload.py", f"loads: {wl.name}, {len(wl.tensors)} tensor(s), sizes "
                                     + ", ".join(f"{k}={v}" for k, v in wl.params.items())))
    for f in sorted(d.glob("*.py")) + sorted(d.glob("*.cu")):
        for no, text in enumerate(f.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if TODO in text:
                add(Finding("todo", f"{f.name}:{no}", text.strip().lstrip("#/* ").strip()[:160]))
    tol = wl.tolerance.rel
    if not (isinstance(tol, int | float) and math.isfinite(tol) and tol >= 0):
        add(Finding("error", "tolerance", f"rel={tol!r}: set a finite, non-negative relative error"))
    else:
        add(Finding("ok", "tolerance", f"rel={tol:g}"))
    if SMALL not in wl.size_presets:
        add(Finding("error", "presets", f"no {SMALL!r} size preset: add one small enough for 2-4 ranks on one GPU"))
        small = wl.resolve()
    else:
        small = wl.resolve(wl.size_presets[SMALL])
        add(Finding("ok", "presets", ", ".join(wl.size_presets)))
    for world in WORLDS:
        try:
            params = wl.check(small, world)
        except BadInput as exc:
            add(Finding("error", f"sizes on {world} rank(s)", str(exc)))
            continue
        problems = reference_problems(wl, params, world)
        for p in problems:
            add(Finding("error", f"reference on {world} rank(s)", p))
        if not problems:
            add(Finding("ok", f"reference on {world} rank(s)", "runs on the CPU at the small preset; output "
                                                                "shapes agree with the specs"))
    plan_path = d / PLAN_FILE
    if plan_path.is_file():
        try:
            plan = ImportPlan.load(plan_path)
            for p in check_plan(plan):
                add(Finding("error", PLAN_FILE, p))
            specs = {s.name: (s.role, s.dtype) for s in wl.tensors}
            planned = {b.name: (b.role, b.dtype) for b in plan.tensors()}
            if specs != planned:
                add(Finding("error", PLAN_FILE, f"the plan's tensors {planned} differ from workload.py's {specs}; "
                                                "run cuco init again with the plan, or fix one of them"))
        except BadInput as exc:
            add(Finding("error", PLAN_FILE, str(exc)))
    for seed in _seed_files(wl):
        if not seed.is_file():
            add(Finding("error", seed.name, "missing"))
            continue
        code = seed.read_text(encoding="utf-8", errors="replace")
        unused = [s.name for s in wl.tensors if not re.search(rf'"{re.escape(s.name)}"', code)]
        if unused:
            add(Finding("error", seed.name, f"never looks up tensor(s) {', '.join(unused)} (cuco_tensor(ctx, "
                                            "\"name\")): the port dropped a buffer"))
        if not compile_seed:
            continue
        if builder is None and shutil.which("nvcc") is None:
            add(Finding("skipped", seed.name, "not compiled: no nvcc on this machine"))
            continue
        backend = next(b for b, f in wl.seeds.items() if wl.path(f) == seed)
        cfg = for_workload(None, d)
        r = (builder or build)(code, backend, cfg)
        if r.ok:
            add(Finding("ok", seed.name, f"compiles for {backend}"))
        else:
            last = [ln for ln in (r.log or "").splitlines() if "error" in ln][:1]
            add(Finding("error", seed.name, f"does not compile for {backend}: {last[0] if last else 'see the log'}"))
    return report
