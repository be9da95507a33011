"""`cuco check-workload DIR`: what a workload folder still lacks, or where it contradicts itself.

Checked on a CPU machine: workload.py loads; what it verifies against (the oracle: the seed's outputs until a
reference is approved, then the reference); no ``TODO(cuco init)`` place is left (the reference stub is one
finding, the tolerance to confirm another); the tolerance is a finite, non-negative number; there is a small size
preset; a written reference runs on the CPU at the small preset on 1 and 2 ranks (those the program runs on) and
returns, for every rank, every output with the shape its spec gives; the import plan (when the folder has one)
agrees with the tensor specs; every tensor is used by the seed; the seed compiles for every backend it serves
(when nvcc is here). Each finding is one line; nothing is fixed silently.
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
from cuco_kit.importer.workload_writer import PLAN_FILE, REFERENCE_END, REFERENCE_START
from cuco_kit.workload import ORACLE_LABELS, Workload, load_workload

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


def reference_worlds(plan: ImportPlan | None) -> list[int]:
    """The world sizes a reference is tried on: 1 and 2 ranks, or those of them the program runs on, or else the
    smallest world it runs on (a program that refuses other world sizes says so in its plan)."""
    if plan is None or not plan.worlds:
        return list(WORLDS)
    return [w for w in WORLDS if w in plan.worlds] or [min(plan.worlds)]


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


def _todo_findings(d: Path) -> tuple[list[Finding], bool]:
    """One finding per TODO place of the folder's files; the reference stub's lines are one finding, the
    tolerance to confirm another. Also whether the reference is still the stub."""
    out: list[Finding] = []
    stub = False
    for f in sorted(d.glob("*.py")) + sorted(d.glob("*.cu")):
        text = f.read_text(encoding="utf-8", errors="replace")
        block = (text.index(REFERENCE_START), text.index(REFERENCE_END)) if f.name == "workload.py" and \
            REFERENCE_START in text and REFERENCE_END in text else (-1, -1)
        offset = 0
        for no, line in enumerate(text.splitlines(keepends=True), 1):
            inside = block[0] <= offset < block[1]
            offset += len(line)
            if TODO not in line:
                continue
            if inside and line.lstrip().startswith("TOLERANCE"):
                continue  # reported with the tolerance
            if inside:
                if not stub:
                    out.append(Finding("todo", "reference", "not written yet (workload.py): cuco init --llm, "
                                                            "notebook 06, or write reference() there"))
                stub = True
                continue
            out.append(Finding("todo", f"{f.name}:{no}", line.strip().lstrip("#/* ").strip()[:160]))
    return out, stub


def _tolerance_line(d: Path) -> str:
    text = (d / "workload.py").read_text(encoding="utf-8", errors="replace")
    return next((ln for ln in text.splitlines() if ln.lstrip().startswith("TOLERANCE")), "")


def _builds(wl: Workload) -> list[tuple[Path, str]]:
    """(seed file, backend) for every backend the workload has a seed for."""
    return [(wl.path(f), backend) for backend, f in wl.seeds.items()]


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
    todos, stub = _todo_findings(d)
    differential = wl.oracle == "seed"
    add(Finding("ok", "oracle", f"verification uses {ORACLE_LABELS[wl.oracle]}"
                + (" until a reference is approved" if differential else "")))
    report.findings += todos
    tol = wl.tolerance.rel
    if not (isinstance(tol, int | float) and math.isfinite(tol) and tol >= 0):
        add(Finding("error", "tolerance", f"rel={tol!r}: set a finite, non-negative relative error"))
    elif TODO in _tolerance_line(d):
        add(Finding("todo", "tolerance", f"rel={tol:g}, derived from the output dtypes and the reduction lengths "
                                         "(workload.py says how): confirm it or set your own"))
    else:
        add(Finding("ok", "tolerance", f"rel={tol:g}"))
    if SMALL not in wl.size_presets:
        add(Finding("error", "presets", f"no {SMALL!r} size preset: add one small enough for 2-4 ranks on one GPU"))
        small = wl.resolve()
    else:
        small = wl.resolve(wl.size_presets[SMALL])
        add(Finding("ok", "presets", ", ".join(wl.size_presets)))
    plan_path = d / PLAN_FILE
    plan: ImportPlan | None = None
    if plan_path.is_file():
        try:
            plan = ImportPlan.load(plan_path)
        except BadInput as exc:
            add(Finding("error", PLAN_FILE, str(exc)))
    for world in reference_worlds(plan):
        try:
            params = wl.check(small, world)
        except BadInput as exc:
            add(Finding("error", f"sizes on {world} rank(s)", str(exc)))
            continue
        if stub and differential:
            add(Finding("skipped", f"reference on {world} rank(s)", "none yet: the seed is the oracle"))
            continue
        problems = reference_problems(wl, params, world)
        for p in problems:
            add(Finding("error", f"reference on {world} rank(s)", p))
        if not problems:
            add(Finding("ok", f"reference on {world} rank(s)", "runs on the CPU at the small preset; output "
                                                                "shapes agree with the specs"))
    if plan is not None:
        for p in check_plan(plan):
            add(Finding("error", PLAN_FILE, p))
        specs = {s.name: (s.role, s.dtype) for s in wl.tensors}
        planned = {b.name: (b.role, b.dtype) for b in plan.tensors()}
        if specs != planned:
            add(Finding("error", PLAN_FILE, f"the plan's tensors {planned} differ from workload.py's {specs}; "
                                            "run cuco init again with the plan, or fix one of them"))
    looked: set[Path] = set()
    for seed, backend in _builds(wl):
        if not seed.is_file():
            if seed not in looked:
                add(Finding("error", seed.name, "missing"))
            looked.add(seed)
            continue
        code = seed.read_text(encoding="utf-8", errors="replace")
        unused = [s.name for s in wl.tensors if not re.search(rf'"{re.escape(s.name)}"', code)]
        if unused and seed not in looked:
            add(Finding("error", seed.name, f"never looks up tensor(s) {', '.join(unused)} (cuco_tensor(ctx, "
                                            "\"name\")): the port dropped a buffer"))
        looked.add(seed)
        if not compile_seed:
            continue
        if builder is None and shutil.which("nvcc") is None:
            add(Finding("skipped", seed.name, f"not compiled for {backend}: no nvcc on this machine"))
            continue
        r = (builder or build)(code, backend, for_workload(None, d))
        if r.ok:
            add(Finding("ok", seed.name, f"compiles for {backend}"))
        else:
            last = [ln for ln in (r.log or "").splitlines() if "error" in ln][:1]
            add(Finding("error", seed.name, f"does not compile for {backend}: {last[0] if last else 'see the log'}"))
    return report
