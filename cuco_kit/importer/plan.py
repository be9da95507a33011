"""The import plan: what `cuco init` read from a host-driven program, as data the user sees and corrects.

A plan says which device buffers are workload tensors (input, output, inout) and which are the program's own
scratch, which file-scope constants are sizes (workload parameters), which loop in ``main()`` is the per-step
work (everything before it is setup), and which variables stand for the communicator, the rank, the world size,
the streams and the events. `make_plan` derives it from the communication analysis (tree-sitter); the user may
edit it (``cuco_plan.json`` in the workload folder, or the notebook's plan form) before anything is written,
and `check_plan` says in one line each what an edit left inconsistent. ``PLAN_VERSION`` is the file format's
version (docs/contracts.md).
"""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from cuco_kit.cuda_parse import Node, is_device_function, node_text, parse, walk
from cuco_kit.errors import BadInput
from cuco_kit.importer.size_expr import WORLD, Untranslatable, element_count, evaluate, translate
from cuco_kit.source_file import read_source
from cuco_kit.workload import DTYPES

if TYPE_CHECKING:
    from cuco_kit.analysis import AnalysisReport

PLAN_VERSION = 1
ROLES = ("input", "output", "inout", "scratch")
# C element type -> workload dtype
CTYPES = {"float": "f32", "__nv_bfloat16": "bf16", "nv_bfloat16": "bf16", "half": "f16", "__half": "f16",
          "int": "i32", "int32_t": "i32", "int64_t": "i64", "long long": "i64", "uint8_t": "u8",
          "unsigned char": "u8", "char": "u8", "__nv_fp8_e4m3": "fp8_e4m3"}
