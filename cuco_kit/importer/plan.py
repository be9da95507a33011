"""The import plan: what `cuco init` read from a host-driven program, as data the user sees and corrects.

A plan says which device buffers are workload tensors (input, output, inout) and which are the program's own
scratch, which integers are sizes (workload parameters, with the program's values as defaults), which part of
which function is one step (a loop whose body repeats it, or consecutive statements, reached from main()
through `call_lines`), which statements of the step are left out (timing, reporting, MPI), and which variables
stand for the communicator, the rank, the world size, the streams and the events. `derive.make_plan` derives
it from the program; the user may edit it (``cuco_plan.json`` in the workload folder, or the notebook's plan
form) before anything is written. What the analysis could not decide is listed in `todo`, one reason each; an
entry is removed by whoever decides it. `check_plan` says in one line each what is still open or inconsistent,
and nothing is written from a plan with problems. ``PLAN_VERSION`` is the file format's version
(docs/contracts.md); version 1 plans are refused with one line (run cuco init again).
"""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cuco_kit.errors import BadInput
from cuco_kit.importer.program import Program, Region, line_of, root_name
from cuco_kit.importer.size_expr import WORLD, Untranslatable, evaluate, translate
from cuco_kit.workload import DTYPES, MAX_RANKS

PLAN_VERSION = 2
ROLES = ("input", "output", "inout", "scratch")
STEP_KINDS = ("loop", "statements")
# The ABI's limits (cuco_abi.h): parameters and tensors a context carries, and the length of their names.
MAX_PARAMS = 32
MAX_TENSORS = 16
MAX_NAME = 31
# C element type -> workload dtype (integers of one width share one: the harness draws them in [0, 8)).
CTYPES = {"float": "f32", "__nv_bfloat16": "bf16", "nv_bfloat16": "bf16", "half": "f16", "__half": "f16",
          "int": "i32", "int32_t": "i32", "unsigned": "i32", "unsigned int": "i32", "uint32_t": "i32",
          "int64_t": "i64", "uint64_t": "i64", "long long": "i64", "long": "i64", "size_t": "i64", "uint8_t": "u8",
          "int8_t": "u8", "unsigned char": "u8", "signed char": "u8", "char": "u8", "bool": "u8",
          "__nv_fp8_e4m3": "fp8_e4m3"}


@dataclass
class BufferPlan:
    """One device buffer of the program. `count` is its element count in terms of sizes, `world` and literals
    (C syntax, e.g. ``kRows * kCols``); `role` is one of ROLES (scratch buffers stay the seed's own)."""

    name: str
    role: str
    dtype: str
    ctype: str
    count: str
    line: int = 0


@dataclass
class LeftOut:
    """A statement the seed leaves out of the step (timing, reporting, MPI, ...): its first line, its text and
    why. Remove the entry to keep the statement."""

    line: int
    code: str
    why: str


