"""The plan `cuco init` derives from a host program (`make_plan`).

Where the step is: main(), or the function main() reaches NCCL through when that is one call outside any loop
(at any depth: `Program.chain`). In that function every loop holding NCCL calls, and the statements holding
them outside any loop, could be the step; the one doing the most work is taken (a later one on a tie: the timed
loop after the warm-up), and the others are left out with a note when their work is part of it, or marked TODO
when it is not. Timing, reporting and MPI are left out of the step (`Program.left_out`). The buffers are the
device allocations of the functions on the way; their roles follow the reads and writes of the step's work
through every call it makes (the analysis binds parameters to arguments at any depth). What could not be
decided goes into the plan's `todo`, one reason each; a program with no NCCL call at all is refused.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from cuco_kit.errors import BadInput
from cuco_kit.importer.plan import CTYPES, BufferPlan, ImportPlan, LeftOut
from cuco_kit.importer.program import (
    EVENT_CREATE_CALLS,
    HOST,
    SYNC,
    Frame,
    Program,
    Region,
    body_statements,
    call_args,
    declarations,
    end_line_of,
    frame_limits,
    identifiers,
    line_of,
    reads_counter,
    root_name,
    short_name,
    step_counter,
    writes_of,
)
from cuco_kit.importer.size_expr import WORLD, element_count
from cuco_kit.importer.sizes import (
    MAX_WORLD,
    LocalSize,
    Values,
    accepted_worlds,
    file_constants,
    fixed_names,
    local_sizes,
    multiples,
    type_text,
)
from cuco_kit.source.analysis import REDUCING_COLLECTIVES, STREAM_CREATE_CALLS, Allocation, SetupCall
from cuco_kit.source.cuda_parse import Node, function_name, node_text, walk

COMM_INIT = ("ncclCommInitRank", "ncclCommInitRankConfig", "ncclCommInitRankScalable", "ncclCommInitAll")
_DEVICE_MEMORY = ("cuda", "nccl", "managed")
# NCCL datatype -> C element type, for buffers declared void*.
NCCL_CTYPES = {"ncclFloat": "float", "ncclFloat32": "float", "ncclHalf": "half", "ncclFloat16": "half",
               "ncclBfloat16": "__nv_bfloat16", "ncclInt": "int", "ncclInt32": "int", "ncclUint32": "uint32_t",
               "ncclInt64": "int64_t", "ncclUint64": "uint64_t", "ncclInt8": "int8_t", "ncclChar": "char",
               "ncclUint8": "uint8_t", "ncclFloat8e4m3": "__nv_fp8_e4m3", "ncclDouble": "double",
               "ncclFloat64": "double"}
_NAME = re.compile(r"sizeof\s*\([^()]*\)|(?<![\w.])(?<!->)[A-Za-z_]\w*")


def make_plan(code: str, filename: str = "program.cu", name: str | None = None) -> ImportPlan:
    """The plan of a host program. BadInput (one line) only for a program with no NCCL call (or not CUDA C++);
    everything else gets a plan, with what the analysis could not decide in its `todo`."""
    prog = Program(code, filename)
    if not (prog.report.collectives or prog.report.p2p):
        raise BadInput(f"{filename}: no NCCL collectives or send/recv calls; cuco init imports a host program "
                       "that communicates with NCCL (ncclAllReduce, ncclSend/ncclRecv, ...)")
    return _Deriver(prog, Path(filename).name, name).plan()


def substitute(text: str, replace: Callable[[str], str | None]) -> str:
    """`text` with each name for which `replace` gives something replaced by it (names inside sizeof(...) and
    after `.` or `->` stay)."""
    def sub(m: re.Match[str]) -> str:
        word = m.group(0)
        if word.startswith("sizeof"):
            return word
        got = replace(word)
        return word if got is None else got

    return _NAME.sub(sub, text)


def comm_init(prog: Program, functions: Iterable[str]) -> list[SetupCall]:
    return [s for s in prog.report.setup if s.call in COMM_INIT and s.function in set(functions)]


class _Deriver:
    def __init__(self, prog: Program, program: str, name: str | None) -> None:
        self.prog = prog
        self.rep = prog.report
        self.program = program
        self.name = name or re.sub(r"\W", "_", Path(program).stem) or "imported"
        self.todo: list[str] = []
        self.notes: list[str] = []

    def _open(self, why: str) -> ImportPlan:
        """A plan whose step the analysis could not find: every field to fill, and why."""
        return ImportPlan(self.program, self.name, f"imported from {self.program}", {}, [], [], "", "", "", "0",
                          todo=[why])

    def plan(self) -> ImportPlan:
        frames = self.prog.chain()
        if not frames:
            return self._open("no main(), and not exactly one function that reaches NCCL with nothing calling it: "
                              "set step_function, call_lines, step_kind and the step lines")
        self.frames = frames
        step = frames[-1]
        self.names = [f.name for f in frames]
        inits = comm_init(self.prog, self.names)
        self.devices = self._devices(inits)
        regions = self.prog.candidates(step, self.prog.device_loops(step, self.devices) if self.devices else [])
        if not regions:
            return self._open(f"{step.name}() reaches NCCL only through calls cuco init cannot follow: set "
                              "step_function, call_lines, step_kind and the step lines")
        region, left, nodes = self._choose(step, regions)
        self.region = region
        self.limits = frame_limits(frames, region)
        kept = [s for s in region.body() if all(s != x for x, _ in left)]
        step_ids = self._identifiers(region.body(), [s for s, _ in left])

        loop_var = self._loop_var(kept)
        comm, rank, world = self._communicator(nodes, inits, step.name)
        self.world_names = self._aliases(self._ranks_world(world))
        allocs = [a for a in self.rep.allocations
                  if a.function in self.names and a.kind in _DEVICE_MEMORY] + self._helper_allocations()
        streams = list(dict.fromkeys(self._norm(c.stream) for c in self.rep.streams
                                     if c.function in self.names and c.call in STREAM_CREATE_CALLS))
        events = list(dict.fromkeys(self._norm(e.event) for e in self.rep.events
                                    if e.function in self.names and e.call in EVENT_CREATE_CALLS and e.event
                                    and self._norm(e.event) not in self.prog.timing_events))
        mapped = {comm, *self.world_names, *self._aliases(rank), *(self._norm(a.buffer) for a in allocs), *streams,
                  *events, *self.prog.timing_events, *identifiers_of(self.devices), loop_var or ""} - {""}
        self.constants = file_constants(self.prog.root)
        local = [local_sizes(self.prog, f.body, self.limits[k], mapped) for k, f in enumerate(frames)]
        self.local_vars = [{x.variable for x in per} for per in local]

        helper_ids, helper_left = self._helpers(kept)
        needed = [self._locals(k, step_ids if k == len(frames) - 1 else self._call_ids(k), mapped)
                  for k in range(len(frames))]
        locals_ = list(dict.fromkeys(n for per in needed for n in per))
        local_ids: set[str] = set().union(*(self._definition_ids(k, per) for k, per in enumerate(needed)))
        buffers = self._buffers(allocs, nodes, step_ids)

        used = step_ids | helper_ids | local_ids | {x for b in buffers for x in identifiers_of(b.count)}
        used |= {x for k in range(len(frames) - 1) for x in self._call_ids(k)}
        sizes = self._sizes(used - mapped, local, set(locals_))
        values = Values(self.constants, set(sizes) | {x.variable for per in local for x in per})
        fixed_set = fixed_names(self.prog, values)
        fixed = [k for k in sizes if k in fixed_set]
        self.notes += [f"size {k} is needed at compile time or as a launch's block shape: the seed keeps "
                       f"{k}={sizes[k]} and checks the parameter" for k in fixed]
        if loop_var is not None:
            sizes[loop_var] = 0
        free = {k: v for k, v in sizes.items() if k not in fixed and k != loop_var}
        known = {k: c.value for k, c in self.constants.items()} | {k: sizes[k] for k in fixed}
        multiple_of = multiples(self.prog, free, known, self.world_names, values)
        worlds = accepted_worlds(frames, self.world_names, self.prog)
        if worlds:
            self.notes.append(f"the program refuses other world sizes: it runs on {worlds} rank(s)")

        compute = [n for n in nodes if n["kind"] in ("kernel", "blas")] or nodes
        main_stream = self._norm(compute[-1]["stream"]) if compute else (streams[0] if streams else "0")
        step_streams = {self._norm(n["stream"]) for n in nodes} | step_ids
        if main_stream not in streams:
            self.notes.append(f"the step's last work runs on stream {main_stream!r}, which the program does not "
                              "create; it becomes the harness stream")
        self._mpi_results(left, kept)
        elsewhere = sorted({short_name(c)[1] for s in kept for c in self.prog.calls_in(s)
                            if short_name(c)[1] in self.prog.declared_only})
        if elsewhere:
            self.todo.append(f"the step calls {', '.join(f'{f}()' for f in elsewhere)}, which {self.program} "
                             "declares but another file defines: its reads and writes are unknown here and the seed "
                             "needs its code (put it in the seed or a .cuh next to it), then remove this line")
        for stmt in kept:
            if any(self.prog.call_kind(c) == SYNC for c in self.prog.calls_in(stmt)):
                self.notes.append(f"L{line_of(stmt)} synchronises the host inside the step; the harness times the "
                                  "stream, so consider removing it")
        kernels = sorted({n["name"] for n in nodes if n["kind"] in ("kernel", "blas")})
        calls = sorted({n["name"] for n in nodes if n["kind"] in ("collective", "p2p")})
        summed = {"collective": MAX_WORLD if set(calls) & REDUCING_COLLECTIVES else 1,
                  "kernel": max([v for k, v in sizes.items() if k != loop_var] or [1]) if kernels else 1}
        return ImportPlan(
            program=self.program, name=self.name,
            description=f"imported from {self.program}: " + ", ".join(calls)
            + (" with " + ", ".join(kernels) if kernels else ""),
            sizes=sizes, fixed_sizes=fixed, buffers=buffers, comm=comm, rank=rank, world=world,
            main_stream=main_stream, side_streams=[x for x in streams if x in step_streams and x != main_stream],
            events=[e for e in events if e in step_ids], step_function=step.name,
            call_lines=[f.call_line for f in frames[1:]], step_kind=region.kind, step_start=region.start,
            step_end=region.end, loop_var=loop_var, devices=self.devices, locals=locals_,
            left_out=[LeftOut(line_of(x), node_text(x).strip().splitlines()[0][:100], why)
                      for x, why in sorted(left + helper_left, key=lambda item: item[0].start_byte)],
            multiple_of={k: v for k, v in multiple_of.items() if v > 1}, worlds=worlds, summed_terms=summed,
            todo=self.todo, notes=self.notes)

    def _helpers(self, kept: list[Node]) -> tuple[set[str], list[tuple[Node, str]]]:
        """What the host functions the step calls name, and what they leave out (timing, reporting); a note
        lists the host functions the seed leaves out."""
        helpers = self.prog.reached(kept)
        ids: set[str] = set()
        left: list[tuple[Node, str]] = []
        for h in sorted(helpers):
            fn = self.prog.functions[h]
            ids |= identifiers(fn)
            body = fn.child_by_field_name("body")
            if body is not None:
                left += self.prog.left_out(body, body_statements(body), ends=False)
        dropped = sorted(set(self.prog.functions) - helpers - set(self.names))
        if dropped:
            self.notes.append("left out of the seed (the step does not call them): "
                              + ", ".join(f"{d}()" for d in dropped))
        return ids, left

    def _buffers(self, allocs: list[Allocation], nodes: list[dict[str, Any]], step_ids: set[str]) -> list[BufferPlan]:
        """The device allocations of the frames that the step's work reads or writes, with their roles."""
        roles = self._roles(nodes, {self._norm(a.buffer) for a in allocs})
        out: list[BufferPlan] = []
        for a in allocs:
            name = self._norm(a.buffer)
            if name in {b.name for b in out}:
                continue
            if name not in roles:
                if name in step_ids:
                    self.notes.append(f"buffer {name} (L{a.line}) is named in the step but no work there reads or "
                                      "writes it: left out")
                continue
            k = self.names.index(a.function) if a.function in self.names else 0
            ctype = self._ctype(name, k)
            dtype = CTYPES.get(ctype, "TODO")
            out.append(BufferPlan(name, roles[name], dtype, ctype,
                                  self._in_sizes(element_count(a.bytes or "0", ctype), k), a.line))
            if dtype == "TODO":
                self.todo.append(f"buffer {name} (L{a.line}): element type {ctype!r} has no workload dtype: set "
                                 "its dtype and ctype, then remove this line")
        return out

    def _sizes(self, used: set[str], local: list[list[LocalSize]], locals_: set[str]) -> dict[str, int]:
        """The sizes in use: file-scope constants (a derived one puts what it is written with in use), then the
        frames' integer locals with a value the program writes down."""
        changed = True
        while changed:
            before = len(used)
            for c in self.constants.values():
                if c.name in used:
                    used |= c.reads
            changed = len(used) != before
        sizes = {k: c.value for k, c in self.constants.items() if not c.reads and k in used}
        for per in local:
            for x in per:
                if x.variable not in used or x.variable in locals_:
                    continue
                if x.param in sizes:
                    self.todo.append(f"size {x.param} is declared in two functions: rename one, then remove this "
                                     "line")
                    continue
                sizes[x.param] = x.value if x.value is not None else 0
                if x.value is None:
                    self.todo.append(f"size {x.param} (L{line_of(x.declaration)}) comes from the {x.source} with no "
                                     "default in the program: give its value in sizes, then remove this line")
                elif x.source != "constant":
                    self.notes.append(f"size {x.param}: the program reads it from the {x.source}; its default "
                                      f"{x.value} is the workload's")
                if x.note:
                    self.notes.append(x.note)
        return sizes

    def _loop_var(self, kept: list[Node]) -> str | None:
        """The step loop's counter when the step reads it (a size, default 0, so the reference is told the step)."""
        loop = self.region.loop
        v = step_counter(loop) if loop is not None else None
        if v and reads_counter(kept, v):
            self.notes.append(f"the step reads the loop counter {v}: it is a size (default 0), so the reference is "
                              "told which step it checks")
            return v
        if v:
            self.notes.append(f"the step does not read its loop counter {v}: every step does the same work")
        return None

    # -- where the step is ----------------------------------------------------------------------------
    def _choose(self, step: Frame, regions: list[Region]) -> tuple[Region, list[tuple[Node, str]],
                                                                   list[dict[str, Any]]]:
        scored = []
        for r in regions:
            left = self.prog.left_out(step.body, r.body(), loop=r.loop)
            spans = [(line_of(s), end_line_of(s)) for s, _ in left]
            scored.append((r, left, self.prog.step_nodes(self.frames, r, spans)))
        best = max(scored, key=lambda x: (len(x[2]), x[0].start))
        taken = {n["name"] for n in best[2]}
        where = f"lines {best[0].start}-{best[0].end}"
        for r, _, nodes in scored:
            if r is best[0]:
                continue
            what = f"{'the loop' if r.kind == 'loop' else 'the statements'} at lines {r.start}-{r.end}"
            work = ", ".join(sorted({n["name"] for n in nodes})) or "nothing"
            if {n["name"] for n in nodes} <= taken:
                same = "the same work" if len(nodes) == len(best[2]) else "part of the step's work"
                self.notes.append(f"{what} ({work}: {same}, e.g. a warm-up) left out; the step is {where}")
            else:
                self.todo.append(f"which part of {step.name}() is the step: cuco init took {where}; {what} also "
                                 f"communicate ({work}) and are left out: set step_start, step_end and step_kind, "
                                 "then remove this line")
        return best

    def _helper_allocations(self) -> list[Allocation]:
        """Allocations a function on the way makes through a helper of the file (`alloc(&x, n)` whose body does
        `cudaMalloc(p, n * sizeof(float))`), named and sized with the caller's arguments."""
        out: list[Allocation] = []
        for f in self.frames:
            for call in self.prog.calls_in(f.body):
                fn = self.prog.callee_function(call)
                if fn is None or any(fr.node == fn for fr in self.frames):
                    continue
                binding = dict(zip(Frame(fn, function_name(fn)).parameter_names(),
                                   (node_text(a).strip() for a in call_args(call))))
                for a in self.rep.allocations:
                    target = root_name(a.buffer)
                    if a.function == function_name(fn) and a.kind in _DEVICE_MEMORY and target in binding:
                        nbytes = substitute(a.bytes or "0", _argument_of(binding))
                        out.append(Allocation(a.call, root_name(binding[target]), line_of(call), nbytes, a.kind,
                                              f.name))
        return out

    def _ranks_world(self, world: str) -> str:
        """The world size as the harness sees it: with several devices per process (`nranks * ndev`), one device
        per rank makes it the process count (`nranks`)."""
        if self.devices and self.devices != world:
            d = re.escape(self.devices)
            m = re.fullmatch(rf"\s*(\w+)\s*\*\s*{d}\s*|\s*{d}\s*\*\s*(\w+)\s*", world)
            if m:
                return m.group(1) or m.group(2)
        return world

    def _devices(self, inits: list[SetupCall]) -> str:
        """What the loops over one process's devices run to: ncclCommInitAll's count, or the bound of the loop
        that makes one communicator per device (`ncclCommInitRank(comms + i, ...)`); empty for one device."""
        for s in inits:
            if s.call == "ncclCommInitAll" and len(s.args) > 1:
                return s.args[1].strip()
            if s.args and re.search(r"[\[+]", s.args[0]):
                bound = self.prog.loop_bound_at(s.line, [f.node for f in self.frames])
                if bound:
                    return bound
        return ""

    def _communicator(self, nodes: list[dict[str, Any]], inits: list[SetupCall], where: str) -> tuple[str, str, str]:
        used = [self._norm(n["comm"]) for n in nodes if n.get("comm")]
        comm = used[0] if used else ""
        if len(set(used)) > 1:
            self.todo.append(f"the step uses several communicators ({', '.join(sorted(set(used)))}); the harness gives "
                             "one: keep one, then remove this line")
        init = next((s for s in inits if s.handle is not None and self._norm(s.handle) == comm), None)
        if init is None:
            self.todo.append(f"the step's communicator {comm!r} is not created by an ncclCommInitRank (or "
                             f"ncclCommInitAll) in the functions on the way to {where}(): set comm, rank and world "
                             "(empty when the program has no such variable), then remove this line")
            return comm, "", ""
        if init.call == "ncclCommInitAll":
            return comm, "", init.args[1].strip() if len(init.args) > 1 else ""
        if len(init.args) < 4:
            self.todo.append(f"L{init.line} {init.call} has {len(init.args)} arguments; set rank and world, then "
                             "remove this line")
            return comm, "", ""
        return comm, init.args[3].strip(), init.args[1].strip()

    def _aliases(self, expr: str) -> set[str]:
        """The names a value (the rank or the world size) has in the frames: its variable, and every parameter of
        a function on the way that is passed it."""
        names = {expr} if re.fullmatch(r"[A-Za-z_]\w*", expr) else set()
        for f in self.frames[1:]:
            assert f.call is not None
            args = [node_text(a).strip() for a in call_args(f.call)]
            for p, a in zip(f.parameter_names(), args):
                if a in names and p:
                    names.add(p)
        return names

    # -- names of the frames --------------------------------------------------------------------------
    def _norm(self, expr: str | None) -> str:
        text = (expr or "").strip()
        return root_name(text)

    def _identifiers(self, stmts: list[Node], skip: list[Node]) -> set[str]:
        out: set[str] = set()
        for s in stmts:
            for n in walk(s):
                if n.type in ("identifier", "type_identifier") and not any(
                        x.start_byte <= n.start_byte < x.end_byte for x in skip):
                    out.add(node_text(n))
        return out

    def _call_ids(self, k: int) -> set[str]:
        call = self.frames[k + 1].call
        return identifiers(call.child_by_field_name("arguments") or call) if call is not None else set()

    def _top(self, k: int) -> list[Node]:
        """Frame k's statements before its limit (the step, or the call into the next frame)."""
        return [s for s in body_statements(self.frames[k].body) if s.start_byte < self.limits[k]]

    def _locals(self, k: int, ids: set[str], mapped: set[str]) -> list[str]:
        """Frame k's locals that `ids` need (with what their definitions need), in declaration order; a local
        the seed cannot compute is a TODO."""
        frame = self.frames[k]
        top = self._top(k)
        decls = {n: v for n, v in declarations(frame.body).items() if any(s == v[0] for s in top)}
        skip = mapped | self.local_vars[k] | set(frame.parameter_names()) | set(self.constants)
        todo = [i for i in ids if i in decls and i not in skip]
        need: set[str] = set()
        while todo:
            name = todo.pop()
            if name in need:
                continue
            need.add(name)
            for s in self._definitions(k, name, report=True):
                todo += [i for i in identifiers(s) - writes_of(s) if i in decls and i not in skip and i not in need]
        return sorted(need, key=lambda n: decls[n][1].start_byte)

    def _definitions(self, k: int, name: str, report: bool = False) -> list[Node]:
        """The declaration of local `name` in frame k and the host statements after it that set it; with
        `report`, a statement setting it that the seed cannot run is a TODO."""
        decl = declarations(self.frames[k].body)[name][1]
        out = [decl]
        for s in self._top(k):
            if name in writes_of(s) and not (s.start_byte <= decl.start_byte < s.end_byte):
                kind = self.prog.kind(s)
                if kind != HOST or any(node_text(x) in ("argv", "argc") for x in walk(s)):
                    if report:
                        self.todo.append(f"local {name} is set at L{line_of(s)} by code the seed cannot run "
                                         f"({node_text(s).strip().splitlines()[0][:60]}): make it a size or compute "
                                         "it another way, then remove this line")
                    continue
                out.append(s)
        return out

    def _definition_ids(self, k: int, names: list[str]) -> set[str]:
        out: set[str] = set()
        for name in names:
            for s in self._definitions(k, name):
                out |= identifiers(s)
        return out

    def _sizeof_typedefs(self, text: str) -> str:
        """`sizeof(real)` -> `sizeof(float)` for the file's typedefs."""
        return re.sub(r"sizeof\s*\(\s*([A-Za-z_]\w*)\s*\)",
                      lambda m: f"sizeof({self.prog.typedefs.get(m.group(1), m.group(1))})", text)

    def _in_sizes(self, text: str, k: int, depth: int = 0) -> str:
        """C text of frame k rewritten in sizes, `world` and literals: locals replaced by what they are written
        with, parameters by the caller's arguments, derived constants by their value as written."""
        frame = self.frames[k]
        decls = declarations(frame.body)
        params = frame.parameter_names()
        args = [node_text(a).strip() for a in call_args(frame.call)] if frame.call is not None else []

        def replace(name: str) -> str | None:
            if name in self.world_names:
                return WORLD
            if name == self.devices and self.devices not in self.world_names:
                return "1"  # one device per rank under the harness
            if depth > 8 or name in self.local_vars[k]:
                return None
            c = self.constants.get(name)
            if c is not None and c.reads:
                return f"({self._in_sizes(c.expr, k, depth + 1)})"
            if c is not None:
                return None
            if name in decls:
                value = decls[name][1].child_by_field_name("value") if decls[name][1].type == "init_declarator" \
                    else None
                if value is not None and value.type != "initializer_list":
                    return f"({self._in_sizes(node_text(value), k, depth + 1)})"
                return None
            if name in params and k > 0 and params.index(name) < len(args):
                return f"({self._in_sizes(args[params.index(name)], k - 1, depth + 1)})"
            return None

        return " ".join(substitute(self._sizeof_typedefs(text), replace).split())

    def _ctype(self, name: str, k: int) -> str:
        """The element type of buffer `name`: from its declaration, else from the NCCL datatype of a call of the
        step that moves it."""
        decls = declarations(self.frames[k].body)
        var = root_name(name)
        if var in decls:
            t = re.sub(r"\b(const|volatile|static|__restrict__|restrict)\b", "", type_text(decls[var][0])).strip()
            t = self.prog.typedefs.get(" ".join(t.split()), " ".join(t.split()))
            if t and t != "void":
                return t
        for c in self.rep.collectives + self.rep.p2p:
            if any(self._norm(b) == name for b in c.buffers) and c.datatype in NCCL_CTYPES:
                return NCCL_CTYPES[c.datatype]
        return "void"

    # -- roles ----------------------------------------------------------------------------------------
    def _roles(self, nodes: list[dict[str, Any]], names: set[str]) -> dict[str, str]:
        """input / output / inout / scratch from the order of reads and writes in the step: read only = input;
        read first, then written = inout; written first = output when the step's last touch writes it (an
        in-place all-reduce of what a kernel produced), scratch when the step reads it last. A kernel that reads
        and writes a buffer nobody filled before the step produces it (a write first)."""
        first_id = min((n["id"] for n in nodes), default=0)
        filled: set[str] = set()
        for n in self.rep.graph.nodes:
            if n["id"] < first_id:
                filled |= {self._norm(b) for b in n["writes"]}
        first: dict[str, str] = {}
        last: dict[str, str] = {}
        written: set[str] = set()
        for n in nodes:
            reads = {self._norm(b) for b in n["reads"]} & names
            writes = {self._norm(b) for b in n["writes"]} & names
            for b in reads | writes:
                first.setdefault(b, "write" if b in writes and (b not in reads or b not in filled) else "read")
                last[b] = "write" if b in writes else "read"
            written |= writes
        roles = {}
        for b, how in first.items():
            if how == "read":
                roles[b] = "inout" if b in written else "input"
            else:
                roles[b] = "output" if last[b] == "write" else "scratch"
        return roles

    def _mpi_results(self, left: list[tuple[Node, str]], kept: list[Node]) -> None:
        """A left-out MPI call whose result the step still reads is a TODO (the harness has no MPI)."""
        kept_ids = self._identifiers(kept, [s for s, _ in left])
        for s, why in left:
            if why.startswith("MPI"):
                needed = writes_of(s) & kept_ids
                if needed:
                    self.todo.append(f"L{line_of(s)} ({node_text(s).strip()[:60]}) is MPI, left out, but the step "
                                     f"reads what it sets ({', '.join(sorted(needed))}): port it by hand, then remove "
                                     "this line")


def _argument_of(binding: dict[str, str]) -> Callable[[str], str | None]:
    """A `substitute` replacement: a parameter by its argument (in parentheses)."""
    return lambda name: f"({binding[name]})" if name in binding else None


def identifiers_of(text: str) -> set[str]:
    return set(re.findall(r"[A-Za-z_]\w*", text)) - {WORLD}


__all__ = ["COMM_INIT", "NCCL_CTYPES", "comm_init", "make_plan", "substitute"]