_COMM_INIT = ("ncclCommInitRank", "ncclCommInitRankConfig", "ncclCommInitRankScalable")
_STREAM_CREATE = ("cudaStreamCreate", "cudaStreamCreateWithFlags", "cudaStreamCreateWithPriority")
_EVENT_CREATE = ("cudaEventCreate", "cudaEventCreateWithFlags")
_LOOPS = ("for_statement", "while_statement", "do_statement")
_DEFINE_INT = re.compile(r"^\s*#\s*define\s+([A-Za-z_]\w*)\s+\(?\s*([0-9]+)[uUlL]*\s*\)?\s*$", re.MULTILINE)


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
class ImportPlan:
    program: str  # the file name of the original program
    name: str  # the workload's name
    description: str
    sizes: dict[str, int]  # size constant -> its value in the program (the default parameters)
    fixed_sizes: list[str]  # sizes device code reads at compile time: the seed checks them, presets keep them
    buffers: list[BufferPlan]
    comm: str  # the communicator variable in main()
    rank: str  # expression of this rank (ncclCommInitRank's 4th argument)
    world: str  # expression of the world size (its 2nd argument)
    main_stream: str  # the stream the step's last work runs on: it becomes the harness stream
    side_streams: list[str] = field(default_factory=list)  # other streams the step uses (fork/join added)
    events: list[str] = field(default_factory=list)  # events created in main() and used in the step
    step_start: int = 0  # first and last line of the per-step loop in main() (1-based, inclusive)
    step_end: int = 0
    loop_var: str | None = None  # the loop's counter, if the step reads it (becomes ctx->epoch - 1)
    locals: list[str] = field(default_factory=list)  # main()'s locals the step needs (their declarations are kept)
    notes: list[str] = field(default_factory=list)
    version: int = PLAN_VERSION

    # -- views --------------------------------------------------------------------------------------------
    def tensors(self) -> list[BufferPlan]:
        return [b for b in self.buffers if b.role != "scratch"]

    def scratch(self) -> list[BufferPlan]:
        return [b for b in self.buffers if b.role == "scratch"]

    def small_sizes(self) -> dict[str, int]:
        """A small preset for 2-4 ranks on one GPU: every free size divided by up to 8 (a power of two that
        divides it, never below 16); fixed sizes keep their value."""
        out = {}
        for k, v in self.sizes.items():
            f = 8
            while f > 1 and (k in self.fixed_sizes or v % f or v // f < 16):
                f //= 2
            out[k] = v // f
        return out

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
            raise BadInput(f"{where}: plan version {d.get('version')!r}; this cuco_kit reads version {PLAN_VERSION}")
        known = set(cls.__dataclass_fields__)
        unknown = set(d) - known
        if unknown:
            raise BadInput(f"{where}: unknown field(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(known))}")
        try:
            d["buffers"] = [BufferPlan(**b) for b in d.get("buffers", [])]
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


# ------------------------------------------------------------------------------------------------ checks

def check_plan(plan: ImportPlan, code: str | None = None) -> list[str]:
    """What is inconsistent in `plan` (one line each, empty when nothing is). With `code` (the program), the
    step lines and the buffers are checked against it too."""
    problems: list[str] = []
    if not re.fullmatch(r"[A-Za-z_]\w*", plan.name or ""):
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
        try:
            n = evaluate(plan.count_python(b), plan.sizes, 2)
            if n <= 0:
                problems.append(f"buffer {b.name!r}: count {b.count!r} is {n} at the default sizes on 2 ranks; "
                                "it must be positive")
        except Untranslatable as exc:
            problems.append(f"buffer {b.name!r}: count {b.count!r} cannot be computed ({exc}); write it in "
                            f"terms of the sizes ({', '.join(plan.sizes) or 'none'}), '{WORLD}' and literals")
    for k, v in plan.sizes.items():
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            problems.append(f"size {k!r}: {v!r} is not a positive integer")
    for k in plan.fixed_sizes:
        if k not in plan.sizes:
            problems.append(f"fixed size {k!r} is not one of the sizes")
    if not any(b.role in ("output", "inout") for b in plan.buffers):
        problems.append("no buffer is an output (or inout): the harness would have nothing to verify; mark the "
                        "buffer the step produces as output")
    if not any(b.role in ("input", "inout") for b in plan.buffers):
        problems.append("no buffer is an input: mark the data the step starts from as input")
    if len(plan.tensors()) > 16:
        problems.append(f"{len(plan.tensors())} tensors: the ABI carries at most 16 (CUCO_MAX_TENSORS)")
    if plan.main_stream in plan.side_streams:
        problems.append(f"stream {plan.main_stream!r} is both the main stream and a side stream")
    if not 0 < plan.step_start <= plan.step_end:
        problems.append(f"step lines {plan.step_start}-{plan.step_end}: give the first and last line of the "
                        "per-step loop")
    if code is not None:
        n_lines = code.count("\n") + 1
        if plan.step_end > n_lines:
            problems.append(f"step lines {plan.step_start}-{plan.step_end}: the program has {n_lines} lines")
        else:
            body = _step_identifiers(code, plan)
            for b in plan.buffers:
                if b.name not in body and b.role != "scratch":
                    problems.append(f"buffer {b.name!r} ({b.role}) is not used in the step (lines "
                                    f"{plan.step_start}-{plan.step_end}); remove it or fix the step lines")
    return problems


def require_consistent(plan: ImportPlan, code: str | None = None) -> None:
    """BadInput (one line, the first problem and how many more) when the plan is inconsistent."""
    problems = check_plan(plan, code)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise BadInput(f"the import plan is inconsistent: {problems[0]}{more}")


# ----------------------------------------------------------------------------------------------- deriving

def _main(root: Node) -> Node | None:
    for n in walk(root):
        if n.type == "function_definition":
            d = n.child_by_field_name("declarator")
            while d is not None and d.type != "function_declarator":
                d = d.child_by_field_name("declarator")
            name = d.child_by_field_name("declarator") if d is not None else None
            if name is not None and node_text(name) == "main":
                return n
    return None


def _line(n: Node) -> int:
    return n.start_point[0] + 1


def _end_line(n: Node) -> int:
    return n.end_point[0] + 1


def _identifiers(n: Node) -> set[str]:
    return {node_text(x) for x in walk(n) if x.type == "identifier"}


def _step_loop(main: Node, lines: list[int]) -> Node | None:
    """The outermost loop of main() that holds every line in `lines`."""
    best = None
    for n in walk(main):
        if n.type in _LOOPS and all(_line(n) <= ln <= _end_line(n) for ln in lines):
            if best is None or _line(n) < _line(best) or _end_line(n) > _end_line(best):
                best = n
    return best


def loop_body(loop: Node) -> Node:
    body = loop.child_by_field_name("body")
    return body if body is not None else loop


def find_step_loop(code: str, plan: ImportPlan) -> Node:
    """The loop statement of main() that spans the plan's step lines."""
    main = _main(parse(code).root_node)
    if main is not None:
        for n in walk(main):
            if n.type in _LOOPS and _line(n) == plan.step_start and _end_line(n) == plan.step_end:
                return n
    raise BadInput(f"lines {plan.step_start}-{plan.step_end} of {plan.program} are not a loop in main(); set the "
                   "plan's step_start/step_end to the first and last line of the per-step loop")


def _step_identifiers(code: str, plan: ImportPlan) -> set[str]:
    try:
        return _identifiers(loop_body(find_step_loop(code, plan)))
    except BadInput:
        return set()


def _declarations(main: Node) -> dict[str, tuple[Node, Node]]:
    """Locals declared in main(): name -> (declaration, its declarator)."""
    out: dict[str, tuple[Node, Node]] = {}
    for n in walk(main):
        if n.type != "declaration":
            continue
        for d in n.children_by_field_name("declarator"):
            inner: Node | None = d
            while inner is not None and inner.type not in ("identifier",):
                inner = inner.child_by_field_name("declarator")
            if inner is not None:
                out.setdefault(node_text(inner), (n, d))
    return out


def _declared_ctype(decl: Node, declarator: Node) -> tuple[str, bool]:
    """(element type, is a pointer) of a declared variable."""
    t = decl.child_by_field_name("type")
    ctype = node_text(t) if t is not None else ""
    return ctype, declarator.type == "pointer_declarator" or (
        declarator.type == "init_declarator" and (declarator.child_by_field_name("declarator") or declarator).type
        == "pointer_declarator")


def file_constants(root: Node, code: str) -> dict[str, tuple[int, str, bool]]:
    """File-scope integer constants: name -> (value, C type, is a #define)."""
    out: dict[str, tuple[int, str, bool]] = {}
    for m in _DEFINE_INT.finditer(code):
        out[m.group(1)] = (int(m.group(2)), "int", True)
    for n in root.children:
        if n.type != "declaration":
            continue
        quals = {node_text(c) for c in n.children if c.type in ("type_qualifier", "storage_class_specifier")}
        if not quals & {"const", "constexpr"}:
            continue
        t = n.child_by_field_name("type")
        for d in n.children_by_field_name("declarator"):
            if d.type != "init_declarator":
                continue
            name, value = d.child_by_field_name("declarator"), d.child_by_field_name("value")
            if name is None or value is None or name.type != "identifier":
                continue
            txt = re.sub(r"[uUlL]+$", "", node_text(value).strip())
            if re.fullmatch(r"[0-9]+|0[xX][0-9a-fA-F]+", txt):
                out[node_text(name)] = (int(txt, 0), node_text(t) if t is not None else "int", False)
    return out


def _device_identifiers(root: Node) -> set[str]:
    out: set[str] = set()
    for n in walk(root):
        if n.type == "function_definition" and is_device_function(n):
            out |= _identifiers(n)
    return out


def _count_in_sizes(count: str, locals_: dict[str, tuple[Node, Node]], sizes: set[str], world: str,
                    depth: int = 0) -> str:
    """`count` with main()'s locals replaced by their initialisers (in parentheses) and the world variable by
    `world`, so it reads in sizes only."""
    def sub(m: re.Match[str]) -> str:
        name = m.group(0)
        if name == world:
            return WORLD
        if name in sizes or name not in locals_ or depth > 8:
            return name
        value = locals_[name][1].child_by_field_name("value")
        if value is None:
            return name
        return f"({_count_in_sizes(node_text(value), locals_, sizes, world, depth + 1)})"

    return re.sub(r"\b(?!sizeof\b)[A-Za-z_]\w*\b", sub, count)


def _roles(rep: AnalysisReport, names: set[str], start: int, end: int) -> dict[str, str]:
    """input / output / inout / scratch from the order of reads and writes inside the step."""
    first: dict[str, str] = {}
    read: set[str] = set()
    written: set[str] = set()
    filled: set[str] = set()  # written by main() before the step (the program initialises them)
    for node in rep.graph.nodes:
        if node.get("function") != "main":
            continue
        writes = set(node.get("writes") or []) & names
        if node["line"] < start:
            filled |= writes
            continue
        if node["line"] > end:
            continue
        reads = set(node.get("reads") or []) & names
        for b in reads | writes:
            # A kernel that reads and writes a buffer nobody filled before the step produces it (it cannot
            # accumulate into garbage): a write first.
            first.setdefault(b, "write" if b in writes and (b not in reads or b not in filled) else "read")
        read |= reads
        written |= writes
    roles = {}
    for b in names:
        if b in read and b in written:
            roles[b] = "scratch" if first[b] == "write" else "inout"
        elif b in written:
            roles[b] = "output"
        elif b in read:
            roles[b] = "input"
    return roles


def make_plan(code: str, filename: str = "program.cu", name: str | None = None) -> ImportPlan:
    """The deterministic plan of a host-driven program. BadInput (one line) for a program cuco init cannot
    import: no NCCL calls, no main(), communication outside main(), or a communicator it cannot trace."""
    from cuco_kit.analysis import analyze

    rep = analyze(code, filename)
    comm_calls = rep.collectives + rep.p2p
    if not comm_calls:
        raise BadInput(f"{filename}: no NCCL collectives or send/recv calls; cuco init imports a host program "
                       "that communicates with NCCL (ncclAllReduce, ncclSend/ncclRecv, ...)")
    tree = parse(code)
    main = _main(tree.root_node)
    if main is None:
        raise BadInput(f"{filename}: no main(); cuco init reads the setup and the per-step loop from main()")
    outside = [c for c in comm_calls if c.function != "main"]
    if outside:
        c = outside[0]
        raise BadInput(f"{filename}: L{c.line} {c.call} is in {c.function}(), not in main(); cuco init reads the "
                       "per-step work from a loop in main(): inline the call there or port the file by hand "
                       "(docs/add_a_workload.md)")
    inits = [s for s in rep.setup if s.call in _COMM_INIT and s.function == "main"]
    handles = {s.handle for s in inits if s.handle}
    for c in comm_calls:
        if c.comm not in handles:
            where = ", ".join(sorted(h for h in handles if h)) or "none in main()"
            raise BadInput(f"{filename}: L{c.line} {c.call} runs on communicator {c.comm!r}, which the analysis "
                           f"cannot trace to an ncclCommInitRank in main() (traced: {where}); create it there")
    init = next(s for s in inits if s.handle == comm_calls[0].comm)
    if len(init.args) < 4:
        raise BadInput(f"{filename}: L{init.line} {init.call} has {len(init.args)} arguments; expected "
                       "(&comm, nranks, id, rank)")
    world, rank = init.args[1].strip(), init.args[3].strip()

    loop = _step_loop(main, [c.line for c in comm_calls])
    if loop is None:
        raise BadInput(f"{filename}: the NCCL calls (L{comm_calls[0].line}) are not inside a loop in main(); cuco "
                       "init takes the loop that repeats the step as the per-step work: wrap one step in a loop")
    start, end = _line(loop), _end_line(loop)
    body = loop_body(loop)
    body_ids = _identifiers(body)
    decls = _declarations(main)
    constants = file_constants(tree.root_node, code)
    notes: list[str] = []

    # buffers: device allocations in main()
    buffers: list[BufferPlan] = []
    alloc_names = {a.buffer for a in rep.allocations if a.function == "main" and a.kind in ("cuda", "nccl")}
    roles = _roles(rep, alloc_names, start, end)
    for a in rep.allocations:
        if a.function != "main" or a.kind not in ("cuda", "nccl") or a.buffer in {b.name for b in buffers}:
            continue
        if a.buffer not in roles:
            notes.append(f"buffer {a.buffer} (L{a.line}) is not used in the step: left out")
            continue
        ctype = "float"
        if a.buffer in decls:
            ctype, _ = _declared_ctype(*decls[a.buffer])
        dtype = CTYPES.get(ctype)
        if dtype is None:
            notes.append(f"buffer {a.buffer}: element type {ctype!r} has no workload dtype; set its dtype")
            dtype = "u8"
        count_c = element_count(a.bytes or "0", ctype)
        buffers.append(BufferPlan(a.buffer, roles[a.buffer], dtype, ctype, count_c, a.line))

    # sizes: file-scope constants the step or the buffer counts use
    size_names = set(constants)
    for b in buffers:
        b.count = _count_in_sizes(b.count, decls, size_names, world)
    used: set[str] = set(body_ids)
    for b in buffers:
        used |= set(re.findall(r"[A-Za-z_]\w*", b.count))
    # streams and events the step uses
    created_streams = [s.stream for s in rep.streams if s.function == "main" and s.call in _STREAM_CREATE]
    step_nodes = [n for n in rep.graph.nodes if n.get("function") == "main" and start <= n["line"] <= end]
    compute = [n for n in step_nodes if n["kind"] != "comm"] or step_nodes
    main_stream = compute[-1].get("stream") or (created_streams[0] if created_streams else "0")
    side = [s for s in created_streams if s in body_ids and s != main_stream]
    events = [e.event for e in rep.events if e.function == "main" and e.call in _EVENT_CREATE and e.event
              and e.event in body_ids]

    mapped = {rank, world, init.handle or "", main_stream, *alloc_names, *created_streams, *events}
    needed = _needed_locals(body_ids, decls, main, loop, mapped, size_names)
    for n in needed:
        used |= _identifiers(decls[n][1])
    sizes = {k: v[0] for k, v in constants.items() if k in used}
    device_ids = _device_identifiers(tree.root_node)
    fixed = [k for k in sizes if constants[k][2] or k in device_ids]
    for k in fixed:
        why = "a #define" if constants[k][2] else "read by device code"
        notes.append(f"size {k} is {why}: the seed is compiled with {k}={sizes[k]} and checks the parameter")
    if main_stream not in created_streams:
        notes.append(f"the step's last work runs on stream {main_stream!r}, which main() does not create; it "
                     "becomes the harness stream")
    loop_var = _loop_var(loop)
    if loop_var is not None and loop_var not in body_ids:
        loop_var = None
    syncs = [s for s in rep.syncs if s.function == "main" and start <= s.line <= end]
    for s in syncs:
        notes.append(f"L{s.line} {s.call} inside the step blocks the host every step; the harness times the "
                     "stream, so consider removing it")
    stem = re.sub(r"\W", "_", Path(filename).stem) or "imported"
    return ImportPlan(
        program=Path(filename).name, name=name or stem,
        description=f"imported from {Path(filename).name}: " + ", ".join(
            sorted({c.call for c in comm_calls})) + " with " + ", ".join(
            sorted({la.kernel for la in rep.launches if start <= la.line <= end})),
        sizes=sizes, fixed_sizes=fixed, buffers=buffers, comm=init.handle or "", rank=rank, world=world,
        main_stream=main_stream, side_streams=side, events=events, step_start=start, step_end=end,
        loop_var=loop_var, locals=needed, notes=notes)


def _loop_var(loop: Node) -> str | None:
    init = loop.child_by_field_name("initializer")
    if init is None:
        return None
    for n in walk(init):
        if n.type == "init_declarator":
            d = n.child_by_field_name("declarator")
            if d is not None and d.type == "identifier":
                return node_text(d)
    return None


def _needed_locals(ids: set[str], decls: dict[str, tuple[Node, Node]], main: Node, loop: Node,
                   mapped: set[str], sizes: set[str]) -> list[str]:
    """main()'s locals declared before the loop that the step reads (and what their initialisers read), in
    declaration order; the mapped names (rank, world, communicator, buffers) come from the harness instead."""
    todo = [i for i in ids if i in decls and i not in mapped]
    need: set[str] = set()
    while todo:
        n = todo.pop()
        if n in need or _line(decls[n][0]) >= _line(loop):
            continue
        need.add(n)
        todo += [i for i in _identifiers(decls[n][1]) if i in decls and i not in mapped and i not in sizes]
    return sorted(need, key=lambda n: decls[n][0].start_byte)


def plan_file(path: str | Path, name: str | None = None) -> tuple[ImportPlan, str]:
    """(the plan, the program's text) of a program file."""
    code = read_source(path, "program")
    return make_plan(code, str(Path(path).name), name), code


__all__ = ["BufferPlan", "ImportPlan", "PLAN_VERSION", "ROLES", "check_plan", "find_step_loop", "make_plan",
           "plan_file", "require_consistent"]