@dataclass
class ImportPlan:
    program: str  # the file name of the original program
    name: str  # the workload's name
    description: str
    sizes: dict[str, int]  # size -> its value in the program (the default parameters)
    fixed_sizes: list[str]  # sizes compiled into the seed: it checks them, presets keep them
    buffers: list[BufferPlan]
    comm: str  # the communicator variable (an array of them for one process driving every device)
    rank: str  # expression of this rank (ncclCommInitRank's 4th argument; empty when the program has none)
    world: str  # expression of the world size (its 2nd argument)
    main_stream: str  # the stream the step's last work runs on: it becomes the harness stream
    side_streams: list[str] = field(default_factory=list)  # other streams the step uses (fork/join added)
    events: list[str] = field(default_factory=list)  # events the step records or waits on
    step_function: str = "main"  # the function whose body holds the step
    call_lines: list[int] = field(default_factory=list)  # the calls from main() down to step_function
    step_kind: str = "loop"  # "loop": the loop at the step lines repeats the step; "statements": they are one
    step_start: int = 0  # first and last line of the step (1-based, inclusive)
    step_end: int = 0
    loop_var: str | None = None  # the loop's counter when the step reads it: a size (default 0)
    # One process drives several devices (ncclCommInitAll, or communicators made in a loop): what the loops over
    # them run to; the seed runs one device per rank. Empty: one device per process.
    devices: str = ""
    locals: list[str] = field(default_factory=list)  # locals the step needs (their definitions are kept)
    left_out: list[LeftOut] = field(default_factory=list)
    multiple_of: dict[str, int] = field(default_factory=dict)  # size -> what the small preset keeps it a multiple of
    worlds: list[int] = field(default_factory=list)  # the world sizes the program runs on (empty: any)
    # The most terms one output element sums: over ranks in a reducing collective, and in a step kernel (the
    # tolerance of the seed as oracle is derived from them).
    summed_terms: dict[str, int] = field(default_factory=lambda: {"collective": 1, "kernel": 1})
    todo: list[str] = field(default_factory=list)  # what the analysis could not decide: remove each once decided
    notes: list[str] = field(default_factory=list)
    version: int = PLAN_VERSION

    # -- views --------------------------------------------------------------------------------------------
    def tensors(self) -> list[BufferPlan]:
        return [b for b in self.buffers if b.role != "scratch"]

    def scratch(self) -> list[BufferPlan]:
        return [b for b in self.buffers if b.role == "scratch"]

    def free_sizes(self) -> dict[str, int]:
        """Sizes a preset may change: neither fixed nor the loop counter."""
        return {k: v for k, v in self.sizes.items() if k not in self.fixed_sizes and k != self.loop_var}

    def small_sizes(self) -> dict[str, int]:
        """A small preset for 2-4 ranks on one GPU: every free size divided by the same factor (8, 4 or 2: the
        largest that keeps each a whole multiple of what `multiple_of` asks), so the program's relations between
        sizes hold; fixed sizes and the loop counter keep their value."""
        free = {k: v for k, v in self.free_sizes().items() if v > 0}
        factor = next((f for f in (8, 4, 2) if all(v % (f * self.multiple_of.get(k, 1)) == 0
                                                   for k, v in free.items())), 1)
        return {k: v // factor if k in free else v for k, v in self.sizes.items()}

    def count_python(self, buf: BufferPlan) -> str:
        """`buf.count` as Python over ``p`` (the parameters) and ``w`` (the world size)."""
        names = {s: f'p["{s}"]' for s in self.sizes} | {WORLD: "w"}
        return translate(buf.count, names)

    # -- the file ---------------------------------------------------------------------------------------
    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str, where: str = "plan") -> ImportPlan:
        try:
            d = json.loads(text)
        except json.JSONDecodeError as exc:
            raise BadInput(f"{where}: not JSON (line {exc.lineno}: {exc.msg}); fix the file") from None
        if not isinstance(d, dict):
            raise BadInput(f"{where}: expected a JSON object")
        if d.get("version") != PLAN_VERSION:
            raise BadInput(f"{where}: plan version {d.get('version')!r}; this cuco_kit reads version {PLAN_VERSION}: "
                           "run `cuco init PROGRAM --workload DIR --plan-only` again and carry your corrections over")
        known = set(cls.__dataclass_fields__)
        unknown = set(d) - known
        if unknown:
            raise BadInput(f"{where}: unknown field(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(known))}")
        try:
            d["buffers"] = [BufferPlan(**b) for b in d.get("buffers", [])]
            d["left_out"] = [LeftOut(**x) for x in d.get("left_out", [])]
            return cls(**d)
        except TypeError as exc:
            raise BadInput(f"{where}: {exc}; compare with the plan cuco init wrote") from None

    def save(self, path: str | Path) -> Path:
        p = Path(path)
        p.write_text(self.to_json(), encoding="utf-8")
        return p

    @classmethod
    def load(cls, path: str | Path) -> ImportPlan:
        p = Path(path)
        if not p.is_file():
            raise BadInput(f"{p}: no such plan file; `cuco init PROGRAM.cu --workload DIR --plan-only` writes one")
        return cls.from_json(p.read_text(encoding="utf-8"), str(p))


