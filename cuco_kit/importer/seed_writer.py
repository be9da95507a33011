"""The deterministic port: a host-driven program + its import plan -> a seed in the candidate ABI.

The program's file is kept as written where the seed needs it: types, macros (error-check macros that print
and exit() now return the ABI's error code), constants, device code and the host functions the step calls, at
any depth. Left out, each with a one-line comment: main() and the functions on the way to the step (they become
the entry points), host functions the step does not call (MPI set-up helpers, reporting), declarations that
need <mpi.h>, the MPI include and EVOLVE markers (the fast path places its own). Free sizes become workload
parameters: a ``#define`` or const becomes a file-scope variable that cuco_setup sets (so every function that
reads it sees the parameter), a local gets the parameter where it was declared; fixed sizes stay compiled in and
cuco_setup checks them.

``cuco_step`` is the step, as written, less the statements the plan leaves out, after a prologue per function on
the way (main() first, each in its own block): the harness's values under the program's names (communicator,
rank, world size, tensors, the harness stream, sizes), the arguments of the call into the next function, and
the locals the step reads. Scratch buffers, side streams and events are the seed's state, a CucoState kept by
cuco_state<CucoState> and made in cuco_setup, as in the samples; a side stream is a cuco_side_stream_t, forked
from and joined back to the harness stream. The file's frame (head, state, entry points) is
templates/seed.cu.in; what fills it is computed here. With one process driving every
device (ncclCommInitAll) the per-device arrays hold this rank's entry, and a loop over the devices runs once,
for this rank. The seed builds for `nccl` and for `symm` (host NCCL served by that backend's layer).
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from cuco_kit.errors import BadInput
from cuco_kit.importer.plan import ImportPlan
from cuco_kit.importer.program import (
    EVENT_CREATE_CALLS,
    Frame,
    Program,
    body_statements,
    call_args,
    declarations,
    declarator_name,
    frame_limits,
    identifiers,
    line_of,
    loop_body,
    loop_counter,
    short_name,
    writes_of,
)
from cuco_kit.importer.size_expr import WORLD
from cuco_kit.importer.sizes import Constant, LocalSize, file_constants, local_sizes, type_text
from cuco_kit.importer.source_template import render
from cuco_kit.source.analysis import COMM_CALLS
from cuco_kit.source.cuda_parse import Node, node_text, walk
from cuco_kit.source.source_file import read_source

TODO = "TODO(cuco init)"
RECORDED = "cuco_recorded_error"
HELPER_STREAM = "cuco_harness_stream"
SEED_BACKENDS = "nccl,symm"
_MPI_INCLUDE = re.compile(r"^[ \t]*#[ \t]*include[ \t]*[<\"]mpi\.h[>\"][^\n]*\n?", re.MULTILINE)
_LOCAL_INCLUDE = re.compile(r"^[ \t]*#[ \t]*include[ \t]*\"([^\"]+)\"[^\n]*\n?", re.MULTILINE)
_EVOLVE_MARKER = re.compile(r"^[ \t]*//[ \t]*EVOLVE-BLOCK-(?:START|END)\b[^\n]*\n?", re.MULTILINE)
# A function-like macro, its continuation lines included.
_MACRO = re.compile(r"^[ \t]*#[ \t]*define[ \t]+(\w+)\(([^)]*)\)((?:[^\n]*\\\n)*[^\n]*)", re.MULTILINE)
# What an error-check macro of a stand-alone program does that a candidate may not (L0's host-call allow-list).
_PROCESS_CALLS = re.compile(r"\b(exit|abort|_exit|MPI_Abort|fprintf|printf|puts|perror)\s*\(")
_FILE_SCOPE = ("translation_unit", "declaration_list", "template_declaration", "linkage_specification")
_ENTRY = "\0cuco-entry-points\0"
# The legacy default stream as programs write it, and where calls take their stream (NCCL calls: the last).
_DEFAULT_STREAMS = frozenset({"0", "NULL", "nullptr", "cudaStreamDefault", "cudaStreamLegacy", "(cudaStream_t)0"})
_STREAM_ARG = {"cudaMemcpyAsync": 4, "cudaMemsetAsync": 3, "cudaMemcpy2DAsync": 7, "cudaEventRecord": 1,
               "cudaLaunchKernel": 5, "cudaLaunchCooperativeKernel": 5}


def error_macros_returning(text: str, recording: frozenset[str] = frozenset()) -> str:
    """Error-check macros that print and exit() (fine in a program, refused in a candidate) rewritten to return
    the ABI's error code from the entry point instead. Those in `recording` (used by functions the step calls,
    where `return CODE;` may not compile or would be lost) record the first error in RECORDED instead, which
    cuco_step returns."""
    declared = False

    def sub(m: re.Match[str]) -> str:
        nonlocal declared
        name, params, body = m.group(1), m.group(2), m.group(3)
        arg = params.split(",")[0].strip()
        if not arg or not _PROCESS_CALLS.search(body):
            return m.group(0)
        code = "CUCO_ERR_NCCL" if "nccl" in (name + body).lower() else "CUCO_ERR_CUDA"
        if name not in recording:
            return (f"#define {name}({params}) do {{ if ((int)({arg}) != 0) return {code}; }} while (0)  "
                    "// cuco init: returns an error code (the program ended the process)")
        flag = "" if declared else (f"static int {RECORDED} = CUCO_OK;  // cuco init: the first error the "
                                    "program's checks met (cuco_step returns it)\n")
        declared = True
        return (f"{flag}#define {name}({params}) do {{ if ((int)({arg}) != 0 && {RECORDED} == CUCO_OK) "
                f"{RECORDED} = {code}; }} while (0)  // cuco init: records the error (the program ended the "
                "process)")

    return _MACRO.sub(sub, text)


def _macro_names(text: str) -> set[str]:
    return {m.group(1) for m in _MACRO.finditer(text) if _PROCESS_CALLS.search(m.group(3))}


def write_seed(plan: ImportPlan, code: str, headers: Mapping[str, str] | None = None) -> str:
    """The seed's source text (candidate ABI; it keeps the program's host NCCL calls). `headers`: the program's
    own headers (``#include "name"`` -> text), inlined so the seed stays one file."""
    return _SeedWriter(plan, code, headers or {}).text()


def inline_headers(text: str, headers: Mapping[str, str], seen: frozenset[str] = frozenset()) -> str:
    """`text` with each ``#include "name"`` of one of `headers` replaced by that header's text (once each)."""
    def sub(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in headers or name in seen:
            return m.group(0)
        body = inline_headers(headers[name], headers, seen | {name}).rstrip("\n")
        return (f"// cuco init: the program's header {name}, inlined\n{body}\n"
                f"// cuco init: end of {name}\n")

    return _LOCAL_INCLUDE.sub(sub, text)


def own_headers(program: Path, code: str) -> dict[str, str]:
    """The program's own headers: ``#include "name"`` files next to it (and those they include), by name."""
    out: dict[str, str] = {}
    todo = [m.group(1) for m in _LOCAL_INCLUDE.finditer(code)]
    while todo:
        name = todo.pop()
        path = program.parent / name
        if name in out or not path.is_file():
            continue
        out[name] = read_source(path, "header")
        todo += [m.group(1) for m in _LOCAL_INCLUDE.finditer(out[name])]
    return out


def _identifier(text: str) -> bool:
    return re.fullmatch(r"[A-Za-z_]\w*", text) is not None


def _member(name: str) -> str:
    return re.sub(r"\W+", "_", name).strip("_")


def _c_count(count: str) -> str:
    return re.sub(rf"\b{WORLD}\b", "ctx->world_size", count)


@dataclass
class _Edit:
    start: int
    end: int
    text: str


class _SeedWriter:
    def __init__(self, plan: ImportPlan, code: str, headers: Mapping[str, str]) -> None:
        self.plan = plan
        self.headers = headers
        self.code = code
        self.data = code.encode("utf-8")
        self.prog = Program(code, plan.program)
        frames = self.prog.frames_for(plan.step_function, plan.call_lines)
        region = None if frames is None else self.prog.region_at(frames[-1], plan.step_kind, plan.step_start,
                                                                   plan.step_end)
        if frames is None or region is None:
            raise BadInput(f"the plan's step ({plan.step_function}() lines {plan.step_start}-{plan.step_end}) is not "
                           f"in {plan.program}; check it with cuco init --plan-only")
        self.frames: list[Frame] = frames
        self.region = region
        self.left = self.prog.statements_at({x.line for x in plan.left_out})
        self.step = [s for s in region.body() if s not in self.left]
        self.constants = file_constants(self.prog.root)
        self.limits = frame_limits(frames, region)
        self.local_sizes: list[list[LocalSize]] = [
            [s for s in local_sizes(self.prog, f.body, self.limits[k], {plan.loop_var or ""}) if s.param in plan.sizes]
            for k, f in enumerate(frames)]
        bound = {s.param for per in self.local_sizes for s in per} | {plan.loop_var}
        self.free_globals = [c for c in self.constants.values() if c.name in plan.sizes
                             and c.name not in plan.fixed_sizes and c.name not in bound]
        self.derived = self._derived_globals()
        self.other_sizes = [k for k in plan.sizes if k not in bound and k not in self.constants]
        self.device_loops = self.prog.device_loops(frames[-1], plan.devices) if plan.devices else []
        helpers = [self.prog.functions[n] for n in self.prog.reached(self.step)]
        self.recording = frozenset(_macro_names(code) & {x for fn in helpers for x in identifiers(fn)})

    # -- the whole file -------------------------------------------------------------------------------
    def text(self) -> str:
        """templates/seed.cu.in filled: the head, the program's kept text, and the entry points where main() was."""
        p = self.plan
        via = f" (main() calls it at line(s) {', '.join(map(str, p.call_lines))})" if p.call_lines else ""
        helper = (f"static cudaStream_t {HELPER_STREAM} = 0;  // cuco init: the harness stream, for the functions "
                  "the step calls (the program used the default stream)") if self._helper_stream_edits() else ""
        before, after = self._file_text().split(_ENTRY, 1)
        text = render("seed.cu", backends=SEED_BACKENDS, name=p.name, program=p.program,
                      step_start=str(p.step_start), step_end=str(p.step_end), step_function=p.step_function,
                      via=via, helper_stream=helper, before_entry=before, after_entry=after,
                      state_members="\n".join(self._state_members()), state_release="\n".join(self._release()),
                      setup_checks="\n".join(self._setup_checks()), setup_state="\n".join(self._setup_state()),
                      step_body="\n".join(self._step_lines()), step_result=RECORDED if self.recording else "CUCO_OK")
        return text.rstrip() + "\n"

    def _file_text(self) -> str:
        edits: list[_Edit] = []
        main = self.frames[0].node
        edits.append(_Edit(self._extent(main)[0], self._extent(main)[1], _ENTRY))
        for f in self.frames[1:]:
            start, end = self._extent(self._scope_node(f.node))
            edits.append(_Edit(start, end, f"// cuco init: {f.name}() became cuco_setup / cuco_step / cuco_teardown "
                                           f"(the step is its lines {self.plan.step_start}-{self.plan.step_end})\n"))
        for name in self._dropped():
            fn = self.prog.functions[name]
            start, end = self._extent(self._scope_node(fn))
            edits.append(_Edit(start, end, f"// cuco init: {name}() is left out (the step does not call it)\n"))
        for n in self.prog.root.children:
            if n.type == "declaration" and any(x.startswith("MPI_") for x in identifiers(n)) and not any(
                    e.start <= n.start_byte < e.end for e in edits):
                start, end = self._extent(n)
                edits.append(_Edit(start, end, "// cuco init: a declaration that needs <mpi.h> is left out\n"))
        edits += self._size_edits() + self._helper_stream_edits()
        kept = [e for e in edits if e.text != _ENTRY]
        for s in self.left:
            if not self.region.contains(s) and not any(e.start <= s.start_byte < e.end for e in kept):
                start, end = self._extent(s)
                edits.append(_Edit(start, end, ""))
        text = inline_headers(self._apply(0, len(self.data), edits), self.headers)
        text = _EVOLVE_MARKER.sub("", _MPI_INCLUDE.sub("", text))
        return error_macros_returning(text, self.recording)

    def _scope_node(self, fn: Node) -> Node:
        return fn.parent if fn.parent is not None and fn.parent.type == "template_declaration" else fn

    def _dropped(self) -> list[str]:
        """Host functions at file or namespace scope the seed does not need: not reached from the step and not
        named by anything kept."""
        frames = {f.name.split("::")[-1] for f in self.frames}
        keep = self.prog.reached(self.step)
        removed = {name for name, fn in self.prog.functions.items()
                   if name not in keep and name not in frames and self._at_file_scope(fn)}
        changed = True
        while changed:
            changed = False
            gone = [self._scope_node(self.prog.functions[n]) for n in removed] + [f.node for f in self.frames]
            for name in sorted(removed):
                for x in walk(self.prog.root):
                    if x.type == "identifier" and node_text(x) == name and not any(
                            g.start_byte <= x.start_byte < g.end_byte for g in gone) and self._used_outside(x):
                        removed.discard(name)
                        changed = True
                        break
        return sorted(removed)

    def _at_file_scope(self, fn: Node) -> bool:
        scope = self._scope_node(fn).parent
        return scope is not None and scope.type in _FILE_SCOPE

    @staticmethod
    def _used_outside(ident: Node) -> bool:
        """An identifier outside a function declaration's own name (a prototype names the function too)."""
        p = ident.parent
        return not (p is not None and p.type == "function_declarator")

    def _extent(self, node: Node) -> tuple[int, int]:
        """A node's bytes grown to whole lines when nothing else shares them (a trailing comment goes too)."""
        data = self.data
        start, end = node.start_byte, node.end_byte
        line_start = data.rfind(b"\n", 0, start) + 1
        if not data[line_start:start].strip():
            start = line_start
        nl = data.find(b"\n", end)
        rest = data[end:nl if nl >= 0 else len(data)]
        if not rest.strip() or rest.strip().startswith(b"//"):
            end = nl + 1 if nl >= 0 else len(data)
        return start, end

    def _apply(self, start: int, end: int, edits: list[_Edit]) -> str:
        out, pos = [], start
        for e in sorted((e for e in edits if start <= e.start and e.end <= end), key=lambda e: e.start):
            if e.start < pos:
                continue  # inside something already replaced
            out.append(self.data[pos:e.start].decode("utf-8"))
            out.append(e.text)
            pos = e.end
        out.append(self.data[pos:end].decode("utf-8"))
        return "".join(out)

    # -- sizes ----------------------------------------------------------------------------------------
    def _derived_globals(self) -> list[Constant]:
        """File-scope constants (not #defines) written with a free size: variables recomputed by cuco_setup."""
        free = {c.name for c in self.free_globals}
        out: list[Constant] = []
        for c in self.constants.values():
            if not c.define and c.reads & (free | {d.name for d in out}) and c.name not in self.plan.fixed_sizes:
                out.append(c)
        return out

    def _size_edits(self) -> list[_Edit]:
        edits: list[_Edit] = []
        changed = {c.name: c for c in self.free_globals + self.derived}
        for c in self.free_globals:
            if c.define:
                start, end = self._extent(c.node)
                edits.append(_Edit(start, end, f"static {c.ctype} cuco_size_{c.name} = {c.value};  // cuco init: the "
                                               f"workload parameter {c.name} (cuco_setup sets it)\n"
                                               f"#define {c.name} (cuco_size_{c.name})\n"))
        for decl in {c.node for c in changed.values() if not c.define}:
            head = node_text(decl)[:decl.children_by_field_name("declarator")[0].start_byte - decl.start_byte]
            plain = re.sub(r"\b(const|constexpr|static)\b", "", head).strip()
            lines = []
            for d in decl.children_by_field_name("declarator"):
                name = declarator_name(d) or ""
                if name in changed:
                    why = (f"the workload parameter {name}" if changed[name] in self.free_globals
                           else "derived from workload parameters")
                    lines.append(f"static {' '.join(plain.split())} {node_text(d)};  // cuco init: {why} "
                                 "(cuco_setup sets it)")
                else:
                    lines.append(f"{head.strip()} {node_text(d)};")
            start, end = self._extent(decl)
            edits.append(_Edit(start, end, "\n".join(lines) + "\n"))
        return edits

    def _size_setup(self) -> list[str]:
        out = []
        for c in self.free_globals:
            target = f"cuco_size_{c.name}" if c.define else c.name
            out.append(f'  {target} = ({c.ctype})cuco_param(ctx, "{c.name}");')
        out += [f"  {c.name} = {c.expr};  // derived" for c in self.derived]
        return out

    def _fixed_checks(self) -> list[str]:
        out = []
        for k in self.plan.fixed_sizes:
            value = k if k in self.constants else str(self.plan.sizes[k])
            out.append(f'  if (cuco_param(ctx, "{k}") != (int64_t)({value})) return CUCO_ERR_PARAM;  // compiled in: '
                       f"{k} = {self.plan.sizes[k]}")
        return out

    # -- the entry points -----------------------------------------------------------------------------
    def _state_members(self) -> list[str]:
        """CucoState's fields: scratch buffers, side streams (each a cuco_side_stream_t) and the program's events."""
        p = self.plan
        return ([f"  {b.ctype}* {_member(b.name)} = nullptr;" for b in p.scratch()]
                + [f"  cuco_side_stream_t {_member(s)} = {{}};" for s in p.side_streams]
                + [f"  cudaEvent_t {_member(e)} = nullptr;" for e in p.events])

    def _release(self) -> list[str]:
        """CucoState::release's body: free what setup made, also after a setup that failed half-way."""
        p = self.plan
        return ([f"    cudaFree({_member(b.name)});" for b in p.scratch()]
                + [f"    cuco_side_stream_destroy(&{_member(s)});" for s in p.side_streams]
                + [f"    if ({_member(e)}) cudaEventDestroy({_member(e)});" for e in p.events])

    def _setup_checks(self) -> list[str]:
        """cuco_setup before the state: world sizes, fixed and free sizes, the tensors the step reads."""
        p = self.plan
        lines = []
        if p.worlds:
            cond = " || ".join(f"ctx->world_size == {w}" for w in p.worlds)
            lines.append(f"  if (!({cond})) return CUCO_ERR_PARAM;  // {p.program} runs on these world sizes only")
        lines += self._fixed_checks() + self._size_setup()
        counted = {x for b in p.buffers for x in re.findall(r"[A-Za-z_]\w*", b.count)}
        lines += [f'  const int64_t {k} = cuco_param(ctx, "{k}");' for k in p.sizes
                  if k in counted and k not in self.constants]
        for b in p.tensors():
            lines.append(f'  const cuco_tensor_t* t_{_member(b.name)} = cuco_tensor(ctx, "{b.name}");')
            lines.append(f"  if (t_{_member(b.name)} == NULL || t_{_member(b.name)}->capacity_bytes < "
                         f"(size_t)({_c_count(b.count)}) * sizeof({b.ctype})) return CUCO_ERR_PARAM;")
        return lines

    def _setup_state(self) -> list[str]:
        """cuco_setup making the state, each step while rc is CUCO_OK (settle releases a partial state)."""
        p = self.plan
        lines = []
        if p.scratch():
            lines.append("  // zeroed: what a step reads of them without writing it (padding) is the same on every run")
        lines += [f"  if (rc == CUCO_OK) rc = cuco_alloc_zeroed(&st->{_member(b.name)}, (size_t)({_c_count(b.count)}));"
                  for b in p.scratch()]
        if p.side_streams:
            lines.append("  // side streams: non-blocking, highest priority, with their fork / join events "
                         "(cuco_side_stream.h)")
        lines += [f"  if (rc == CUCO_OK) rc = cuco_side_stream_create(&st->{_member(s)});" for s in p.side_streams]
        for e in p.events:
            call = self._create_call(EVENT_CREATE_CALLS, e) or \
                f"cudaEventCreateWithFlags(&st->{_member(e)}, cudaEventDisableTiming)"
            lines.append(f"  if (rc == CUCO_OK) rc = cuco_cuda_status({call});")
        return lines

    def _create_call(self, names: frozenset[str], handle: str) -> str | None:
        """The program's call that creates `handle` (``cudaStreamCreate(&s)``), its first argument the seed's
        state member (``&st->s``)."""
        for f in self.frames:
            for n in self.prog.calls_in(f.body):
                fn = n.child_by_field_name("function")
                args = n.child_by_field_name("arguments")
                if fn is None or args is None or node_text(fn) not in names:
                    continue
                named = [a for a in args.children if a.is_named]
                if named and node_text(named[0]).replace(" ", "") == f"&{handle}":
                    rest = ", ".join(node_text(a) for a in named[1:])
                    return f"{node_text(fn)}(&st->{_member(handle)}{', ' + rest if rest else ''})"
        return None

    # -- cuco_step ------------------------------------------------------------------------------------
    def _step_lines(self) -> list[str]:
        """cuco_step's body after the state's lookup: the harness's values under the program's names, frame by
        frame, then the step."""
        lines = []
        if self.recording:
            lines.append(f"  {RECORDED} = CUCO_OK;")
        if self._helper_stream_edits():
            lines.append(f"  {HELPER_STREAM} = ctx->stream;")
        owner = self._owners()
        depth = 1
        for k, frame in enumerate(self.frames):
            ind = "  " * depth
            if k > 0:
                lines.append(f"{ind[:-2]}{{  // {frame.name}(), called at line {line_of(frame.call)}"
                             if frame.call is not None else f"{ind[:-2]}{{")
                lines += [ind + x for x in self._arguments(k)]
            lines += [ind + x for x in self._bindings(k, owner)]
            lines += [ind + x for x in self._locals(k)]
            lines += [ind + x for x in self._field_bindings(k, owner)]
            if k + 1 < len(self.frames):
                depth += 1
                continue
            lines += [ind + x if x else "" for x in self._step_body()]
        while depth > 1:
            depth -= 1
            lines.append("  " * (depth - 1) + "  }")
        return lines

    def _owners(self) -> dict[str, int]:
        """The frame that binds each harness name: the innermost one declaring it; a global is set in the
        outermost; a parameter comes with its argument; anything else is declared in the step's frame."""
        p = self.plan
        names = [p.rank, p.world, p.devices, p.comm, p.main_stream, *p.side_streams, *p.events,
                 *(b.name for b in p.buffers)]
        out: dict[str, int] = {}
        self.globals: set[str] = set()
        for name in names:
            var = name.split(".")[0].split("->")[0]
            if not _identifier(var):
                continue
            declared = [k for k in range(len(self.frames)) if var in self._declared(k)]
            if declared:
                out[name] = declared[-1]
            elif any(var in f.parameter_names() for f in self.frames[1:]):
                continue
            elif self._global(var):
                out[name] = 0
                self.globals.add(name)
            else:
                out[name] = len(self.frames) - 1
        return out

    def _declared(self, k: int) -> set[str]:
        return {n for n, (decl, _) in declarations(self.frames[k].body).items() if decl.start_byte < self.limits[k]}

    def _global(self, name: str) -> bool:
        return any(n.type == "declaration" and name in {declarator_name(d) for d in
                                                        n.children_by_field_name("declarator")}
                   for n in self.prog.root.children)

    def _bind(self, name: str, ctype: str, value: str, per_device: bool) -> list[str]:
        if per_device:
            return [f"{ctype} {name}[CUCO_MAX_RANKS] = {{}};", f"{name}[ctx->rank] = {value};"]
        if name in self.globals:
            return [f"{name} = {value};"]
        return [f"{ctype} {name} = {value};"]

    def _bindings(self, k: int, owner: dict[str, int]) -> list[str]:
        p = self.plan
        here = {n for n, o in owner.items() if o == k}
        dev = bool(p.devices)
        out: list[str] = []
        if p.rank in here:
            out += self._bind(p.rank, "const int", "ctx->rank", False)
        if p.world in here:
            out += self._bind(p.world, "const int", "ctx->world_size", False)
        if p.devices in here and p.devices != p.world:
            out.append(f"const int {p.devices} = 1;  // cuco init: one device per rank under the harness")
        if p.comm in here:
            out += self._bind(p.comm, "ncclComm_t", "(ncclComm_t)ctx->nccl_comm", dev)
        out += self._size_bindings(k)
        for b in p.buffers:
            if b.name in here and _identifier(b.name):
                value = (f'({b.ctype}*)cuco_tensor(ctx, "{b.name}")->local' if b.role != "scratch"
                         else f"st->{_member(b.name)}")
                out += self._bind(b.name, f"{b.ctype}*", value, dev and self._indexed(b.name))
        if p.main_stream in here and _identifier(p.main_stream):
            out += self._bind(p.main_stream, "cudaStream_t", "ctx->stream", dev and self._indexed(p.main_stream))
        for s in p.side_streams:
            if s in here:
                out += self._bind(s, "cudaStream_t", f"st->{_member(s)}.stream", dev and self._indexed(s))
        for e in p.events:
            if e in here:
                out += self._bind(e, "cudaEvent_t", f"st->{_member(e)}", False)
        return out

    def _field_bindings(self, k: int, owner: dict[str, int]) -> list[str]:
        """Buffers named by a member (`bufs.x`): set once the struct holding them is declared."""
        out = []
        for b in self.plan.buffers:
            if owner.get(b.name) == k and not _identifier(b.name):
                value = (f'({b.ctype}*)cuco_tensor(ctx, "{b.name}")->local' if b.role != "scratch"
                         else f"st->{_member(b.name)}")
                out.append(f"{b.name} = {value};")
        return out

    def _indexed(self, name: str) -> bool:
        """Whether the step names `name` per device (`name[d]`)."""
        return any(re.search(rf"\b{re.escape(name)}\s*\[", node_text(s)) for s in self.step)

    def _size_bindings(self, k: int) -> list[str]:
        p = self.plan
        out: list[str] = []
        if k == 0:
            out += [f'const int64_t {name} = cuco_param(ctx, "{name}");' for name in self.other_sizes]
        arrays: dict[str, list[LocalSize]] = {}
        for s in self.local_sizes[k]:
            if s.index is not None:
                arrays.setdefault(s.variable, []).append(s)
            elif s.param in p.fixed_sizes:
                out.append(self._declaration(s.declaration, s.declarator))
            else:
                out.append(f'{s.ctype} {s.variable} = ({s.ctype})cuco_param(ctx, "{s.param}");')
        for var, items in arrays.items():
            d = items[0].declarator.child_by_field_name("declarator")
            values = ", ".join(f'({i.ctype})cuco_param(ctx, "{i.param}")' for i in items)
            out.append(f"{items[0].ctype} {node_text(d) if d is not None else var} = {{{values}}};")
        if k == len(self.frames) - 1 and p.loop_var and self.region.loop is not None:
            init = self.region.loop.child_by_field_name("initializer")
            decl = declarations(self.frames[k].body).get(p.loop_var)
            ctype = type_text(init) if init is not None and init.type == "declaration" else (
                type_text(decl[0]) if decl is not None else "int")
            out.append(f'{ctype} {p.loop_var} = ({ctype})cuco_param(ctx, "{p.loop_var}");  // the loop counter: '
                       "which step this is")
        return out

    def _arguments(self, k: int) -> list[str]:
        """Frame k's parameters, bound to the arguments of the call into it (in the enclosing block)."""
        frame = self.frames[k]
        assert frame.call is not None
        al = frame.call.child_by_field_name("arguments")
        args = [c for c in al.named_children if c.type != "comment"] if al is not None else []
        out = []
        for param, arg in zip(frame.parameters(), args):
            name = declarator_name(param.child_by_field_name("declarator"))
            text = node_text(arg).strip()
            if not name or name == text:
                continue
            decl = node_text(param)
            default = param.child_by_field_name("default_value")
            if default is not None:
                decl = decl[:default.start_byte - param.start_byte].rstrip().rstrip("=").rstrip()
            out.append(f"{decl} = {text};")
        return out

    def _declaration(self, decl: Node, declarator: Node) -> str:
        """One declarator of a declaration as a declaration of its own (`float a = 1, b;` -> `float a = 1;`)."""
        first = decl.children_by_field_name("declarator")[0]
        head = node_text(decl)[:first.start_byte - decl.start_byte]
        return f"{' '.join(head.split())} {node_text(declarator)};"

    def _locals(self, k: int) -> list[str]:
        """Frame k's locals the plan keeps: their declarations and the host statements that set them, in the
        program's order (each name after what its initialiser reads)."""
        decls = declarations(self.frames[k].body)
        declared = self._declared(k)
        top = [s for s in body_statements(self.frames[k].body) if s.start_byte < self.limits[k]]
        parts: dict[int, str] = {}
        for name in self.plan.locals:
            if name not in declared or name not in decls:
                continue
            decl, d = decls[name]
            parts[d.start_byte] = self._declaration(decl, d)
            for s in top:
                if s != decl and name in writes_of(s) and not any(node_text(x) in ("argv", "argc")
                                                                      for x in walk(s)):
                    parts[s.start_byte] = self._statement_text(s)
        return [line for _, text in sorted(parts.items()) for line in text.split("\n")]

    def _statement_text(self, node: Node) -> str:
        line_start = self.data.rfind(b"\n", 0, node.start_byte) + 1
        return _dedent(self._apply(line_start, node.end_byte, []))

    def _default_stream(self) -> bool:
        return self.plan.main_stream in _DEFAULT_STREAMS

    def _helper_stream_edits(self) -> list[_Edit]:
        """The default-stream work of the functions the step calls, moved to HELPER_STREAM."""
        if not self._default_stream():
            return []
        return [e for name in sorted(self.prog.reached(self.step))
                for e in self._to_harness_stream(self.prog.functions[name], HELPER_STREAM)]

    def _to_harness_stream(self, node: Node, stream: str = "ctx->stream") -> list[_Edit]:
        """Edits that put the work under `node` on the default stream (a launch without a stream, an NCCL call or
        an async copy given 0) on the harness stream (`stream`) instead."""
        edits: list[_Edit] = []
        for call in self.prog.calls_in(node):
            syntax = next((c for c in call.children if c.type == "kernel_call_syntax"), None)
            if syntax is not None:
                config = [c for c in syntax.named_children if c.type != "comment"]
                close = next((c for c in syntax.children if node_text(c) == ">>>"), None)
                if len(config) == 4 and node_text(config[3]).replace(" ", "") in _DEFAULT_STREAMS:
                    edits.append(_Edit(config[3].start_byte, config[3].end_byte, stream))
                elif close is not None and len(config) in (2, 3):
                    edits.append(_Edit(close.start_byte, close.start_byte,
                                       f", 0, {stream}" if len(config) == 2 else f", {stream}"))
                continue
            _, name = short_name(call)
            args = call_args(call)
            at = len(args) - 1 if name in COMM_CALLS else _STREAM_ARG.get(name)
            if at is None:
                continue
            if at < len(args) and node_text(args[at]).replace(" ", "") in _DEFAULT_STREAMS:
                edits.append(_Edit(args[at].start_byte, args[at].end_byte, stream))
            elif at == len(args) and args:
                edits.append(_Edit(args[-1].end_byte, args[-1].end_byte, f", {stream}"))
        return edits

    def _step_body(self) -> list[str]:
        p = self.plan
        out: list[str] = []
        if p.side_streams:
            out.append("// side streams start after the harness stream's work and join it before returning (ABI)")
            out += [f"CUCO_TRY(cuco_side_stream_fork(&st->{_member(s)}, ctx->stream));" for s in p.side_streams]
        left = f"; left out: lines {', '.join(str(x.line) for x in p.left_out)}" if any(
            self.region.contains(s) for s in self.left) else ""
        out.append(f"// the step: {p.program} lines {p.step_start}-{p.step_end} of {p.step_function}(), as "
                   f"written{left}")
        edits = [_Edit(*self._extent(s), "") for s in self.left if self.region.contains(s)]
        if self._default_stream():
            out.append("// the program's work on the default stream runs on the harness stream")
            edits += [e for s in self.step for e in self._to_harness_stream(s)]
        for loop in self.device_loops:
            inner = loop_body(loop)
            if self.region.contains(loop) and inner != loop:
                v = loop_counter(loop)
                header = f"for (int {v} = ctx->rank; {v} == ctx->rank; ++{v})"
                edits.append(_Edit(loop.start_byte, inner.start_byte, f"{header} " if inner.type == "compound_statement"
                                   else f"{header}  // cuco init: this rank's device only\n"
                                   + " " * inner.start_point[1]))
        step = self.region.body()
        block = loop_body(self.region.statements[0]) if self.region.kind == "loop" else None
        if block is not None and block.type == "compound_statement":
            nl = self.data.find(b"\n", block.start_byte)
            own_line = 0 <= nl < block.end_byte and not self.data[block.start_byte + 1:nl].strip()
            text = self._apply(nl + 1 if own_line else block.start_byte + 1, block.end_byte - 1, edits)
        else:
            start = self.data.rfind(b"\n", 0, step[0].start_byte) + 1
            text = self._apply(start, step[-1].end_byte, edits)
        out += _dedent(text).split("\n")
        out += [f"CUCO_TRY(cuco_side_stream_join(&st->{_member(s)}, ctx->stream));" for s in p.side_streams]
        return out


def _dedent(text: str) -> str:
    lines = text.rstrip().split("\n")
    while lines and not lines[0].strip():
        lines.pop(0)
    indents = [len(x) - len(x.lstrip()) for x in lines if x.strip()]
    cut = min(indents, default=0)
    return "\n".join(x[cut:] if x.strip() else "" for x in lines)


__all__ = ["HELPER_STREAM", "RECORDED", "SEED_BACKENDS", "TODO", "error_macros_returning", "inline_headers",
           "own_headers", "write_seed"]
