"""Communication analysis of a CUDA source with tree-sitter: what the host communicates, with which buffers, on
which streams, and which kernels produce and consume those buffers.

The fast path reads this before any rewrite (which collective to replace, which kernel feeds it, which stream
orders them) and the search derives design-space features from it. Everything comes from the syntax tree, so a
name in a comment, a string literal or a ``#define`` body is never a call, while calls wrapped in error-check
macros (``NCCLCHECK(ncclAllGather(...))``) and calls split over many lines are.

Two views are kept apart on purpose:
- the record lists (collectives, launches, allocations, ...) hold each call site once, exactly as written;
- the graph follows execution order: it starts at the functions nothing else in the file calls (``cuco_setup``,
  ``cuco_step``, ``main``) and expands calls to host functions defined in the file, binding their parameters to
  the caller's arguments, so a launch inside a helper lands where the helper is called, with the caller's buffer.

Buffers are named by their base expression: casts, parentheses and pointer offsets are dropped
(``(bf16*)x + rank * n`` is ``x``) and simple local aliases are followed (``auto* y = (bf16*)t->local;`` makes
``y`` mean ``t->local``). What cannot be resolved stays as its expression text.
"""
from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cuco_kit.errors import BadInput
from cuco_kit.source.cuda_parse import (
    Node,
    declarator_name,
    error_fraction,
    function_name,
    is_device_function,
    node_text,
    parse,
    walk,
)

# --- what the analyzer knows about the APIs ------------------------------------------------------------------

# Argument positions of the host collectives, from nccl.h (NCCL 2.28): (send, recv, count, datatype, op, root,
# comm, stream); None where the call has no such argument.
_COLLECTIVES: dict[str, tuple[int | None, ...]] = {
    #                  send recv count dtype op    root  comm stream
    "ncclAllReduce": (0, 1, 2, 3, 4, None, 5, 6),
    "ncclAllGather": (0, 1, 2, 3, None, None, 4, 5),
    "ncclReduceScatter": (0, 1, 2, 3, 4, None, 5, 6),
    "ncclBroadcast": (0, 1, 2, 3, None, 4, 5, 6),
    "ncclBcast": (0, 0, 1, 2, None, 3, 4, 5),  # deprecated, in place
    "ncclReduce": (0, 1, 2, 3, 4, 5, 6, 7),
    "ncclAlltoAll": (0, 1, 2, 3, None, None, 4, 5),
    "ncclGather": (0, 1, 2, 3, None, 4, 5, 6),
    "ncclScatter": (0, 1, 2, 3, None, 4, 5, 6),
}
# ncclSend(sendbuff, count, datatype, peer, comm, stream) / ncclRecv(recvbuff, ...)
_P2P = ("ncclSend", "ncclRecv")
_GROUP = ("ncclGroupStart", "ncclGroupEnd")

_SETUP = frozenset({
    "ncclGetUniqueId", "ncclCommInitRank", "ncclCommInitRankConfig", "ncclCommInitRankScalable",
    "ncclCommInitAll", "ncclCommSplit", "ncclCommShrink", "ncclCommFinalize", "ncclCommDestroy", "ncclCommAbort",
    "ncclCommRegister", "ncclCommDeregister", "ncclCommWindowRegister", "ncclCommWindowDeregister",
    "ncclDevCommCreate", "ncclDevCommDestroy", "ncclMemAlloc", "ncclMemFree", "cuco_devcomm_create",
    "cuco_devcomm_create_lsa_world", "cuco_devcomm_create_gin", "cuco_devcomm_destroy",
})

# allocation call -> (pointer argument, bytes argument, stream argument, kind)
_ALLOCS: dict[str, tuple[int, int, int | None, str]] = {
    "cudaMalloc": (0, 1, None, "cuda"),
    "cudaMallocAsync": (0, 1, 2, "cuda"),
    "cudaMallocManaged": (0, 1, None, "managed"),
    "cudaMallocHost": (0, 1, None, "host"),
    "cudaHostAlloc": (0, 1, None, "host"),
    "ncclMemAlloc": (0, 1, None, "nccl"),
}
_FREES = frozenset({"cudaFree", "cudaFreeAsync", "cudaFreeHost", "ncclMemFree"})

# cuBLAS compute calls -> (handle, read buffers, written buffers, stream argument or None: set by cublasSetStream)
_BLAS: dict[str, tuple[int, tuple[int, ...], tuple[int, ...], int | None]] = {
    "cublasGemmEx": (0, (7, 10), (14,), None),
    "cublasGemmBatchedEx": (0, (7, 10), (14,), None),
    "cublasGemmStridedBatchedEx": (0, (7, 11), (16,), None),
    "cublasLtMatmul": (0, (3, 5, 8), (10,), 15),
}
for _p in "SDHCZ":
    _BLAS[f"cublas{_p}gemm"] = (0, (7, 9), (12,), None)
    _BLAS[f"cublas{_p}gemm_v2"] = (0, (7, 9), (12,), None)
    _BLAS[f"cublas{_p}gemmBatched"] = (0, (7, 9), (12,), None)
    _BLAS[f"cublas{_p}gemmStridedBatched"] = (0, (7, 10), (14,), None)
# GEMM launchers of the samples' host headers (*_host.cuh), which the analyzer cannot read, called as member
# functions (L0 accepts those in EVOLVE blocks): method name -> as _BLAS. Their matrices are the object's members,
# so only the handle and the rows passed in are arguments.
_BLAS_MEMBERS: dict[str, tuple[int, tuple[int, ...], tuple[int, ...], int | None]] = {
    "gemm_rows": (0, (1,), (), None),       # gemm_allgather: Operands::gemm_rows(handle, a, row0, rows)
    "gemm_layer": (0, (), (), None),        # kv_transfer: Projection::gemm_layer(handle, l)
    "expert_mlp": (0, (2,), (), None),      # moe_dispatch_combine: Layer::expert_mlp(handle, le, rows, n, ...)
    "expert_own": (0, (), (), None),        # Layer::expert_own(handle, le, stream)
    "expert_arrived": (0, (), (), None),    # Layer::expert_arrived(handle, le, stream)
}

# cuco_side_stream.h (cuco_side_stream_create(&side) makes the stream and its fork/join events).
_STREAM_CREATE = frozenset({"cudaStreamCreate", "cudaStreamCreateWithFlags", "cudaStreamCreateWithPriority",
                            "cuco_side_stream_create"})
_EVENT_CALLS = frozenset({"cudaEventCreate", "cudaEventCreateWithFlags", "cudaEventRecord",
                          "cudaEventRecordWithFlags", "cudaStreamWaitEvent", "cuco_side_stream_fork",
                          "cuco_side_stream_join"})
_SYNCS = frozenset({"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize"})
# Host-side waits on a flag word in memory (a device-initiated producer signals, a stream waits).
_STREAM_WAIT_VALUE = frozenset({"cuStreamWaitValue32", "cuStreamWaitValue64", "cudaStreamWaitValue32",
                                "cudaStreamWaitValue64"})
# copy call -> (dst, src, stream argument or None)
_COPIES: dict[str, tuple[int | None, int | None, int | None]] = {
    "cudaMemcpy": (0, 1, None),
    "cudaMemcpyAsync": (0, 1, 4),
    "cudaMemcpyPeer": (0, 2, None),
    "cudaMemcpyPeerAsync": (0, 2, 5),
    "cudaMemcpy2D": (0, 2, None),
    "cudaMemcpy2DAsync": (0, 2, 7),
    "cudaMemset": (0, None, None),
    "cudaMemsetAsync": (0, None, 3),
}
_LAUNCH_APIS = frozenset({"cudaLaunchKernel", "cudaLaunchCooperativeKernel"})

