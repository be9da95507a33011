"""Small tree-sitter helpers for CUDA sources: parse, node text, calls with their host/device context.

tree-sitter-cuda (0.21, on tree-sitter 0.26) recovers from what it cannot parse with ERROR nodes instead of
failing: attribute macros such as ``CUCO_EXPORT`` or ``[=] __device__ (...)`` lambdas leave small ERROR nodes in
otherwise good trees, so callers must not treat ``has_error`` as "not CUDA". Macro bodies (``#define``) are kept as
raw text (``preproc_arg``), never parsed into calls; calls written inside macro invocations (``CHECK(cudaFoo())``)
do parse as ``call_expression``.
"""
from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache

import tree_sitter
import tree_sitter_cuda

Node = tree_sitter.Node
Tree = tree_sitter.Tree

# Qualifiers that make a function (or lambda) run on the device. `__host__ __device__` code also runs on the
# host, so it counts as host code: what is forbidden on the host is forbidden there too.
_DEVICE_QUALIFIERS = frozenset({"__global__", "__device__"})
_FUNCTION_NODES = frozenset({"function_definition", "lambda_expression"})


@lru_cache(maxsize=1)
def _parser() -> tree_sitter.Parser:
    return tree_sitter.Parser(tree_sitter.Language(tree_sitter_cuda.language()))


def parse(code: str | bytes) -> Tree:
    """Parse CUDA/C++ source. Node positions are in bytes of the UTF-8 encoding; rows are 0-based."""
    data = code.encode("utf-8") if isinstance(code, str) else code
    return _parser().parse(data)


def node_text(node: Node) -> str:
    return (node.text or b"").decode("utf-8", errors="replace")


def walk(node: Node) -> Iterator[Node]:
    """Every node under `node` (itself included), depth first, in source order."""
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(reversed(n.children))


def declarator_name(decl: Node | None) -> str | None:
    """The name a (pointer, reference, array, function, init) declarator declares."""
    while decl is not None:
        if decl.type in ("identifier", "field_identifier"):
            return node_text(decl)
        nxt = decl.child_by_field_name("declarator")
        if nxt is None:
            nxt = next((c for c in decl.named_children if c.type in ("identifier", "pointer_declarator",
                                                                     "reference_declarator", "array_declarator")),
                       None)
        decl = nxt
    return None


def enclosing_function(node: Node) -> Node | None:
    """The innermost function_definition or lambda_expression that contains `node` (None at file scope)."""
    n = node.parent
    while n is not None:
        if n.type in _FUNCTION_NODES:
            return n
        n = n.parent
    return None


def _qualifiers(fn: Node) -> set[str]:
    """Words of a function's or lambda's head (everything before its body). Read as text because the grammar
    leaves some heads half-parsed: `__global__ void __cluster_dims__(2, 1, 1) k()` or `[=] __device__ (int i)`
    put the qualifier in an ERROR node."""
    body = fn.child_by_field_name("body")
    end = body.start_byte if body is not None else fn.end_byte
    head = (fn.text or b"")[:end - fn.start_byte].decode("utf-8", errors="replace")
    words = set(re.findall(r"[A-Za-z_]\w*", head))
    # `__global__ void __cluster_dims__(2, 1, 1) k(...) {` parses as a declaration closed by a MISSING ';'
    # followed by a function without return type: the qualifiers sit in that declaration.
    prev = fn.prev_sibling
    if fn.type == "function_definition" and prev is not None and prev.type == "declaration" and \
            prev.child_count and prev.children[-1].is_missing:
        words |= set(re.findall(r"[A-Za-z_]\w*", node_text(prev)))
    return words


def device_macros(tree: Tree) -> frozenset[str]:
    """Object-like macros whose body makes a function device-only (`#define DEV __device__ __forceinline__`)."""
    names = set()
    for node in walk(tree.root_node):
        if node.type == "preproc_def":
            name, value = node.child_by_field_name("name"), node.child_by_field_name("value")
            words = set(node_text(value).split()) if value is not None else set()
            if name is not None and words & _DEVICE_QUALIFIERS and "__host__" not in words:
                names.add(node_text(name))
    return frozenset(names)