class InconsistentPlan(BadInput):
    """A plan with problems; `problems` holds every one of them (one line each)."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        more = f" (and {len(problems) - 1} more: cuco init --plan-only lists them)" if len(problems) > 1 else ""
        super().__init__(f"the import plan is not ready: {problems[0]}{more}")


# ------------------------------------------------------------------------------------------------ checks

def check_plan(plan: ImportPlan, code: str | None = None) -> list[str]:
    """What is still open (`todo`) or inconsistent in `plan`, one line each (empty when nothing is). With
    `code` (the program), the step's function, lines and buffers are checked against it too."""
    problems = [f"TODO: {t}" for t in plan.todo]
    problems += _field_problems(plan)
    if code is not None:
        problems += _program_problems(plan, code)
    return problems


def require_consistent(plan: ImportPlan, code: str | None = None) -> None:
    """InconsistentPlan (every problem, the first in its message) when `check_plan` finds any."""
    problems = check_plan(plan, code)
    if problems:
        raise InconsistentPlan(problems)


def _identifier(text: str) -> bool:
    return re.fullmatch(r"[A-Za-z_]\w*", text or "") is not None


def _field_problems(plan: ImportPlan) -> list[str]:
    problems: list[str] = []
    if not _identifier(plan.name):
        problems.append(f"name {plan.name!r}: use a Python identifier (letters, digits, _)")
    seen: set[str] = set()
    for b in plan.buffers:
        if b.name in seen:
            problems.append(f"buffer {b.name!r} is listed twice")
        seen.add(b.name)
        if b.role not in ROLES:
            problems.append(f"buffer {b.name!r}: role {b.role!r} is not one of {', '.join(ROLES)}")
        if b.dtype not in DTYPES:
            problems.append(f"buffer {b.name!r}: dtype {b.dtype!r} is not one of {', '.join(DTYPES)}")
        if b.role != "scratch" and len(b.name) > MAX_NAME:
            problems.append(f"tensor {b.name!r}: a name has at most {MAX_NAME} characters (CUCO_NAME_LEN)")
        try:
            n = evaluate(plan.count_python(b), plan.sizes, 2)
            if n <= 0:
                problems.append(f"buffer {b.name!r}: count {b.count!r} is {n} at the default sizes on 2 ranks; "
                                "it must be positive")
        except Untranslatable as exc:
            problems.append(f"buffer {b.name!r}: count {b.count!r} cannot be computed ({exc}); write it in "
                            f"terms of the sizes ({', '.join(plan.sizes) or 'none'}), '{WORLD}' and literals")
    for k, v in plan.sizes.items():
        lowest = 0 if k == plan.loop_var else 1
        if not isinstance(v, int) or isinstance(v, bool) or v < lowest:
            problems.append(f"size {k!r}: {v!r} is not {'a non-negative' if lowest == 0 else 'a positive'} integer")
        if len(k) > MAX_NAME:
            problems.append(f"size {k!r}: a name has at most {MAX_NAME} characters (CUCO_NAME_LEN)")
    if len(plan.sizes) > MAX_PARAMS:
        problems.append(f"{len(plan.sizes)} sizes: the ABI carries at most {MAX_PARAMS} (CUCO_MAX_PARAMS); fix "
                        "some of them (remove them from sizes and write their value in the program)")
    for k in plan.fixed_sizes:
        if k not in plan.sizes:
            problems.append(f"fixed size {k!r} is not one of the sizes")
    for k, m in plan.multiple_of.items():
        if k not in plan.sizes or not isinstance(m, int) or m < 1:
            problems.append(f"multiple_of {k!r}: {m!r} must be a positive integer for one of the sizes")
    if any(not isinstance(w, int) or not 1 <= w <= MAX_RANKS for w in plan.worlds):
        problems.append(f"worlds {plan.worlds}: world sizes are 1 to {MAX_RANKS}")
    if plan.loop_var is not None and plan.loop_var not in plan.sizes:
        problems.append(f"loop_var {plan.loop_var!r} is not one of the sizes (add it with the value 0)")
    if not any(b.role in ("output", "inout") for b in plan.buffers):
        problems.append("no buffer is an output (or inout): the harness would have nothing to verify; mark the "
                        "buffer the step produces as output")
    if not any(b.role in ("input", "inout") for b in plan.buffers):
        problems.append("no buffer is an input: mark the data the step starts from as input")
    if len(plan.tensors()) > MAX_TENSORS:
        problems.append(f"{len(plan.tensors())} tensors: the ABI carries at most {MAX_TENSORS} (CUCO_MAX_TENSORS)")
    if not _identifier(plan.comm):
        problems.append(f"comm {plan.comm!r}: name the variable that holds the step's communicator")
    if plan.main_stream in plan.side_streams:
        problems.append(f"stream {plan.main_stream!r} is both the main stream and a side stream")
    if plan.step_kind not in STEP_KINDS:
        problems.append(f"step_kind {plan.step_kind!r} is not one of {', '.join(STEP_KINDS)}")
    if not 0 < plan.step_start <= plan.step_end:
        problems.append(f"step lines {plan.step_start}-{plan.step_end}: give the first and last line of the step")
    if set(plan.summed_terms) != {"collective", "kernel"} or any(
            not isinstance(v, int) or v < 1 for v in plan.summed_terms.values()):
        problems.append(f"summed_terms {plan.summed_terms}: give 'collective' and 'kernel', positive integers")
    return problems