# Device-initiated communication: the NCCL device API (LSA, GIN) and the compat layer that runs it under `symm`.
_DEVICE_API_PREFIXES = ("ncclGin", "ncclLsa")
_DEVICE_API_NAMES = frozenset({
    "ncclGetLsaPointer", "ncclGetPeerPointer", "ncclGetLocalPointer", "ncclGetLsaMultimemPointer",
    "ncclGetMultimemPointer", "ncclDevComm", "ncclDevComm_t", "ncclDevCommCreate", "ncclTeamLsa", "ncclTeamWorld",
    "ncclTeamRail", "ncclCoopCta", "ncclCoopWarp", "ncclCoopThread", "ncclWindow_t",
    "cuco_devcomm_create", "cuco_devcomm_create_lsa_world", "cuco_devcomm_create_gin", "cuco_devcomm_destroy",
    "cuco_window",
    "cuco_flags_window", "cuco_signal", "cuco_wait",
})
_DEVICE_API_HEADERS = ("lsa_compat.h", "cuco_lsa.h", "nccl_device.h")
# Device-side waits on an epoch flag (cuco_devcomm.h) and spellings of hand-written ones.
_FLAG_WAIT_CALL = re.compile(r"^(cuco_wait|\w*wait\w*flag\w*|\w*flag\w*wait\w*)$", re.IGNORECASE)

_DEFAULT_STREAMS = frozenset({"0", "NULL", "nullptr", "cudaStreamLegacy", "cudaStreamPerThread", "<default>"})
_CAST_CALLS = frozenset({"reinterpret_cast", "static_cast", "const_cast", "dynamic_cast"})
# A local whose initializer is one of these names a buffer; anything else (new, malloc, arbitrary calls) does not.
_ALIAS_VALUE_TYPES = frozenset({"identifier", "field_expression", "subscript_expression", "cast_expression",
                                "parenthesized_expression", "binary_expression", "pointer_expression",
                                "call_expression", "qualified_identifier"})
_ALIAS_CALLS = frozenset({"cuco_tensor", "cuco_scratch"}) | _CAST_CALLS
_LOOPS = frozenset({"for_statement", "while_statement", "do_statement", "for_range_loop"})
_MAX_INLINE_DEPTH = 8

# The API names above as one vocabulary for other readers of host programs (the importer classifies the
# statements of a program's main() with them).
COMM_CALLS = frozenset(_COLLECTIVES) | frozenset(_P2P)
REDUCING_COLLECTIVES = frozenset({"ncclAllReduce", "ncclReduceScatter", "ncclReduce"})
GROUP_CALLS = frozenset(_GROUP)
SETUP_CALLS = _SETUP
ALLOC_CALLS = frozenset(_ALLOCS)
FREE_CALLS = _FREES
BLAS_CALLS = frozenset(_BLAS)
LAUNCH_APIS = _LAUNCH_APIS
COPY_CALLS = frozenset(_COPIES)
STREAM_CREATE_CALLS = _STREAM_CREATE
EVENT_CALLS = _EVENT_CALLS
SYNC_CALLS = _SYNCS
LOOPS = _LOOPS


# --- records ------------------------------------------------------------------------------------------------


@dataclass
class CommCall:
    """A host NCCL collective or send/recv. `buffers` are the base buffers, send first; in place gives one."""

    call: str
    line: int
    end_line: int
    function: str | None
    stream: str | None
    buffers: list[str]
    send: str | None
    recv: str | None
    comm: str | None
    count: str | None
    datatype: str | None
    op: str | None = None
    root: str | None = None
    peer: str | None = None
    group: int | None = None
    in_loop: bool = False
    wrapper: str | None = None
    args: list[str] = field(default_factory=list)


@dataclass
class Group:
    """An ncclGroupStart/ncclGroupEnd pair in one function; `calls` are the lines of the comm calls inside."""

    index: int
    function: str | None
    start_line: int
    end_line: int | None
    depth: int
    calls: list[dict[str, Any]] = field(default_factory=list)
    in_loop: bool = False


@dataclass
class SetupCall:
    """Communicator, window or device-communicator setup. `handle` is what the call writes through `&x`."""

    call: str
    line: int
    function: str | None
    handle: str | None
    buffer: str | None
    bytes: str | None
    comm: str | None
    args: list[str] = field(default_factory=list)


@dataclass
class Allocation:
    call: str
    buffer: str
    line: int
    bytes: str | None
    kind: str
    function: str | None
    stream: str | None = None
    expr: str = ""


@dataclass
class Free:
    call: str
    buffer: str
    line: int
    function: str | None


@dataclass
class KernelParam:
    name: str
    type: str
    pointer: bool
    const: bool
    reads: bool
    writes: bool


@dataclass
class Kernel:
    """A __global__ function (definition or declaration)."""

    name: str
    line: int
    end_line: int
    params: list[KernelParam]
    template_params: list[str]
    is_definition: bool
    launch_bounds: str | None = None


@dataclass
class Launch:
    """A kernel launch. grid/block/smem/stream are the launch-configuration texts (None when omitted)."""

    kernel: str
    line: int
    end_line: int
    function: str | None
    grid: str | None
    block: str | None
    smem: str | None
    stream: str | None
    args: list[str]
    reads: list[str]
    writes: list[str]
    template_args: str | None = None
    via: str = "<<<>>>"
    kernel_known: bool = True
    in_loop: bool = False
    wrapper: str | None = None


@dataclass
class BlasCall:
    """A cuBLAS compute call: a compute node whose stream comes from the last cublasSetStream on its handle."""

    call: str
    line: int
    function: str | None
    handle: str | None
    stream: str | None
    reads: list[str]
    writes: list[str]
    in_loop: bool = False
    args: list[str] = field(default_factory=list)


@dataclass
class CopyCall:
    call: str
    line: int
    function: str | None
    dst: str | None
    src: str | None
    bytes: str | None
    stream: str | None
    peer: bool
    in_loop: bool = False


@dataclass
class StreamCreate:
    call: str
    stream: str
    line: int
    function: str | None
    flags: str | None = None
    priority: str | None = None


@dataclass
class EventCall:
    """cudaEventCreate* (event), cudaEventRecord* (event on stream), cudaStreamWaitEvent (stream waits event)."""

    call: str
    line: int
    function: str | None
    event: str | None
    stream: str | None


@dataclass
class SyncCall:
    call: str
    line: int
    function: str | None
    target: str | None


@dataclass
class Graph:
    """Communication dependency graph.

    nodes: comm calls, copies and compute (kernel launches, cuBLAS) in execution order, each
    {id, kind, name, line, function, stream, reads, writes, group, in_loop, sites}; `sites` are the calls that
    reached the node's function from its root, [function, line] outermost first; comm calls also carry `comm`.
    edges: read-after-write buffer dependencies {src, dst, buffer, kind, order, src_stream, dst_stream}; kind is
    "produce" (compute -> comm: the kernel writes what is sent), "consume" (comm -> compute: the kernel reads what
    was received) or "data" (any other pair); order says what orders the two: "stream" (same stream), "event"
    (record on the producer's stream, wait on the consumer's), "host_sync" (a synchronize in between),
    "default_stream" (one side on the legacy default stream) or "unordered" (a race).
    stream_order: stream -> node ids in order.
    """

    nodes: list[dict[str, Any]] = field(default_factory=list)
    edges: list[dict[str, Any]] = field(default_factory=list)
    stream_order: dict[str, list[int]] = field(default_factory=dict)