def function_name(fn: Node) -> str:
    """Name of a function_definition (`ns::f`, `S::m`), or "<lambda>"."""
    if fn.type == "lambda_expression":
        return "<lambda>"
    decl = fn.child_by_field_name("declarator")
    while decl is not None and decl.type != "function_declarator":
        decl = decl.child_by_field_name("declarator")
    if decl is None:
        return "<unknown>"
    name = decl.child_by_field_name("declarator")
    return node_text(name) if name is not None else "<unknown>"


def is_device_function(fn: Node, macros: frozenset[str] = frozenset()) -> bool:
    """True when `fn` runs only on the device (__global__ or __device__ without __host__). macros: names that
    expand to a device qualifier (see `device_macros`)."""
    quals = _qualifiers(fn)
    return bool(quals & (_DEVICE_QUALIFIERS | macros)) and "__host__" not in quals


def is_device_code(node: Node, macros: frozenset[str] = frozenset()) -> bool:
    """True when `node` sits in device-only code: any enclosing function or lambda is device-only."""
    fn = enclosing_function(node)
    while fn is not None:
        if is_device_function(fn, macros):
            return True
        fn = enclosing_function(fn)
    return False


@dataclass(frozen=True)
class Call:
    """One call expression.

    kind: "function" (a named function or macro), "member" (obj.f() / p->f()), "launch" (a kernel launch
    k<<<...>>>()), "lambda" (an immediately invoked lambda) or "indirect" (anything else: (*fp)(), f()()).
    name: the callee as written without template arguments (`std::max`, `cudaMemcpyAsync`, `push_back`).
    line: 1-based.
    """

    name: str
    kind: str
    line: int
    device: bool
    function: str | None
    node: Node


def strip_templates(text: str) -> str:
    out, depth = [], 0
    for ch in text:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif depth == 0 and not ch.isspace():
            out.append(ch)
    return "".join(out)


def callee(call: Node) -> tuple[str, str]:
    """(kind, name) of a call_expression's callee."""
    fn = call.child_by_field_name("function")
    if any(c.type == "kernel_call_syntax" for c in call.children):
        return "launch", strip_templates(node_text(fn)) if fn is not None else "<kernel>"
    if fn is None:
        return "indirect", node_text(call)[:40]
    if fn.type in ("identifier", "qualified_identifier", "template_function", "primitive_type",
                   "type_identifier"):
        return "function", strip_templates(node_text(fn))
    if fn.type == "field_expression":
        field = fn.child_by_field_name("field")
        return "member", strip_templates(node_text(field)) if field is not None else node_text(fn)
    if fn.type == "lambda_expression":
        return "lambda", "<lambda>"
    return "indirect", " ".join(node_text(fn).split())[:40]


def iter_calls(tree: Tree) -> Iterator[Call]:
    """Every call_expression in the tree, with its callee, line and host/device context."""
    macros = device_macros(tree)
    for node in walk(tree.root_node):
        if node.type != "call_expression":
            continue
        kind, name = callee(node)
        fn = enclosing_function(node)
        yield Call(name=name, kind=kind, line=node.start_point.row + 1, device=is_device_code(node, macros),
                   function=function_name(fn) if fn is not None else None, node=node)


def error_fraction(tree: Tree) -> float:
    """Share of the source bytes that tree-sitter could not parse (ERROR or MISSING nodes)."""
    root = tree.root_node
    total = max(root.end_byte, 1)
    bad = 0
    stack = [root]
    while stack:
        n = stack.pop()
        if n.type == "ERROR" or n.is_missing:
            bad += n.end_byte - n.start_byte
            continue
        stack.extend(n.children)
    return bad / total