def _program_problems(plan: ImportPlan, code: str) -> list[str]:
    prog = Program(code, plan.program)
    frames = prog.frames_for(plan.step_function, plan.call_lines)
    if frames is None:
        return [f"step_function {plan.step_function!r} with call_lines {plan.call_lines}: the program has no such "
                "chain of calls from main() (each call line names the call that leads one function further)"]
    region = None if plan.step_start <= 0 else prog.region_at(frames[-1], plan.step_kind, plan.step_start,
                                                                plan.step_end)
    if region is None:
        what = "a loop" if plan.step_kind == "loop" else "statements"
        return [f"lines {plan.step_start}-{plan.step_end} of {plan.program} are not {what} of "
                f"{plan.step_function}(); set step_start/step_end (and step_kind)"]
    found = {line_of(s) for s in prog.statements_at({x.line for x in plan.left_out})}
    problems = [f"left_out line {x.line}: no statement starts there" for x in plan.left_out if x.line not in found]
    used = step_buffers(prog, plan, frames, region)
    for b in plan.buffers:
        if b.name not in used and b.role != "scratch":
            problems.append(f"buffer {b.name!r} ({b.role}) is not used in the step (lines {plan.step_start}-"
                            f"{plan.step_end} of {plan.step_function}()); remove it or fix the step lines")
    return problems


def step_buffers(prog: Program, plan: ImportPlan, frames: list[Any], region: Region) -> set[str]:
    """The buffers the step's work reads or writes (through the calls it makes, at any depth)."""
    skip = left_out_spans(prog, plan)
    out: set[str] = set()
    for n in prog.step_nodes(frames, region, skip):
        for b in n["reads"] + n["writes"]:
            out.add(root_name(b))
    return out


def left_out_spans(prog: Program, plan: ImportPlan) -> list[tuple[int, int]]:
    """The line spans of the statements the plan leaves out."""
    wanted = {x.line for x in plan.left_out}
    return [(line_of(s), s.end_point[0] + 1) for s in prog.statements_at(wanted)]


__all__ = ["BufferPlan", "CTYPES", "ImportPlan", "InconsistentPlan", "LeftOut", "PLAN_VERSION", "ROLES",
           "STEP_KINDS", "check_plan", "left_out_spans", "require_consistent", "step_buffers"]