@dataclass
class AnalysisReport:
    filename: str
    collectives: list[CommCall] = field(default_factory=list)
    p2p: list[CommCall] = field(default_factory=list)
    groups: list[Group] = field(default_factory=list)
    setup: list[SetupCall] = field(default_factory=list)
    allocations: list[Allocation] = field(default_factory=list)
    frees: list[Free] = field(default_factory=list)
    kernels: list[Kernel] = field(default_factory=list)
    launches: list[Launch] = field(default_factory=list)
    blas: list[BlasCall] = field(default_factory=list)
    copies: list[CopyCall] = field(default_factory=list)
    streams: list[StreamCreate] = field(default_factory=list)
    events: list[EventCall] = field(default_factory=list)
    syncs: list[SyncCall] = field(default_factory=list)
    graph: Graph = field(default_factory=Graph)
    device_api_names: list[str] = field(default_factory=list)
    flag_waits: list[dict[str, Any]] = field(default_factory=list)
    includes: list[str] = field(default_factory=list)

    def features(self) -> dict[str, Any]:
        """Analyzer features for the search's design-space cell (stable keys; values are JSON scalars)."""
        names = set(self.device_api_names)
        used_streams = {n["stream"] for n in self.graph.nodes if n["stream"] is not None}
        return {
            "uses_host_collectives": bool(self.collectives),
            "uses_host_p2p": bool(self.p2p),
            "uses_host_comm": bool(self.collectives or self.p2p),
            "uses_device_api": bool(names) or any(i.endswith(_DEVICE_API_HEADERS) for i in self.includes),
            "uses_lsa": any(n.startswith("ncclLsa") or n in ("ncclGetLsaPointer", "ncclTeamLsa",
                                                             "ncclGetLsaMultimemPointer") for n in names),
            "uses_gin": any(n.startswith("ncclGin") for n in names),
            "uses_copy_engine": any(c.peer for c in self.copies),
            "uses_cublas": bool(self.blas),
            "uses_nccl_mem_alloc": any(a.kind == "nccl" for a in self.allocations),
            "uses_windows": any(s.call == "ncclCommWindowRegister" for s in self.setup),
            "has_flags_wait": bool(self.flag_waits),
            "n_streams": max(len(self.streams), len(used_streams)),
            "n_kernels": len({k.name for k in self.kernels}),
            "n_launches": len(self.launches),
            "n_collectives": len(self.collectives),
            "n_p2p": len(self.p2p),
            "n_groups": len(self.groups),
            "n_events": sum(1 for e in self.events if e.call.startswith("cudaEventRecord")),
        }

    def to_json_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["features"] = self.features()
        return out

    def summary(self) -> str:
        """A short human-readable account (what `cuco analyze FILE` prints)."""
        f = self.features()
        # Streams as the program has them: those it names (created or used), and the default stream apart, so
        # a cudaMemset on the default stream is not counted as a stream the program created.
        used = {str(n["stream"]) for n in self.graph.nodes if n["stream"] is not None}
        named = used.union(c.stream for c in self.streams if c.stream) - _DEFAULT_STREAMS
        default = " and the default stream" if used & _DEFAULT_STREAMS else ""
        lines = [f"{self.filename}: {f['n_kernels']} kernel(s), {len(self.launches)} launch(es), "
                 f"{len(self.blas)} cuBLAS call(s), {len(self.collectives)} collective(s), "
                 f"{len(self.p2p)} send/recv, {len(self.groups)} group(s), {len(named)} stream(s){default}"]
        for c in self.collectives + self.p2p:
            grp = f" group {c.group}" if c.group is not None else ""
            loop = " in loop" if c.in_loop else ""
            lines.append(f"  L{c.line} {c.call}({', '.join(c.buffers)}) stream={c.stream}{grp}{loop}")
        for la in self.launches:
            lines.append(f"  L{la.line} launch {la.kernel}<<<{la.grid}, {la.block}, {la.smem}, {la.stream}>>>")
        for b in self.blas:
            lines.append(f"  L{b.line} {b.call} reads={','.join(b.reads)} writes={','.join(b.writes)} "
                         f"stream={b.stream}")
        for cp in self.copies:
            lines.append(f"  L{cp.line} {cp.call} {cp.src} -> {cp.dst} stream={cp.stream}"
                         f"{' (peer)' if cp.peer else ''}{' in loop' if cp.in_loop else ''}")
        for a in self.allocations:
            lines.append(f"  L{a.line} {a.call} {a.buffer} ({a.bytes})")
        nodes = {n["id"]: n for n in self.graph.nodes}
        for e in self.graph.edges:
            s, d = nodes[e["src"]], nodes[e["dst"]]
            lines.append(f"  edge {s['name']}@L{s['line']} -[{e['buffer']}, {e['kind']}, {e['order']}]-> "
                         f"{d['name']}@L{d['line']}")
        if self.device_api_names:
            lines.append(f"  device API: {', '.join(self.device_api_names)}")
        return "\n".join(lines)


# --- syntax helpers -----------------------------------------------------------------------------------------


def _line(node: Node) -> int:
    return node.start_point[0] + 1


def _end_line(node: Node) -> int:
    return node.end_point[0] + 1


def _norm(text: str) -> str:
    """Expression text with runs of whitespace (including newlines of multi-line calls) collapsed."""
    return " ".join(text.split())


def _args(call: Node) -> list[Node]:
    al = call.child_by_field_name("arguments")
    if al is None:
        return []
    return [c for c in al.named_children if c.type != "comment"]


def _callee_name(call: Node) -> str | None:
    """Plain name of a call's callee (no namespace, no template arguments); None for member/indirect calls."""
    fn = call.child_by_field_name("function")
    if fn is None:
        return None
    if fn.type == "template_function":
        fn = fn.child_by_field_name("name")
    if fn is not None and fn.type == "qualified_identifier":
        name = fn.child_by_field_name("name")
        while name is not None and name.type == "qualified_identifier":
            name = name.child_by_field_name("name")
        fn = name.child_by_field_name("name") if name is not None and name.type == "template_function" else name
    if fn is None or fn.type != "identifier":
        return None
    return node_text(fn)


def _method_name(call: Node) -> str | None:
    """Name of the member function a call `obj.f(...)` / `p->f(...)` calls; None for other calls."""
    fn = call.child_by_field_name("function")
    field = fn.child_by_field_name("field") if fn is not None and fn.type == "field_expression" else None
    return node_text(field) if field is not None else None


def _kernel_syntax(call: Node) -> Node | None:
    for c in call.children:
        if c.type == "kernel_call_syntax":
            return c
    return None


def in_loop(node: Node, stop: Node | None) -> bool:
    """Whether a loop statement lies between `node` and `stop` (exclusive)."""
    n = node.parent
    while n is not None and n != stop:
        if n.type in _LOOPS:
            return True
        n = n.parent
    return False


def _wrapper(call: Node) -> str | None:
    """Name of the macro/function whose argument list holds this call directly (NCCLCHECK, CUDA_CHECK)."""
    al = call.parent
    if al is None or al.type != "argument_list" or al.parent is None or al.parent.type != "call_expression":
        return None
    return _callee_name(al.parent)


# --- functions and scopes -----------------------------------------------------------------------------------


