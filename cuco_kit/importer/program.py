"""A host program as `cuco init` reads it: its functions, the chain of calls from main() to the function that
holds the step, what each statement of that function does, and the parts of it that could be one step.

What a call does decides everything else (`Program.call_kind`):
- COMM: an NCCL collective or send/recv, or a call to a function of the file that reaches one;
- WORK: the rest of the GPU work (kernel launches, cuBLAS, device copies, groups, stream-ordering events);
- SETUP: allocations, frees, communicator, stream and event creation, uploads of host data;
- SYNC: a host synchronisation (cudaStreamSynchronize, cudaDeviceSynchronize, waits on a non-timing event);
- DEVICE: choosing the GPU (the harness does);
- REPORT: timing and reporting: printf and friends, clocks, CUDA events used only for timing, MPI;
- HOST: anything else (host arithmetic, calls the file does not define).
A statement is what its calls are, the first of the order above. Timing and reporting statements, and the
host computations that feed only them, are left out of a step (`Program.left_out`); so is a synchronisation at
either end of a step (the harness synchronises). The plan (plan.py) records what was decided as lines and
names; the seed writer and the plan's checks find the same nodes again through this module.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cuco_kit.source.analysis import (
    ALLOC_CALLS,
    BLAS_CALLS,
    COMM_CALLS,
    COPY_CALLS,
    FREE_CALLS,
    GROUP_CALLS,
    LAUNCH_APIS,
    LOOPS,
    SETUP_CALLS,
    STREAM_CREATE_CALLS,
    SYNC_CALLS,
    AnalysisReport,
    analyze,
    in_loop,
)
from cuco_kit.source.cuda_parse import (
    Node,
    callee,
    declarator_name,
    function_name,
    is_device_function,
    node_text,
    parse,
    walk,
)

COMM, WORK, SETUP, SYNC, DEVICE, REPORT, HOST = "comm", "work", "setup", "sync", "device", "report", "host"
_PRIORITY = (COMM, WORK, SETUP, SYNC, DEVICE, REPORT, HOST)

_PRINT_CALLS = frozenset({"printf", "fprintf", "vprintf", "vfprintf", "puts", "fputs", "putchar", "fputc", "fflush",
                          "perror", "snprintf", "sprintf"})
_CLOCK_CALLS = frozenset({"MPI_Wtime", "clock", "gettimeofday", "clock_gettime", "omp_get_wtime", "now",
                          "cudaEventElapsedTime", "cudaProfilerStart", "cudaProfilerStop"})
_STREAM_EVENT_CALLS = frozenset({"cudaEventRecord", "cudaEventRecordWithFlags", "cudaStreamWaitEvent"})
EVENT_CREATE_CALLS = frozenset({"cudaEventCreate", "cudaEventCreateWithFlags"})
_EVENT_LIFE_CALLS = EVENT_CREATE_CALLS | {"cudaEventDestroy"}
_OTHER_SETUP = frozenset({"cudaStreamDestroy", "cudaMemcpyToSymbol", "cudaFuncSetAttribute", "cublasCreate",
                          "cublasDestroy", "cudaMallocHost", "cudaHostAlloc", "cudaFreeHost"})
# How host programs read sizes from their command line and environment.
PARSE_CALLS = frozenset({"atoi", "atol", "atoll", "strtol", "strtoul", "strtoll", "strtoull", "strtoimax",
                         "strtoumax", "stoi", "stol", "stoll", "stoul", "stoull"})
ENV_CALLS = frozenset({"getenv", "secure_getenv"})
_STATEMENT_TYPES = frozenset({"expression_statement", "declaration", "if_statement", "for_statement",
                              "while_statement", "do_statement", "for_range_loop", "compound_statement",
                              "switch_statement", "return_statement"})
_COMPOUND_TYPES = frozenset({"if_statement", "for_statement", "while_statement", "do_statement", "for_range_loop",
                             "compound_statement", "switch_statement", "else_clause", "case_statement"})
_LEAF_TYPES = frozenset({"expression_statement", "declaration", "return_statement"})
IDENTIFIER_TYPES = frozenset({"identifier", "type_identifier"})
_KEYWORDS = frozenset({"if", "for", "while", "switch", "do", "return", "sizeof", "else"})


def line_of(node: Node) -> int:
    return node.start_point[0] + 1


def end_line_of(node: Node) -> int:
    return node.end_point[0] + 1


def identifiers(node: Node) -> set[str]:
    """Every name written in `node`. `type_identifier` counts: `dim3 block(TILE, TILE)` and
    `std::vector<float> v(n)` parse their arguments as types."""
    return {node_text(x) for x in walk(node) if x.type in IDENTIFIER_TYPES}


def normalise(text: str) -> str:
    return " ".join(text.split())


def root_name(expr: str) -> str:
    """`comms[d]` -> `comms`, `&x` -> `x`: the variable an expression names (per-device arrays, address-of)."""
    t = expr.strip().lstrip("&*").strip()
    return t.split("[", 1)[0].strip() if "[" in t else t


def call_args(call: Node) -> list[Node]:
    al = call.child_by_field_name("arguments")
    return [c for c in al.named_children if c.type != "comment"] if al is not None else []


def short_name(call: Node) -> tuple[str, str]:
    """(kind, the callee's last name component) of a call_expression (see cuda_parse.callee)."""
    kind, name = callee(call)
    return kind, name.split("::")[-1]


def body_statements(block: Node) -> list[Node]:
    """The statements of a compound statement (or the statement itself when it is not one)."""
    if block.type != "compound_statement":
        return [block]
    return [c for c in block.named_children if c.type != "comment"]


def loop_body(loop: Node) -> Node:
    body = loop.child_by_field_name("body")
    return body if body is not None else loop


def loop_counter(loop: Node) -> str | None:
    """The counter a for loop declares in its initializer (`for (int it = 0; ...)` -> it)."""
    init = loop.child_by_field_name("initializer")
    if init is None:
        return None
    for n in walk(init):
        if n.type == "init_declarator":
            name = n.child_by_field_name("declarator")
            if name is not None and name.type == "identifier":
                return node_text(name)
    return None


def step_counter(loop: Node) -> str | None:
    """The counter of a step loop: a for loop's own (`for (int it = 0; ...)`), or the variable a while/do loop's
    condition reads and its body counts (`while (err > tol && iter < max) { ...; iter++; }`)."""
    if loop.type == "for_statement":
        return loop_counter(loop)
    cond = loop.child_by_field_name("condition")
    if cond is None:
        return None
    counted = {node_text(t) for n in walk(loop_body(loop))
               for t in [_counted(n)] if t is not None and t.type == "identifier"}
    found = sorted(counted & identifiers(cond))
    return found[0] if len(found) == 1 else None


def _counted(node: Node) -> Node | None:
    """What `x++`, `--x`, `x += k` or `x -= k` counts."""
    if node.type == "update_expression":
        return node.child_by_field_name("argument")
    op = node.child_by_field_name("operator") if node.type == "assignment_expression" else None
    return node.child_by_field_name("left") if op is not None and node_text(op) in ("+=", "-=") else None


def reads_counter(step: list[Node], name: str) -> bool:
    """Whether the step reads `name` other than to count it."""
    for s in step:
        for n in walk(s):
            if n.type == "identifier" and node_text(n) == name:
                counting = n.parent is not None and _counted(n.parent) == n
                if not counting:
                    return True
    return False


def writes_of(stmt: Node) -> set[str]:
    """Variables a statement declares or stores to: declarators, assignment targets (their base name),
    ++/--, `&x` arguments and receivers of member calls (`v.push_back(x)`)."""
    out: set[str] = set()
    for n in walk(stmt):
        t = n.type
        if t in ("init_declarator", "function_declarator", "array_declarator", "pointer_declarator") and \
                n.parent is not None and n.parent.type == "declaration":
            name = declarator_name(n)
            if name:
                out.add(name)
        elif t == "declaration":
            for d in n.children_by_field_name("declarator"):
                name = declarator_name(d)
                if name:
                    out.add(name)
        elif t in ("assignment_expression", "update_expression"):
            target = n.child_by_field_name("left") or n.child_by_field_name("argument")
            name = _base_name(target)
            if name:
                out.add(name)
        elif t == "pointer_expression" and n.children and node_text(n.children[0]) == "&" and \
                n.parent is not None and n.parent.type == "argument_list":
            name = _base_name(n.child_by_field_name("argument"))
            if name:
                out.add(name)
        elif t == "call_expression":
            fn = n.child_by_field_name("function")
            if fn is not None and fn.type == "field_expression":
                name = _base_name(fn.child_by_field_name("argument"))
                if name:
                    out.add(name)
            elif short_name(n)[1] in COPY_CALLS and call_args(n):  # a copy stores to its destination
                name = _base_name(call_args(n)[0])
                if name:
                    out.add(name)
    return out


def _base_name(node: Node | None) -> str | None:
    """The variable a store target is based on: x, x[i], x.f, x->f, *x, (x)."""
    while node is not None:
        if node.type == "identifier":
            return node_text(node)
        if node.type in ("subscript_expression", "field_expression", "pointer_expression"):
            node = node.child_by_field_name("argument")
        elif node.type in ("parenthesized_expression", "cast_expression"):
            node = node.child_by_field_name("value") or (node.named_children[0] if node.named_children else None)
        else:
            return None
    return None


@dataclass
class Frame:
    """One function on the way from main() to the step; `call` is the call in the previous frame that enters it."""

    node: Node
    name: str
    call: Node | None = None

    @property
    def body(self) -> Node:
        body = self.node.child_by_field_name("body")
        assert body is not None  # frames are functions with a body
        return body

    @property
    def call_line(self) -> int:
        return line_of(self.call) if self.call is not None else 0

    def parameters(self) -> list[Node]:
        decl = self.node.child_by_field_name("declarator")
        while decl is not None and decl.type != "function_declarator":
            decl = decl.child_by_field_name("declarator")
        plist = decl.child_by_field_name("parameters") if decl is not None else None
        return [p for p in (plist.named_children if plist is not None else [])
                if p.type in ("parameter_declaration", "optional_parameter_declaration")]

    def parameter_names(self) -> list[str]:
        return [declarator_name(p.child_by_field_name("declarator")) or "" for p in self.parameters()]


@dataclass
class Region:
    """The part of a frame's body that is one step: a loop whose body is the step, or consecutive statements."""

    kind: str  # "loop" | "statements"
    statements: list[Node]

    @property
    def start(self) -> int:
        return line_of(self.statements[0])

    @property
    def end(self) -> int:
        return end_line_of(self.statements[-1])

    @property
    def loop(self) -> Node | None:
        return self.statements[0] if self.kind == "loop" else None

    def body(self) -> list[Node]:
        """The statements one step runs."""
        return body_statements(loop_body(self.statements[0])) if self.kind == "loop" else list(self.statements)

    def contains(self, node: Node) -> bool:
        return any(s.start_byte <= node.start_byte and node.end_byte <= s.end_byte for s in self.body())


class Program:
    """A parsed host program with its communication analysis."""

    def __init__(self, code: str, filename: str) -> None:
        self.code = code
        self.filename = filename
        self.report: AnalysisReport = analyze(code, filename)  # BadInput for what is not CUDA C++
        self.root = parse(code).root_node
        self.functions: dict[str, Node] = {}  # host functions with a body, by their last name component
        self.device_functions: list[Node] = []
        for n in walk(self.root):
            if n.type != "function_definition" or n.child_by_field_name("body") is None:
                continue
            name = function_name(n).split("::")[-1]
            if name in _KEYWORDS:
                continue  # a statement a macro without its `;` made look like a function (`POP_RANGE if (c) {`)
            if is_device_function(n):
                self.device_functions.append(n)
            else:
                self.functions.setdefault(name, n)
        self.timing_events = self._timing_events()
        # host functions this file declares but another file defines (a kernel launcher in a second unit)
        self.declared_only = {declarator_name(d) for n in walk(self.root) if n.type == "declaration"
                              and n.parent is not None and n.parent.type in ("translation_unit", "declaration_list")
                              for d in n.children_by_field_name("declarator") if d.type == "function_declarator"}
        self.declared_only -= set(self.functions) | {None}
        self.typedefs = self._typedefs()
        self._reach: dict[str, str] = {}
        self._reaching()

    # -- functions and calls ---------------------------------------------------------------------------
    def calls_in(self, node: Node) -> list[Node]:
        return [n for n in walk(node) if n.type == "call_expression"]

    def callee_function(self, call: Node) -> Node | None:
        """The host function of this file that `call` calls (None for kernels, APIs and unknown names)."""
        kind, name = short_name(call)
        return self.functions.get(name) if kind == "function" else None

    def _timing_events(self) -> set[str]:
        """Events measured with cudaEventElapsedTime and never waited on by a stream: they only time."""
        timed: set[str] = set()
        ordering: set[str] = set()
        for call in self.calls_in(self.root):
            _, name = short_name(call)
            args = [root_name(node_text(a)) for a in call_args(call)]
            if name == "cudaEventElapsedTime":
                timed.update(args[1:3])
            elif name == "cudaStreamWaitEvent" and len(args) > 1:
                ordering.add(args[1])
        return timed - ordering

    def _typedefs(self) -> dict[str, str]:
        """name -> the type a typedef or alias names; of several (`#ifdef USE_DOUBLE typedef double real; #else
        typedef float real;`), the one the preprocessor takes with the file's own #defines."""
        defined = {node_text(name) for n in walk(self.root) if n.type in ("preproc_def", "preproc_function_def")
                   for name in [n.child_by_field_name("name")] if name is not None}
        out: dict[str, str] = {}
        for n in walk(self.root):
            if n.type == "type_definition":
                name, target = n.child_by_field_name("declarator"), n.child_by_field_name("type")
            elif n.type == "alias_declaration":
                name, target = n.child_by_field_name("name"), n.child_by_field_name("type")
            else:
                continue
            if name is None or target is None or not _taken(n, defined):
                continue
            out.setdefault(node_text(name), normalise(node_text(target)))
        return out

    def _direct_kind(self, call: Node) -> str:
        kind, name = short_name(call)
        if kind == "launch":
            return WORK
        if kind == "function" and name in self.declared_only:
            return WORK  # a launcher another file defines
        args = call_args(call)
        first = root_name(node_text(args[0])) if args else ""
        if name in COMM_CALLS:
            return COMM
        if name in GROUP_CALLS or name in BLAS_CALLS or name in LAUNCH_APIS or name == "cublasSetStream":
            return WORK
        if name in COPY_CALLS:
            text = node_text(call)
            if "DeviceToHost" in text:
                return HOST  # a download: work only if the step reads what it brought (see left_out)
            return SETUP if "HostToDevice" in text and not name.endswith("Async") else WORK
        if name in _STREAM_EVENT_CALLS:
            event = first if name != "cudaStreamWaitEvent" else (root_name(node_text(args[1])) if len(args) > 1
                                                                 else "")
            return REPORT if event in self.timing_events else WORK
        if name == "cudaEventSynchronize":
            return REPORT if first in self.timing_events else SYNC
        if name in _EVENT_LIFE_CALLS:
            return REPORT if first in self.timing_events else SETUP
        if name in SYNC_CALLS or name == "cudaThreadSynchronize":
            return SYNC
        if name == "cudaSetDevice":
            return DEVICE
        if name.startswith(("MPI_", "nvtx")) or name in _PRINT_CALLS or name in _CLOCK_CALLS:
            return REPORT
        if name in ALLOC_CALLS or name in FREE_CALLS or name in SETUP_CALLS or name in STREAM_CREATE_CALLS or \
                name in _OTHER_SETUP:
            return SETUP
        return HOST

    def _reaching(self) -> None:
        """What each host function of the file does, through the functions it calls (the first of _PRIORITY)."""
        direct = {name: {self._direct_kind(c) for c in self.calls_in(fn)} for name, fn in self.functions.items()}
        calls = {name: {short_name(c)[1] for c in self.calls_in(fn) if short_name(c)[0] == "function"}
                 & set(self.functions) for name, fn in self.functions.items()}
        changed = True
        while changed:
            changed = False
            for name, callees in calls.items():
                for c in callees:
                    if not direct[c] <= direct[name]:
                        direct[name] |= direct[c]
                        changed = True
        self._reach = {name: next((k for k in _PRIORITY if k in kinds), HOST) for name, kinds in direct.items()}

    def call_kind(self, call: Node) -> str:
        fn = self.callee_function(call)
        if fn is not None:
            return self._reach[short_name(call)[1]]
        return self._direct_kind(call)

    def kind(self, node: Node) -> str:
        """What a statement (or any node) does: the first of _PRIORITY among its calls."""
        kinds = {self.call_kind(c) for c in self.calls_in(node)}
        if any(x.type in ("identifier", "qualified_identifier") and node_text(x) in ("std::cout", "std::cerr", "cout",
                                                                                    "cerr")
               for x in walk(node)):
            kinds.add(REPORT)
        return next((k for k in _PRIORITY if k in kinds), HOST)

    # -- from main() to the step -----------------------------------------------------------------------
    def entry(self) -> Node | None:
        """Where the chain to the step starts: main(); or, when main() reaches NCCL through no call of this file,
        the one function reaching it that main() names (`run_example(argc, argv, allReduce)` hands it to a
        framework); without main(), the one host function nothing calls that reaches NCCL."""
        main = self.functions.get("main")
        if main is not None:
            if self._reach["main"] == COMM:
                return main
            named = [fn for name, fn in self.functions.items()
                     if name != "main" and self._reach[name] == COMM and name in identifiers(main)]
            return named[0] if len(named) == 1 else main
        called = {short_name(c)[1] for fn in self.functions.values() for c in self.calls_in(fn)}
        roots = [fn for name, fn in self.functions.items() if name not in called and self._reach[name] == COMM]
        return roots[0] if len(roots) == 1 else None

    def chain(self) -> list[Frame]:
        """main() and the functions below it that hold the whole step: while a function reaches NCCL only
        through ONE call, outside any loop, the step is inside that call."""
        entry = self.entry()
        if entry is None:
            return []
        frames = [Frame(entry, function_name(entry))]
        while True:
            body = frames[-1].body
            into = [c for c in self.calls_in(body) if self.call_kind(c) == COMM]
            if len(into) != 1 or short_name(into[0])[1] in COMM_CALLS or in_loop(into[0], body):
                return frames
            fn = self.callee_function(into[0])
            if fn is None or any(f.node == fn for f in frames):
                return frames
            frames.append(Frame(fn, function_name(fn), into[0]))

    def frames_for(self, step_function: str, call_lines: list[int]) -> list[Frame] | None:
        """The chain a plan names: its entry, then the function called at each of `call_lines` in turn, the last
        being `step_function`. None when the program has no such chain."""
        entry = self.entry()
        if entry is None:
            return None
        frames = [Frame(entry, function_name(entry))]
        for ln in call_lines:
            calls = [c for c in self.calls_in(frames[-1].body) if line_of(c) == ln and self.callee_function(c)]
            if len(calls) != 1:
                return None
            fn = self.callee_function(calls[0])
            assert fn is not None
            frames.append(Frame(fn, function_name(fn), calls[0]))
        return frames if frames[-1].name == step_function else None

    # -- the regions that could be one step -------------------------------------------------------------
    def device_loops(self, frame: Frame, devices: str) -> list[Node]:
        """Loops over the devices of one process (`for (d = 0; d < ndev; ++d)`, `devices` being `ndev`): one
        iteration each under the harness, the rank's own."""
        out = []
        for n in walk(frame.body):
            cond = n.child_by_field_name("condition") if n.type == "for_statement" else None
            var = loop_counter(n) if n.type == "for_statement" else None
            if cond is not None and var and cond.type == "binary_expression":
                left, right = cond.child_by_field_name("left"), cond.child_by_field_name("right")
                op = cond.child_by_field_name("operator")
                if left is not None and right is not None and op is not None and node_text(op) in ("<", "!=") and \
                        node_text(left) == var and normalise(node_text(right)) == normalise(devices):
                    out.append(n)
        return out

    def loop_bound_at(self, line: int, functions: list[Node]) -> str:
        """The bound (`n` of `i < n`) of the for loop around the call at `line` in one of `functions`."""
        for fn in functions:
            for call in self.calls_in(fn):
                n = call.parent
                while line_of(call) == line and n is not None and n != fn:
                    cond = n.child_by_field_name("condition") if n.type == "for_statement" else None
                    right = cond.child_by_field_name("right") if cond is not None and \
                        cond.type == "binary_expression" else None
                    if right is not None:
                        return normalise(node_text(right))
                    n = n.parent
        return ""

    def candidates(self, frame: Frame, device_loops: list[Node]) -> list[Region]:
        """Every part of the frame that communicates: each outermost loop holding NCCL calls (loops over the
        devices excepted), and the statements that communicate outside any loop, grown by the GPU work right
        before and after them."""
        body = frame.body
        top = body_statements(body)
        loops: dict[Node, None] = {}
        straight: list[int] = []
        for call in self.calls_in(body):
            if self.call_kind(call) != COMM:
                continue
            loop = _outermost_loop(call, body, device_loops)
            if loop is not None:
                loops[loop] = None
                continue
            at = next((i for i, s in enumerate(top) if s.start_byte <= call.start_byte < s.end_byte), None)
            if at is not None:
                straight.append(at)
        regions = [Region("loop", [loop]) for loop in loops]
        if straight:
            first, last = min(straight), max(straight)
            # grown by the GPU work around it, but not into the end of an earlier group (the communicator's own
            # creation in a group) nor into the start of a later one
            while first > 0 and self.kind(top[first - 1]) == WORK and not self._only(top[first - 1], "ncclGroupEnd"):
                first -= 1
            while last + 1 < len(top) and self.kind(top[last + 1]) == WORK and \
                    not self._only(top[last + 1], "ncclGroupStart"):
                last += 1
            regions.append(Region("statements", top[first:last + 1]))
        return sorted(regions, key=lambda r: r.start)

    def _only(self, stmt: Node, name: str) -> bool:
        """Whether `name` is the only work `stmt` does."""
        work = [short_name(c)[1] for c in self.calls_in(stmt) if self.call_kind(c) in (WORK, COMM)]
        return work == [name]

    def region_at(self, frame: Frame, kind: str, start: int, end: int) -> Region | None:
        """The region a plan names: the loop statement spanning exactly lines start-end, or the frame's
        statements within them."""
        if kind == "loop":
            for n in walk(frame.body):
                if n.type in LOOPS and line_of(n) == start and end_line_of(n) == end:
                    return Region("loop", [n])
            return None
        stmts = [s for s in body_statements(frame.body) if start <= line_of(s) and end_line_of(s) <= end]
        return Region("statements", stmts) if stmts else None

    # -- what a step leaves out -------------------------------------------------------------------------
    def left_out(self, frame_body: Node, step: list[Node], ends: bool = True,
                 loop: Node | None = None) -> list[tuple[Node, str]]:
        """(statement, why) for what one step leaves out: timing and reporting (and the host code that only
        feeds them, such as a convergence check's norm), MPI, choosing the device, and (with `ends`)
        synchronisations at either end of the step. The step's own `loop` header is the harness's, not a
        reader."""
        report = _Reporting(self, frame_body, loop)
        out: dict[Node, str] = {}
        for s in step:
            out.update(report.maximal(s))
        kept = [s for s in step if s not in out]
        for seq in (kept, list(reversed(kept))) if ends else ():
            for s in seq:
                if self.kind(s) != SYNC:
                    break
                out[s] = "host synchronisation at an end of the step (the harness synchronises)"
        return sorted(out.items(), key=lambda x: x[0].start_byte)

    def reached(self, statements: list[Node]) -> set[str]:
        """The host functions of the file that `statements` call, directly or through each other."""
        found: set[str] = set()
        todo = [c for s in statements for c in self.calls_in(s)]
        while todo:
            call = todo.pop()
            fn = self.callee_function(call)
            name = short_name(call)[1]
            if fn is not None and name not in found:
                found.add(name)
                todo += self.calls_in(fn)
        return found

    def leaves(self, node: Node) -> list[Node]:
        return [n for n in walk(node) if n.type in _LEAF_TYPES and _is_statement(n)]

    def statements_at(self, lines: set[int]) -> list[Node]:
        """The outermost statement starting on each of `lines` (inside functions: a body is no statement)."""
        out: dict[int, Node] = {}
        for n in walk(self.root):
            ln = line_of(n)
            if ln in lines and ln not in out and _is_statement(n):
                out[ln] = n
        return list(out.values())

    # -- the analysis's graph, seen from the step -------------------------------------------------------
    def step_nodes(self, frames: list[Frame], region: Region, skip: list[tuple[int, int]]) -> list[dict[str, Any]]:
        """The analysis graph's nodes (comm calls, copies, kernels, cuBLAS) that one step runs: reached through
        `frames`, at a line of the region in the last frame, outside the `skip` line spans (left out)."""
        out = []
        for n in self.report.graph.nodes:
            ln = frame_line(n, frames)
            if ln is not None and region.start <= ln <= region.end and not any(a <= ln <= b for a, b in skip):
                out.append(n)
        return out


class _Reporting:
    """Which statements of a function are timing and reporting: those whose calls are REPORT or DEVICE only,
    and then, repeatedly, host statements whose every written variable is read only by such statements."""

    def __init__(self, program: Program, body: Node, loop: Node | None = None) -> None:
        self.program = program
        leaves = program.leaves(body)
        kinds = {s: program.kind(s) for s in leaves}
        self.kinds = kinds
        self.report = {s for s in leaves if kinds[s] in (REPORT, DEVICE)}
        readers: dict[str, list[Node]] = {}
        units = leaves + [h for n in walk(body) if n.type in _COMPOUND_TYPES and n != loop for h in _headers(n)]
        for u in units:
            written = writes_of(u) if u.type in _LEAF_TYPES else set()
            for name in identifiers(u):
                if name not in written or u.type == "expression_statement":
                    readers.setdefault(name, []).append(u)
        changed = True
        while changed:
            changed = False
            for s in leaves:
                if s in self.report or kinds[s] != HOST:
                    continue
                w = writes_of(s)
                if w and all(all(r == s or self._reported(r) for r in readers.get(v, [])) for v in w):
                    self.report.add(s)
                    changed = True

    def _reported(self, unit: Node) -> bool:
        if unit in self.report:
            return True
        owner = unit.parent
        return owner is not None and owner.type in _COMPOUND_TYPES and self.is_report(owner)

    def is_report(self, stmt: Node) -> bool:
        if stmt.type in _LEAF_TYPES:
            return stmt in self.report
        if stmt.type not in _COMPOUND_TYPES:
            return False
        if any(self.program.kind(h) not in (HOST, REPORT, DEVICE) for h in _headers(stmt)):
            return False
        inner = [c for c in stmt.named_children if _is_statement(c) or c.type in ("else_clause", "case_statement")]
        # a synchronisation among reporting statements only waits for what they read (a norm to print)
        waits = [c for c in inner if c.type in _LEAF_TYPES and self.kinds.get(c) == SYNC]
        rest = [c for c in inner if c not in waits]
        return bool(rest) and all(self.is_report(c) for c in rest)

    def maximal(self, stmt: Node) -> list[tuple[Node, str]]:
        """The largest reporting statements in `stmt` that can be removed whole (statements of a block), with
        why."""
        if _is_statement(stmt) and self.is_report(stmt):
            return [(stmt, self.why(stmt))]
        out: list[tuple[Node, str]] = []
        for c in stmt.named_children:
            if c.type in ("compound_statement", "else_clause") or (stmt.type == "compound_statement"
                                                                   and _is_statement(c)):
                out += self.maximal(c)
        return out

    def why(self, stmt: Node) -> str:
        names = {short_name(c)[1] for c in self.program.calls_in(stmt)}
        if "cudaSetDevice" in names:
            return "device selection (the harness picks the device)"
        if any(n.startswith("MPI_") and n != "MPI_Wtime" for n in names):
            return "MPI (the harness runs the ranks)"
        if names & _PRINT_CALLS or any("cout" in node_text(x) or "cerr" in node_text(x) for x in walk(stmt)
                                       if x.type in ("identifier", "qualified_identifier")):
            return "reporting"
        if names & (_CLOCK_CALLS | _STREAM_EVENT_CALLS | _EVENT_LIFE_CALLS | {"cudaEventSynchronize"}):
            return "timing"
        return "feeds only timing and reporting"


def _taken(node: Node, defined: set[str]) -> bool:
    """Whether the preprocessor keeps `node` (#ifdef / #ifndef on the file's own #defines; other conditions are
    taken as true)."""
    child, n = node, node.parent
    while n is not None:
        if n.type == "preproc_ifdef":
            name = n.child_by_field_name("name")
            want = (name is not None and node_text(name) in defined) == node_text(n.children[0]).endswith("ifdef")
            if (child.type == "preproc_else") == want:
                return False
        child, n = n, n.parent
    return True


def _headers(stmt: Node) -> list[Node]:
    return [h for h in (stmt.child_by_field_name(f) for f in ("condition", "initializer", "update", "value"))
            if h is not None]


def _is_statement(node: Node) -> bool:
    """A statement of a block (not a declaration inside a for header or a condition, nor a function's body)."""
    parent = node.parent
    if parent is None:
        return False
    if node.type == "declaration" and parent.type in ("for_statement", "condition_clause"):
        return False
    if node.type == "compound_statement" and parent.type == "function_definition":
        return False
    return node.type in _STATEMENT_TYPES


def _outermost_loop(node: Node, stop: Node, device_loops: list[Node]) -> Node | None:
    found = None
    n = node.parent
    while n is not None and n != stop:
        if n.type in LOOPS and n not in device_loops:
            found = n
        n = n.parent
    return found


def frame_limits(frames: list[Frame], region: Region) -> list[int]:
    """Where each frame's own part ends (a byte): at the call into the next frame, or at the step."""
    out = []
    for k in range(len(frames)):
        into = frames[k + 1].call if k + 1 < len(frames) else None
        out.append(into.start_byte if into is not None else region.statements[0].start_byte)
    return out


def frame_line(node: dict[str, Any], frames: list[Frame]) -> int | None:
    """The line of the step's frame (the last of `frames`) where an analysis graph node happens: its own line
    when it is in that function, else the line of the call there that leads to it. None when the node is not
    reached through `frames`."""
    prefix = [[frames[i].name, frames[i + 1].call_line] for i in range(len(frames) - 1)]
    sites = node.get("sites") or []
    if sites[:len(prefix)] != prefix:
        return None
    rest = sites[len(prefix):]
    step = frames[-1].name
    if rest:
        return int(rest[0][1]) if rest[0][0] == step else None
    return int(node["line"]) if node.get("function") == step else None


def declarations(body: Node) -> dict[str, tuple[Node, Node]]:
    """Variables declared in a function body: name -> (declaration, its declarator); the first one wins."""
    out: dict[str, tuple[Node, Node]] = {}
    for n in walk(body):
        if n.type != "declaration":
            continue
        for d in n.children_by_field_name("declarator"):
            name = declarator_name(d)
            if name:
                out.setdefault(name, (n, d))
    return out


__all__ = ["COMM", "DEVICE", "ENV_CALLS", "EVENT_CREATE_CALLS", "Frame", "HOST", "IDENTIFIER_TYPES", "PARSE_CALLS",
           "Program", "REPORT", "Region", "SETUP", "SYNC", "WORK", "body_statements", "call_args", "declarations",
           "declarator_name", "end_line_of", "frame_limits", "frame_line", "identifiers", "line_of", "loop_body",
           "loop_counter", "normalise", "reads_counter", "root_name", "short_name", "step_counter", "writes_of"]