class _Func:
    """A function definition with its local alias definitions (name -> [(end byte, value node)])."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.name = function_name(node)
        self.short = self.name.split("::")[-1]
        self.device = is_device_function(node)
        self.kernel = any(c.type == "__global__" for c in node.children)
        self.body = node.child_by_field_name("body")
        self.params: list[str] = []
        decl = node.child_by_field_name("declarator")
        while decl is not None and decl.type != "function_declarator":
            decl = decl.child_by_field_name("declarator")
        if decl is not None:
            plist = decl.child_by_field_name("parameters")
            for p in plist.named_children if plist is not None else []:
                if p.type in ("parameter_declaration", "optional_parameter_declaration"):
                    self.params.append(declarator_name(p.child_by_field_name("declarator")) or "")
        self.defs: dict[str, list[tuple[int, Node]]] = {}
        if self.body is not None:
            for n in walk(self.body):
                if n.type == "init_declarator":
                    name = declarator_name(n.child_by_field_name("declarator"))
                    value = n.child_by_field_name("value")
                    if name and value is not None:
                        self.defs.setdefault(name, []).append((n.end_byte, value))
                elif n.type == "assignment_expression":
                    left, right = n.child_by_field_name("left"), n.child_by_field_name("right")
                    op = n.child_by_field_name("operator")
                    if (left is not None and right is not None and left.type == "identifier"
                            and (op is None or node_text(op) == "=")):
                        self.defs.setdefault(node_text(left), []).append((n.end_byte, right))


@dataclass
class _Scope:
    func: _Func | None
    bindings: dict[str, str] = field(default_factory=dict)


def _is_alias_value(value: Node) -> bool:
    if value.type not in _ALIAS_VALUE_TYPES:
        return False
    if value.type == "call_expression":
        return _callee_name(value) in _ALIAS_CALLS
    if value.type == "binary_expression":  # pointer arithmetic only: `n * 2` or `1 << 20` names no buffer
        op = value.child_by_field_name("operator")
        return op is not None and node_text(op) in ("+", "-")
    if value.type in ("cast_expression", "parenthesized_expression"):  # `(float**)malloc(n)` names no buffer
        inner = value.child_by_field_name("value") if value.type == "cast_expression" else (
            value.named_children[0] if value.named_children else None)
        return inner is not None and _is_alias_value(inner)
    return True


def _ident(name: str, at: int, scope: _Scope, depth: int) -> str:
    func = scope.func
    if func is not None and depth < 12:
        best: Node | None = None
        for end, value in func.defs.get(name, []):
            if end <= at:
                best = value
        if best is not None:
            return _base(best, scope, depth + 1) if _is_alias_value(best) else name
    return scope.bindings.get(name, name)


def _base(node: Node, scope: _Scope, depth: int = 0) -> str:
    """The buffer an expression points into: casts, parentheses and offsets dropped, local aliases followed."""
    t = node.type
    if t == "identifier":
        return _ident(node_text(node), node.start_byte, scope, depth)
    if t in ("parenthesized_expression", "cast_expression"):
        inner = node.child_by_field_name("value") if t == "cast_expression" else (
            node.named_children[0] if node.named_children else None)
        return _base(inner, scope, depth) if inner is not None else _norm(node_text(node))
    if t == "binary_expression":
        op = node.child_by_field_name("operator")
        left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
        if op is not None and node_text(op) in ("+", "-") and left is not None and right is not None:
            if left.type in ("number_literal", "sizeof_expression"):
                return _base(right, scope, depth)
            return _base(left, scope, depth)
    if t == "pointer_expression":
        arg = node.child_by_field_name("argument")
        unary = node_text(node.children[0]) if node.children else ""
        if arg is not None and unary == "&":
            if arg.type == "subscript_expression":
                inner = arg.child_by_field_name("argument")
                return _base(inner, scope, depth) if inner is not None else _norm(node_text(node))
            return "&" + _base(arg, scope, depth)
        if arg is not None and unary == "*":
            return "*" + _base(arg, scope, depth)
    if t == "call_expression":
        name = _callee_name(node)
        args = _args(node)
        if name in _CAST_CALLS and args:
            return _base(args[0], scope, depth)
    if t == "field_expression":
        arg = node.child_by_field_name("argument")
        fld = node.child_by_field_name("field")
        op = node.child_by_field_name("operator")
        if arg is not None and fld is not None:
            sep = node_text(op) if op is not None else ("->" if "->" in node_text(node) else ".")
            return f"{_base(arg, scope, depth)}{sep}{node_text(fld)}"
    if t == "subscript_expression":
        arg = node.child_by_field_name("argument")
        idx = node.child_by_field_name("indices") or node.child_by_field_name("index")
        if arg is not None and idx is not None:
            itext = _norm(node_text(idx))
            if not itext.startswith("["):
                itext = f"[{itext}]"
            return f"{_base(arg, scope, depth)}{itext}"
    return _norm(node_text(node))


def _opt(args: list[Node], i: int | None, scope: _Scope) -> str | None:
    if i is None or i >= len(args):
        return None
    return _base(args[i], scope)


def _text(args: list[Node], i: int | None) -> str | None:
    if i is None or i >= len(args):
        return None
    return _norm(node_text(args[i]))


def _out_arg(args: list[Node], i: int, scope: _Scope) -> str | None:
    """The object an output argument `&x` names (x), or the pointer's base when passed without `&`."""
    if i >= len(args):
        return None
    a = args[i]
    while a.type in ("cast_expression", "parenthesized_expression"):
        inner = a.child_by_field_name("value") if a.type == "cast_expression" else (
            a.named_children[0] if a.named_children else None)
        if inner is None:
            break
        a = inner
    if a.type == "pointer_expression" and a.children and node_text(a.children[0]) == "&":
        arg = a.child_by_field_name("argument")
        if arg is not None:
            return _base(arg, scope)
    return _base(a, scope)


# --- kernels ------------------------------------------------------------------------------------------------


def _param_info(p: Node) -> tuple[str, str, bool, bool]:
    """(name, type text, is pointer, pointee is const) of a parameter_declaration."""
    decl = p.child_by_field_name("declarator")
    name = declarator_name(decl) or ""
    text = _norm(node_text(p))
    type_text = text[: text.rfind(name)].strip() if name and text.endswith(name) else text
    pointer = False
    d = decl
    while d is not None:
        if d.type in ("pointer_declarator", "array_declarator", "abstract_pointer_declarator"):
            pointer = True
            break
        d = d.child_by_field_name("declarator")
    # `const T* p` puts const on the declaration itself; `T* const p` puts it on the pointer (pointee writable).
    const = any(c.type == "type_qualifier" and node_text(c) == "const" for c in p.children)
    return name, type_text, pointer, const


def _lhs_base_ident(node: Node | None) -> str | None:
    """The identifier a store target is based on: p[i], *p, p[i].x, *(p + i), p->x."""
    while node is not None:
        t = node.type
        if t == "identifier":
            return node_text(node)
        if t in ("subscript_expression", "field_expression", "pointer_expression", "cast_expression"):
            node = node.child_by_field_name("argument") or node.child_by_field_name("value")
        elif t == "parenthesized_expression":
            node = node.named_children[0] if node.named_children else None
        elif t == "binary_expression":
            node = node.child_by_field_name("left")
        else:
            return None
    return None


def _base_ident_nodes(node: Node | None) -> list[tuple[int, int]]:
    """Span of the identifier a pointer expression is based on (see _lhs_base_ident), as a list of 0 or 1."""
    while node is not None:
        t = node.type
        if t == "identifier":
            return [(node.start_byte, node.end_byte)]
        if t in ("subscript_expression", "field_expression", "pointer_expression", "cast_expression"):
            node = node.child_by_field_name("argument") or node.child_by_field_name("value")
        elif t == "parenthesized_expression":
            node = node.named_children[0] if node.named_children else None
        elif t == "binary_expression":
            node = node.child_by_field_name("left")
        else:
            return []
    return []


def _is_declared_name(ident: Node) -> bool:
    """True for the name being declared in `T* q = ...` (not a use of q)."""
    parent = ident.parent
    if parent is None:
        return False
    if parent.type in ("pointer_declarator", "reference_declarator", "array_declarator", "declaration",
                       "parameter_declaration"):
        return True
    return parent.type == "init_declarator" and parent.child_by_field_name("declarator") == ident


_READ_ONLY_DEVICE_CALLS = re.compile(r"^(__ldg|__ldcg|__ldca|__ldcs|__ldlu|__ldcv|ld\w*|load\w*|__builtin_\w+)$")


def _param_roles(func: _Func, params: list[tuple[str, str, bool, bool]]) -> list[tuple[bool, bool]]:
    """(reads, writes) for each kernel parameter, from the kernel body.

    A pointer is written when it (or a local derived from it) is the base of an assignment or ++/-- target, or
    is handed to a call that may store through it (atomics, device helpers); pointee-const pointers are only read.
    """
    names = {p[0] for p in params if p[0]}
    derived: dict[str, str] = {}  # local -> parameter it points into
    body = func.body
    if body is None:
        return [(True, not p[3]) for p in params]
    for n in walk(body):
        if n.type == "init_declarator":
            local = declarator_name(n.child_by_field_name("declarator"))
            value = n.child_by_field_name("value")
            if local and value is not None:
                root = _lhs_base_ident(value)
                if root in names:
                    derived[local] = root
                elif root in derived:
                    derived[local] = derived[root]
    def owner(ident: str | None) -> str | None:
        if ident in names:
            return ident
        return derived.get(ident) if ident is not None else None

    written: set[str] = set()
    read: set[str] = set()
    # Identifier nodes that are not reads of memory: the base of a plain store target (`p[i] = v`) and the
    # pointer arithmetic that defines a derived local (`float* q = p + off;`).
    not_reads: set[tuple[int, int]] = set()
    for n in walk(body):
        if n.type == "assignment_expression":
            left = n.child_by_field_name("left")
            if left is not None and left.type != "identifier":
                o = owner(_lhs_base_ident(left))
                if o:
                    written.add(o)
                    op = n.child_by_field_name("operator")
                    if op is None or node_text(op) == "=":
                        not_reads.update(_base_ident_nodes(left))
        elif n.type == "init_declarator":
            local = declarator_name(n.child_by_field_name("declarator"))
            value = n.child_by_field_name("value")
            if local in derived and value is not None:
                not_reads.update(_base_ident_nodes(value))
        elif n.type == "update_expression":
            arg = n.child_by_field_name("argument")
            if arg is not None and arg.type != "identifier":
                o = owner(_lhs_base_ident(arg))
                if o:
                    written.add(o)
        elif n.type == "call_expression":
            name = _callee_name(n) or ""
            if _READ_ONLY_DEVICE_CALLS.match(name):
                continue
            for a in _args(n):
                o = owner(_lhs_base_ident(a))
                if o:
                    written.add(o)
    for n in walk(body):
        if (n.type == "identifier" and (n.start_byte, n.end_byte) not in not_reads
                and not _is_declared_name(n)):
            o = owner(node_text(n))
            if o:
                read.add(o)
    roles = []
    for name, _type, pointer, const in params:
        if not pointer:
            roles.append((True, False))
        elif const:
            roles.append((name in read, False))
        else:
            roles.append((name in read, name in written))
    return roles


def _kernel_record(fn_node: Node, func: _Func | None) -> Kernel:
    decl = fn_node.child_by_field_name("declarator")
    while decl is not None and decl.type != "function_declarator":
        decl = decl.child_by_field_name("declarator")
    name_node = decl.child_by_field_name("declarator") if decl is not None else None
    name = node_text(name_node).split("::")[-1] if name_node is not None else "<unknown>"
    params: list[tuple[str, str, bool, bool]] = []
    plist = decl.child_by_field_name("parameters") if decl is not None else None
    for p in plist.named_children if plist is not None else []:
        if p.type in ("parameter_declaration", "optional_parameter_declaration"):
            params.append(_param_info(p))
    roles = _param_roles(func, params) if func is not None else [(True, p[2] and not p[3]) for p in params]
    template: list[str] = []
    parent = fn_node.parent
    if parent is not None and parent.type == "template_declaration":
        tp = parent.child_by_field_name("parameters")
        template = [_norm(node_text(c)) for c in tp.named_children] if tp is not None else []
    bounds = next((_norm(node_text(c)) for c in fn_node.children if c.type == "launch_bounds"), None)
    return Kernel(name=name, line=_line(fn_node), end_line=_end_line(fn_node),
                  params=[KernelParam(n, t, ptr, c, r, w) for (n, t, ptr, c), (r, w) in zip(params, roles)],
                  template_params=template, is_definition=fn_node.type == "function_definition",
                  launch_bounds=bounds)


# --- the analyzer -------------------------------------------------------------------------------------------


class _Analyzer:
    def __init__(self, code: str, filename: str) -> None:
        self.code = code
        self.filename = filename
        self.tree = parse(code)
        self.root = self.tree.root_node
        self.funcs: list[_Func] = []
        self.by_name: dict[str, _Func] = {}
        for n in walk(self.root):
            if n.type == "function_definition":
                f = _Func(n)
                self.funcs.append(f)
                self.by_name.setdefault(f.short, f)
        self.kernels: dict[str, Kernel] = {}

    # -- checks --

    def check_is_cuda(self) -> None:
        has_def = any(not _inside_error(f.node) for f in self.funcs)
        if not has_def:
            raise BadInput(f"{self.filename}: no C++/CUDA function definition found; pass a CUDA source (.cu)")
        if error_fraction(self.tree) > 0.5:
            raise BadInput(f"{self.filename}: most of the file does not parse as CUDA C++; pass a CUDA source")

    # -- static records --

    def func_of(self, node: Node) -> _Func | None:
        n = node.parent
        while n is not None:
            if n.type == "function_definition":
                for f in self.funcs:
                    if f.node == n:
                        return f
                return None
            n = n.parent
        return None

    def run(self) -> AnalysisReport:
        rep = AnalysisReport(filename=self.filename)
        for n in walk(self.root):
            if n.type == "preproc_include":
                path = n.child_by_field_name("path")
                if path is not None:
                    rep.includes.append(node_text(path).strip("<>\""))
        for f in self.funcs:
            if f.kernel:
                k = _kernel_record(f.node, f)
                self.kernels[k.name] = k
                rep.kernels.append(k)
        for n in walk(self.root):  # __global__ declarations without a body (defined elsewhere or later)
            if n.type in ("declaration", "field_declaration") and any(c.type == "__global__" for c in n.children):
                k = _kernel_record(n, None)
                if k.name not in self.kernels:
                    self.kernels[k.name] = k
                    rep.kernels.append(k)
        rep.device_api_names = self.device_api_names()
        rep.flag_waits = self.flag_waits()

        blas_streams: dict[str, str] = {}
        for call in (n for n in walk(self.root) if n.type == "call_expression" and not _disabled(n)):
            func = self.func_of(call)
            scope = _Scope(func)
            self.record(call, scope, rep, blas_streams)
        self.assign_groups(rep)
        rep.graph = self.build_graph(rep)
        return rep

    def record(self, call: Node, scope: _Scope, rep: AnalysisReport, blas_streams: dict[str, str]) -> None:
        ks = _kernel_syntax(call)
        fname = scope.func.name if scope.func is not None else None
        stop = scope.func.node if scope.func is not None else None
        if ks is not None:
            rep.launches.append(self.launch(call, ks, scope))
            return
        name = _callee_name(call)
        if name is None:
            method = _method_name(call)
            if method in _BLAS_MEMBERS:
                rep.blas.append(self.blas(call, method, _args(call), scope, blas_streams))
            return
        args = _args(call)
        if name in _COLLECTIVES or name in _P2P:
            cc = self.comm(call, name, args, scope)
            (rep.collectives if name in _COLLECTIVES else rep.p2p).append(cc)
        elif name in _GROUP:
            pass  # paired in assign_groups
        elif name in _BLAS:
            rep.blas.append(self.blas(call, name, args, scope, blas_streams))
        elif name == "cublasSetStream" and len(args) >= 2:
            blas_streams[_base(args[0], scope)] = _base(args[1], scope)
        elif name in _LAUNCH_APIS:
            rep.launches.append(self.api_launch(call, name, args, scope))
        elif name in _COPIES:
            d, s, st = _COPIES[name]
            dst, src = _opt(args, d, scope), _opt(args, s, scope)
            peer = name.startswith("cudaMemcpyPeer") or any(
                x is not None and "peer" in x.lower() for x in (dst, src))
            nbytes = _text(args, 2 if name in ("cudaMemcpy", "cudaMemcpyAsync", "cudaMemsetAsync", "cudaMemset")
                           else 4 if name.startswith("cudaMemcpyPeer") else None)
            rep.copies.append(CopyCall(name, _line(call), fname, dst, src, nbytes, _opt(args, st, scope), peer,
                                       in_loop(call, stop)))
        if name in _ALLOCS:
            p, b, st, kind = _ALLOCS[name]
            buf = _out_arg(args, p, scope)
            if buf is not None:
                rep.allocations.append(Allocation(name, buf, _line(call), _text(args, b), kind, fname,
                                                  _opt(args, st, scope), _text(args, p) or ""))
        if name in _FREES and args:
            rep.frees.append(Free(name, _base(args[0], scope), _line(call), fname))
        if name in _SETUP:
            rep.setup.append(self.setup_call(call, name, args, scope))
        elif name in _STREAM_CREATE and args:
            rep.streams.append(StreamCreate(name, _out_arg(args, 0, scope) or "", _line(call), fname,
                                            _text(args, 1), _text(args, 2)))
        elif name in _EVENT_CALLS:
            if name == "cudaStreamWaitEvent":
                ev, ev_stream = _opt(args, 1, scope), _opt(args, 0, scope)
            elif name.startswith("cudaEventRecord"):
                ev, ev_stream = _opt(args, 0, scope), _opt(args, 1, scope) or "0"
            else:
                ev, ev_stream = _out_arg(args, 0, scope), None
            rep.events.append(EventCall(name, _line(call), fname, ev, ev_stream))
        elif name in _SYNCS:
            rep.syncs.append(SyncCall(name, _line(call), fname, _opt(args, 0, scope)))

    def comm(self, call: Node, name: str, args: list[Node], scope: _Scope) -> CommCall:
        fname = scope.func.name if scope.func is not None else None
        stop = scope.func.node if scope.func is not None else None
        if name in _COLLECTIVES:
            s, r, cnt, dt, op, root, comm, st = _COLLECTIVES[name]
            send, recv = _opt(args, s, scope), _opt(args, r, scope)
            bufs = [b for b in (send, recv) if b is not None]
            bufs = list(dict.fromkeys(bufs))
            return CommCall(name, _line(call), _end_line(call), fname, _opt(args, st, scope), bufs, send, recv,
                            _opt(args, comm, scope), _text(args, cnt), _text(args, dt), _text(args, op),
                            _text(args, root), None, None, in_loop(call, stop), _wrapper(call),
                            [_norm(node_text(a)) for a in args])
        buf = _opt(args, 0, scope)
        send, recv = (buf, None) if name == "ncclSend" else (None, buf)
        return CommCall(name, _line(call), _end_line(call), fname, _opt(args, 5, scope),
                        [buf] if buf is not None else [], send, recv, _opt(args, 4, scope), _text(args, 1),
                        _text(args, 2), None, None, _text(args, 3), None, in_loop(call, stop), _wrapper(call),
                        [_norm(node_text(a)) for a in args])

    def setup_call(self, call: Node, name: str, args: list[Node], scope: _Scope) -> SetupCall:
        fname = scope.func.name if scope.func is not None else None
        handle = buffer = nbytes = comm = None
        if name.startswith("ncclCommInit") or name == "ncclGetUniqueId":
            handle = _out_arg(args, 0, scope)
        elif name in ("ncclCommSplit",):
            comm, handle = _opt(args, 0, scope), _out_arg(args, 3, scope)
        elif name == "ncclCommShrink":
            comm, handle = _opt(args, 0, scope), _out_arg(args, 3, scope)
        elif name in ("ncclCommWindowRegister", "ncclCommRegister"):
            comm, buffer, nbytes, handle = _opt(args, 0, scope), _opt(args, 1, scope), _text(args, 2), _out_arg(
                args, 3, scope)
        elif name in ("ncclCommWindowDeregister", "ncclCommDeregister"):
            comm, handle = _opt(args, 0, scope), _opt(args, 1, scope)
        elif name in ("ncclDevCommCreate", "cuco_devcomm_create", "cuco_devcomm_create_lsa_world",
                      "cuco_devcomm_create_gin"):
            comm, handle = _opt(args, 0, scope), _out_arg(args, len(args) - 1, scope) if args else None
        elif name == "ncclMemAlloc":
            buffer, nbytes = _out_arg(args, 0, scope), _text(args, 1)
        elif name == "ncclMemFree":
            buffer = _opt(args, 0, scope)
        elif args:
            comm = _opt(args, 0, scope)
        return SetupCall(name, _line(call), fname, handle, buffer, nbytes, comm, [_norm(node_text(a)) for a in args])

    def launch(self, call: Node, ks: Node, scope: _Scope) -> Launch:
        fname = scope.func.name if scope.func is not None else None
        stop = scope.func.node if scope.func is not None else None
        fn = call.child_by_field_name("function")
        targs = None
        if fn is not None and fn.type == "template_function":
            ta = fn.child_by_field_name("arguments")
            targs = _norm(node_text(ta)) if ta is not None else None
            fn = fn.child_by_field_name("name")
        kname = node_text(fn).split("::")[-1] if fn is not None else "<kernel>"
        cfg = [c for c in ks.named_children if c.type != "comment"]
        conf = [_norm(node_text(c)) for c in cfg] + [None] * 4
        stream = _base(cfg[3], scope) if len(cfg) > 3 else None
        args = _args(call)
        reads, writes, known = self.kernel_buffers(kname, args, scope)
        return Launch(kname, _line(call), _end_line(call), fname, conf[0], conf[1], conf[2], stream,
                      [_norm(node_text(a)) for a in args], reads, writes, targs, "<<<>>>", known, in_loop(call, stop),
                      _wrapper(call))

    def api_launch(self, call: Node, name: str, args: list[Node], scope: _Scope) -> Launch:
        """cudaLaunchKernel / cudaLaunchCooperativeKernel(func, grid, block, args, smem, stream): arguments go
        through a void* array, so the buffers are not known."""
        fname = scope.func.name if scope.func is not None else None
        stop = scope.func.node if scope.func is not None else None
        kname = "<kernel>"
        if args:
            k = args[0]
            while k.type in ("cast_expression", "parenthesized_expression", "pointer_expression"):
                nxt = k.child_by_field_name("value") or k.child_by_field_name("argument") or (
                    k.named_children[-1] if k.named_children else None)
                if nxt is None:
                    break
                k = nxt
            if k.type == "template_function":
                k = k.child_by_field_name("name") or k
            kname = node_text(k).split("::")[-1]
        return Launch(kname, _line(call), _end_line(call), fname, _text(args, 1), _text(args, 2), _text(args, 4),
                      _opt(args, 5, scope), [], [], [], None, name, False, in_loop(call, stop), _wrapper(call))

    def kernel_buffers(self, kname: str, args: list[Node], scope: _Scope) -> tuple[list[str], list[str], bool]:
        k = self.kernels.get(kname)
        reads: list[str] = []
        writes: list[str] = []
        if k is None or len(k.params) != len(args):
            # Unknown kernel (defined elsewhere) or variadic: every argument may be read and written.
            for a in args:
                if a.type not in ("number_literal", "true", "false", "null", "nullptr", "sizeof_expression"):
                    b = _base(a, scope)
                    reads.append(b)
                    writes.append(b)
            return list(dict.fromkeys(reads)), list(dict.fromkeys(writes)), False
        for p, a in zip(k.params, args):
            if not p.pointer:
                continue
            b = _base(a, scope)
            if p.reads:
                reads.append(b)
            if p.writes:
                writes.append(b)
        return list(dict.fromkeys(reads)), list(dict.fromkeys(writes)), True

    def blas(self, call: Node, name: str, args: list[Node], scope: _Scope,
             blas_streams: dict[str, str]) -> BlasCall:
        fname = scope.func.name if scope.func is not None else None
        stop = scope.func.node if scope.func is not None else None
        h, r, w, st = _BLAS[name] if name in _BLAS else _BLAS_MEMBERS[name]
        handle = _opt(args, h, scope)
        stream = _opt(args, st, scope) if st is not None else blas_streams.get(handle or "", None)
        return BlasCall(name, _line(call), fname, handle, stream,
                        [x for x in (_opt(args, i, scope) for i in r) if x is not None],
                        [x for x in (_opt(args, i, scope) for i in w) if x is not None],
                        in_loop(call, stop), [_norm(node_text(a)) for a in args])

    def assign_groups(self, rep: AnalysisReport) -> None:
        """Pair ncclGroupStart/End per function in source order; comm calls between them join the outermost."""
        comm_by_line: dict[tuple[str | None, int], list[CommCall]] = {}
        for c in rep.collectives + rep.p2p:
            comm_by_line.setdefault((c.function, c.line), []).append(c)
        for f in self.funcs:
            if f.body is None:
                continue
            events: list[tuple[int, str, Node]] = []
            for n in walk(f.body):
                if n.type == "call_expression" and self.func_of(n) is f and not _disabled(n):
                    name = _callee_name(n)
                    if name in _GROUP or name in _COLLECTIVES or name in _P2P:
                        events.append((n.start_byte, name, n))
            events.sort(key=lambda e: e[0])
            stack: list[Group] = []
            for _pos, name, node in events:
                if name == "ncclGroupStart":
                    g = Group(len(rep.groups), f.name, _line(node), None, len(stack),
                              in_loop=in_loop(node, f.node))
                    rep.groups.append(g)
                    stack.append(g)
                elif name == "ncclGroupEnd":
                    if stack:
                        stack.pop().end_line = _line(node)
                elif stack:
                    outer = stack[0]
                    for c in comm_by_line.get((f.name, _line(node)), []):
                        if c.call == name and c.group is None:
                            c.group = outer.index
                            outer.calls.append({"call": c.call, "line": c.line, "in_loop": c.in_loop})
                            break

    # -- features that need the whole tree --

    def device_api_names(self) -> list[str]:
        found: set[str] = set()
        for n in walk(self.root):
            if n.type in ("identifier", "type_identifier", "namespace_identifier", "field_identifier"):
                t = node_text(n)
                if t in _DEVICE_API_NAMES or t.startswith(_DEVICE_API_PREFIXES):
                    found.add(t)
        return sorted(found)

    def flag_waits(self) -> list[dict[str, Any]]:
        """Spin loops in device code whose condition reads a flag/epoch/signal, and host stream wait-value calls."""
        out: list[dict[str, Any]] = []
        for f in self.funcs:
            if not f.device or f.body is None:
                continue
            for n in walk(f.body):
                if n.type in ("while_statement", "do_statement", "for_statement"):
                    cond = n.child_by_field_name("condition")
                    if cond is None:
                        continue
                    words = {node_text(x).lower() for x in walk(cond)
                             if x.type in ("identifier", "field_identifier")}
                    if any(("flag" in w or "epoch" in w or "signal" in w) for w in words):
                        out.append({"kind": "spin", "function": f.name, "line": _line(n)})
        for n in walk(self.root):
            if n.type == "call_expression":
                name = _callee_name(n) or ""
                if (name in _STREAM_WAIT_VALUE or (name.startswith("ncclGin") and "wait" in name.lower())
                        or _FLAG_WAIT_CALL.match(name)):
                    owner = self.func_of(n)
                    out.append({"kind": name, "function": owner.name if owner else None, "line": _line(n)})
            elif n.type == "field_expression":
                fld = n.child_by_field_name("field")
                parent = n.parent
                if (fld is not None and node_text(fld) in ("waitSignal", "waitCounter") and parent is not None
                        and parent.type == "call_expression"):
                    owner = self.func_of(n)
                    out.append({"kind": node_text(fld), "function": owner.name if owner else None,
                                "line": _line(n)})
        return out

    # -- execution-order graph --

    def roots(self) -> list[_Func]:
        called: set[str] = set()
        for f in self.funcs:
            if f.device or f.body is None:
                continue
            for n in walk(f.body):
                if n.type == "call_expression":
                    name = _callee_name(n)
                    if name in self.by_name and self.by_name[name] is not f:
                        called.add(name)
        return [f for f in self.funcs if not f.device and f.body is not None and f.short not in called]

    def expand(self, func: _Func, scope: _Scope, stack: list[str], sites: list[list[Any]],
               depth: int) -> Iterator[tuple[Node, _Scope, list[list[Any]]]]:
        """Call sites of `func` in execution order, calls to local host functions replaced by their bodies;
        `sites` are the calls that led here ([function, line] from the root down)."""
        assert func.body is not None  # roots() and the inlining below expand only functions with a body
        calls = sorted((n for n in walk(func.body)
                        if n.type == "call_expression" and self.func_of(n) is func and not _disabled(n)),
                       key=lambda n: n.start_byte)
        for call in calls:
            name = _callee_name(call)
            callee = self.by_name.get(name or "")
            if (callee is not None and not callee.device and callee.body is not None and _kernel_syntax(call) is None
                    and callee.short not in stack and depth < _MAX_INLINE_DEPTH):
                args = _args(call)
                bindings = {p: _base(a, scope) for p, a in zip(callee.params, args) if p}
                yield from self.expand(callee, _Scope(callee, bindings), stack + [callee.short],
                                       sites + [[func.name, _line(call)]], depth + 1)
            else:
                yield call, scope, sites

    def build_graph(self, rep: AnalysisReport) -> Graph:
        g = Graph()
        order: list[dict[str, Any]] = []  # nodes plus the sync points between them
        blas_streams: dict[str, str] = {}
        group_depth = 0
        group_id = -1
        for root in self.roots():
            for call, scope, sites in self.expand(root, _Scope(root), [root.short], [], 0):
                tmp = AnalysisReport(filename="")
                self.record(call, scope, tmp, blas_streams)
                name = _callee_name(call)
                if name == "ncclGroupStart":
                    if group_depth == 0:
                        group_id += 1
                    group_depth += 1
                    continue
                if name == "ncclGroupEnd":
                    group_depth = max(0, group_depth - 1)
                    continue
                grp = group_id if group_depth > 0 else None
                first = len(order)
                for c in tmp.collectives + tmp.p2p:
                    order.append(self.node("collective" if c.call in _COLLECTIVES else "p2p", c.call, c.line,
                                           c.function, c.stream, [c.send] if c.send else [],
                                           [c.recv] if c.recv else [], grp, c.in_loop) | {"comm": c.comm})
                for la in tmp.launches:
                    order.append(self.node("kernel", la.kernel, la.line, la.function, la.stream, la.reads,
                                           la.writes, None, la.in_loop))
                for b in tmp.blas:
                    order.append(self.node("blas", b.call, b.line, b.function, b.stream, b.reads, b.writes, None,
                                           b.in_loop))
                for cp in tmp.copies:
                    order.append(self.node("copy", cp.call, cp.line, cp.function, cp.stream,
                                           [cp.src] if cp.src else [], [cp.dst] if cp.dst else [], None,
                                           cp.in_loop))
                for e in tmp.events:
                    if e.call.startswith("cudaEventRecord") or e.call == "cudaStreamWaitEvent":
                        order.append({"sync": e.call, "event": e.event, "stream": _stream_key(e.stream)})
                for s in tmp.syncs:
                    order.append({"sync": s.call, "target": s.target})
                for item in order[first:]:
                    if "sync" not in item:
                        item["sites"] = sites
        for item in order:
            if "sync" not in item:
                item["id"] = len(g.nodes)
                g.nodes.append(item)
                g.stream_order.setdefault(item["stream"], []).append(item["id"])
        positions = {id(item): i for i, item in enumerate(order)}
        last_writer: dict[str, dict[str, Any]] = {}
        for item in order:
            if "sync" in item:
                continue
            for b in item["reads"]:
                src = last_writer.get(b)
                if src is not None and src is not item:
                    g.edges.append({
                        "src": src["id"], "dst": item["id"], "buffer": b, "kind": _edge_kind(src, item),
                        "order": _ordering(order, positions[id(src)], positions[id(item)]),
                        "src_stream": src["stream"], "dst_stream": item["stream"],
                    })
            for b in item["writes"]:
                last_writer[b] = item
        return g

    @staticmethod
    def node(kind: str, name: str, line: int, function: str | None, stream: str | None, reads: list[str],
             writes: list[str], group: int | None, in_loop: bool) -> dict[str, Any]:
        return {"kind": kind, "name": name, "line": line, "function": function, "stream": _stream_key(stream),
                "reads": list(reads), "writes": list(writes), "group": group, "in_loop": in_loop}


_COMPUTE = ("kernel", "blas")
_COMM = ("collective", "p2p", "copy")


def _stream_key(stream: str | None) -> str:
    return "0" if stream is None or stream in _DEFAULT_STREAMS else stream


def _edge_kind(src: dict[str, Any], dst: dict[str, Any]) -> str:
    if src["kind"] in _COMPUTE and dst["kind"] in _COMM:
        return "produce"
    if src["kind"] in _COMM and dst["kind"] in _COMPUTE:
        return "consume"
    return "data"


def _ordering(order: list[dict[str, Any]], i: int, j: int) -> str:
    s, d = order[i]["stream"], order[j]["stream"]
    if s == d:
        return "stream"
    recorded: set[str] = set()
    for item in order[i + 1:j]:
        call = item.get("sync")
        if call is None:
            continue
        if call.startswith("cudaEventRecord") and item["stream"] == s and item["event"]:
            recorded.add(item["event"])
        elif call == "cudaStreamWaitEvent" and item["stream"] == d and item["event"] in recorded:
            return "event"
        elif call == "cudaDeviceSynchronize" or (call == "cudaStreamSynchronize"
                                                 and _stream_key(item["target"]) == s):
            return "host_sync"
        elif call == "cudaEventSynchronize" and item["target"] in recorded:
            return "host_sync"
    if "0" in (s, d):
        return "default_stream"
    return "unordered"


def _disabled(node: Node) -> bool:
    """True inside the first branch of `#if 0` (code the compiler never sees; tree-sitter still parses it)."""
    child, n = node, node.parent
    while n is not None:
        if n.type in ("preproc_if", "preproc_elif"):
            cond = n.child_by_field_name("condition")
            alt = n.child_by_field_name("alternative")
            if cond is not None and node_text(cond).strip() in ("0", "false") and child != alt and child != cond:
                return True
        child, n = n, n.parent
    return False


def _inside_error(node: Node) -> bool:
    n = node.parent
    while n is not None:
        if n.type == "ERROR":
            return True
        n = n.parent
    return False


# --- public API ---------------------------------------------------------------------------------------------


def analyze(code: str, filename: str = "<string>") -> AnalysisReport:
    """Analyze CUDA source text. Raises BadInput when the text is not CUDA/C++ with at least one function."""
    if not isinstance(code, str):
        raise BadInput(f"{filename}: expected source text (str), got {type(code).__name__}")
    if "\x00" in code:
        raise BadInput(f"{filename}: looks binary (NUL bytes); pass a CUDA source file")
    if not code.strip():
        raise BadInput(f"{filename}: file is empty; pass a CUDA source file")
    a = _Analyzer(code, filename)
    a.check_is_cuda()
    return a.run()


def analyze_file(path: str | Path) -> AnalysisReport:
    """Read and analyze a file; BadInput for a missing, unreadable or binary file."""
    p = Path(path)
    if not p.is_file():
        raise BadInput(f"{p}: no such file; pass the path of a CUDA source (.cu)")
    data = p.read_bytes()
    if b"\x00" in data:
        raise BadInput(f"{p}: looks binary (NUL bytes); pass a CUDA source file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadInput(f"{p}: not UTF-8 text (byte {exc.start}); pass a CUDA source file") from None
    return analyze(text, str(p))


__all__ = [
    "ALLOC_CALLS", "BLAS_CALLS", "COMM_CALLS", "COPY_CALLS", "EVENT_CALLS", "FREE_CALLS", "GROUP_CALLS",
    "LAUNCH_APIS", "LOOPS", "REDUCING_COLLECTIVES", "SETUP_CALLS", "STREAM_CREATE_CALLS", "SYNC_CALLS",
    "AnalysisReport", "Allocation", "BlasCall", "CommCall", "CopyCall", "EventCall", "Free", "Graph", "Group",
    "Kernel", "KernelParam", "Launch", "SetupCall", "StreamCreate", "SyncCall", "analyze", "analyze_file",
]
