"""The integers of a host program that become the workload's sizes, and what the program requires of them.

Sizes come from file-scope constants (``#define N (1 << 20)``, ``constexpr size_t kN = 1024 * 1024;``) and from
integer locals of the functions on the way to the step whose value the program writes down: a constant
initialiser (``int count = 4 * 1024 * 1024;``, ``int rows[4] = {512, 384, 256, 128};``) or one read from the
command line or the environment with a default (``argc > 1 ? atoi(argv[1]) : 1 << 20``, ``getenv("N") ? ... :
64``). A size is *fixed* when the program needs it at compile time (device code, an array bound, a template
argument, a preprocessor condition) or as a launch's block shape; a fixed size keeps its value in every preset.
A size divided by the world size, or taken modulo something, must stay a multiple of it (`multiples`), and a
program that refuses some world sizes (`if (nranks != 2) return 1;`) runs on the others only
(`accepted_worlds`).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from cuco_kit.importer.program import (
    ENV_CALLS,
    PARSE_CALLS,
    Frame,
    Program,
    body_statements,
    call_args,
    declarator_name,
    identifiers,
    line_of,
    short_name,
    writes_of,
)
from cuco_kit.importer.size_expr import Untranslatable, c_value, expression
from cuco_kit.source.cuda_parse import Node, node_text, walk

INTEGER_TYPES = frozenset({
    "int", "unsigned", "unsigned int", "signed", "long", "long int", "long long", "long long int", "unsigned long",
    "unsigned long long", "short", "unsigned short", "size_t", "std::size_t", "ssize_t", "ptrdiff_t", "int8_t",
    "int16_t", "int32_t", "int64_t", "uint8_t", "uint16_t", "uint32_t", "uint64_t", "std::int32_t",
    "std::int64_t", "std::uint32_t", "std::uint64_t", "auto"})
# The most ranks the worlds of a plan are checked for (one machine).
MAX_WORLD = 8
_EXIT_CALLS = frozenset({"exit", "abort", "MPI_Abort", "MPI_Finalize", "_exit"})
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)
_CONSTANT_CONTEXTS = frozenset({"template_argument_list", "static_assert_declaration", "case_statement",
                                "enumerator", "bitfield_clause", "alignas_qualifier", "launch_bounds"})


def type_text(decl: Node) -> str:
    t = decl.child_by_field_name("type")
    return " ".join(node_text(t).split()) if t is not None else ""


def is_integer_type(decl: Node) -> bool:
    return type_text(decl) in INTEGER_TYPES


@dataclass
class Constant:
    """A file-scope integer constant: a #define, or a const/constexpr variable. `reads` are the other constants
    its value is written with (a derived constant, not a size of its own)."""

    name: str
    value: int
    ctype: str
    define: bool
    node: Node  # the preproc_def, or the declaration
    declarator: Node | None  # the init_declarator of a variable
    expr: str  # the value as written (comments dropped)
    reads: set[str] = field(default_factory=set)


def file_constants(root: Node) -> dict[str, Constant]:
    """Every file-scope integer constant whose value the analysis can compute, in file order."""
    out: dict[str, Constant] = {}
    values: dict[str, int] = {}
    for n in walk(root):
        if _inside_function(n):
            continue
        if n.type == "preproc_def":
            name, value = n.child_by_field_name("name"), n.child_by_field_name("value")
            if name is None or value is None:
                continue
            text = _COMMENT.sub("", node_text(value)).strip()
            try:
                expr = expression(text)
                v = c_value(expr, values)
            except Untranslatable:
                continue
            ctype = "int" if -2**31 <= v < 2**31 else "long long"
            out[node_text(name)] = Constant(node_text(name), v, ctype, True, n, None, text,
                                            identifiers(expr) & set(values))
            values[node_text(name)] = v
        elif n.type == "declaration" and _constant_qualified(n) and is_integer_type(n):
            for d in n.children_by_field_name("declarator"):
                target, value = d.child_by_field_name("declarator"), d.child_by_field_name("value")
                if d.type != "init_declarator" or target is None or value is None or target.type != "identifier":
                    continue
                try:
                    v = c_value(value, values)
                except Untranslatable:
                    continue
                out[node_text(target)] = Constant(node_text(target), v, type_text(n), False, n, d,
                                                  node_text(value), identifiers(value) & set(values))
                values[node_text(target)] = v
    return out


def _inside_function(node: Node) -> bool:
    n = node.parent
    while n is not None:
        if n.type in ("function_definition", "lambda_expression"):
            return True
        n = n.parent
    return False


def _constant_qualified(decl: Node) -> bool:
    quals = {node_text(c) for c in decl.children if c.type in ("type_qualifier", "storage_class_specifier")}
    return bool(quals & {"const", "constexpr"})


@dataclass
class LocalSize:
    """An integer local of a frame that is a size. `param` is its parameter name (`rows_0` for element 0 of an
    array `rows`); `value` its default (None when the program takes it from the command line or the environment
    with no default); `source` says where the program gets it."""

    param: str
    variable: str
    index: int | None
    value: int | None
    ctype: str
    declaration: Node
    declarator: Node
    source: str  # "constant" | "command line" | "environment"
    note: str = ""


class _External:
    """What reads the command line or the environment: argv/argc, getenv, the parse functions, locals set from
    getenv, and functions of the program that do any of these."""

    def __init__(self, program: Program, body: Node) -> None:
        self.program = program
        self.env_locals: set[str] = set()  # strings the program got from the environment (`char* s = getenv(..)`)
        for n in walk(body):
            if n.type == "init_declarator" and (n.child_by_field_name("declarator") or n).type == "pointer_declarator":
                name = declarator_name(n.child_by_field_name("declarator"))
                value = n.child_by_field_name("value")
                if name and value is not None and self.reads(value):
                    self.env_locals.add(name)

    def reads(self, node: Node) -> bool:
        for x in walk(node):
            if x.type == "identifier" and node_text(x) in ({"argv", "argc"} | self.env_locals):
                return True
            if x.type == "call_expression":
                kind, name = short_name(x)
                if name in PARSE_CALLS or name in ENV_CALLS:
                    return True
                fn = self.program.callee_function(x)
                if fn is not None and any(short_name(c)[1] in (PARSE_CALLS | ENV_CALLS)
                                          for c in self.program.calls_in(fn)):
                    return True
        return False

    def source(self, node: Node) -> str:
        env = any(x.type == "call_expression" and short_name(x)[1] in ENV_CALLS for x in walk(node)) or any(
            x.type == "identifier" and node_text(x) in self.env_locals for x in walk(node))
        return "environment" if env else "command line"


def _constant(node: Node) -> int | None:
    try:
        return c_value(node, {})
    except Untranslatable:
        return None


def local_sizes(program: Program, body: Node, before: int, exclude: set[str]) -> list[LocalSize]:
    """The sizes among the integer locals a function body declares (at its top level, before byte `before`)."""
    ext = _External(program, body)
    top = [s for s in body_statements(body) if s.start_byte < before]
    out: list[LocalSize] = []
    for decl in top:
        if decl.type != "declaration" or not is_integer_type(decl):
            continue
        for d in decl.children_by_field_name("declarator"):
            name = declarator_name(d)
            value = d.child_by_field_name("value") if d.type == "init_declarator" else None
            target = d.child_by_field_name("declarator") if d.type == "init_declarator" else None
            if not name or name in exclude or value is None or target is None:
                continue
            if not _only_overridden(name, decl, top, ext):
                continue
            ctype = type_text(decl)
            if target.type == "array_declarator" and value.type == "initializer_list":
                items = [_constant(e) for e in value.named_children]
                if items and all(v is not None for v in items):
                    out += [LocalSize(f"{name}_{i}", name, i, v, ctype, decl, d, "constant")
                            for i, v in enumerate(items)]
                continue
            if target.type != "identifier":
                continue
            if not ext.reads(value):
                v = _constant(value)
                if v is not None:
                    out.append(LocalSize(name, name, None, v, ctype, decl, d, "constant"))
                continue
            out.append(_external_size(program, name, ctype, decl, d, value, ext))
    return out


def _external_size(program: Program, name: str, ctype: str, decl: Node, d: Node, value: Node,
                   ext: _External) -> LocalSize:
    """A local read from the command line or the environment: its default is the constant branch of `?:`, or
    the last integer argument of a function of the program that reads it (said in a note)."""
    default: int | None = None
    note = ""
    inner = value
    while inner.type in ("parenthesized_expression", "cast_expression"):
        inner = inner.child_by_field_name("value") or inner.named_children[0]
    if inner.type == "conditional_expression":
        a, b = inner.child_by_field_name("consequence"), inner.child_by_field_name("alternative")
        if a is not None and b is not None and ext.reads(a) != ext.reads(b):
            default = _constant(b if ext.reads(a) else a)
    elif inner.type == "call_expression" and program.callee_function(inner) is not None:
        literals = [v for v in (_constant(a) for a in call_args(inner)) if v is not None]
        if literals:
            default = literals[-1]
            note = (f"size {name}: its default {default} is the last integer argument of "
                    f"{short_name(inner)[1]}() at L{line_of(inner)}; check it")
    return LocalSize(name, name, None, default, ctype, decl, d, ext.source(value), note)


def _only_overridden(name: str, decl: Node, top: list[Node], ext: _External) -> bool:
    """True when every later write of `name` (before the step) reads the command line or the environment:
    overrides of the default (`if (argc > 1) n = atoi(argv[1]);`), not computations."""
    for s in top:
        if s == decl or name not in writes_of(s):
            continue
        for n in walk(s):
            if n.type in ("assignment_expression", "update_expression"):
                target = n.child_by_field_name("left") or n.child_by_field_name("argument")
                rhs = n.child_by_field_name("right")
                if target is not None and node_text(target) == name and (rhs is None or not ext.reads(rhs)):
                    return False
            elif n.type == "pointer_expression" and node_text(n).replace(" ", "") == f"&{name}":
                return False
    return True


class Values:
    """What a name is written with, to follow it to the sizes it is made of: a derived constant's value
    anywhere, a local's initialiser within its own function; sizes themselves are not followed."""

    def __init__(self, constants: dict[str, Constant], sizes: set[str]) -> None:
        self.sizes = sizes
        self.derived: dict[str, Node] = {}
        for c in constants.values():
            if c.reads:
                value = c.declarator.child_by_field_name("value") if c.declarator is not None else None
                self.derived[c.name] = value if value is not None else expression(c.expr)
        self._locals: dict[Node, dict[str, Node]] = {}

    def get(self, name: str, at: Node) -> Node | None:
        if name in self.sizes:
            return None
        fn = _function_of(at)
        if fn is not None and fn not in self._locals:
            self._locals[fn] = local_values(fn)
        local = self._locals.get(fn, {}) if fn is not None else {}
        return local.get(name) if name in local else self.derived.get(name)

    def follow(self, node: Node, at: Node) -> set[str]:
        """The names in `node` and in what they are written with, transitively."""
        names: set[str] = set()
        todo = list(identifiers(node))
        while todo:
            x = todo.pop()
            if x in names:
                continue
            names.add(x)
            value = self.get(x, at)
            if value is not None:
                todo += identifiers(value)
        return names


def local_values(fn: Node) -> dict[str, Node]:
    """name -> what a local of `fn` is initialised with (`dim3 block(TILE, TILE)`: its arguments)."""
    out: dict[str, Node] = {}
    for n in walk(fn):
        if n.type == "init_declarator":
            name = declarator_name(n.child_by_field_name("declarator"))
            value = n.child_by_field_name("value")
            if name and value is not None:
                out.setdefault(name, value)
        elif n.type == "function_declarator" and n.parent is not None and n.parent.type == "declaration":
            name = declarator_name(n)
            params = n.child_by_field_name("parameters")
            if name and params is not None:
                out.setdefault(name, params)
    return out


def _function_of(node: Node) -> Node | None:
    n: Node | None = node
    while n is not None and n.type != "function_definition":
        n = n.parent
    return n


def _declared_in(fn: Node) -> set[str]:
    """Parameters and locals of a function."""
    out: set[str] = set()
    for n in walk(fn):
        if n.type in ("parameter_declaration", "optional_parameter_declaration"):
            name = declarator_name(n.child_by_field_name("declarator"))
            if name:
                out.add(name)
        elif n.type == "declaration":
            for d in n.children_by_field_name("declarator"):
                name = declarator_name(d)
                if name:
                    out.add(name)
    return out


def fixed_names(program: Program, values: Values) -> set[str]:
    """Names the program needs at compile time (device code, array bounds, template arguments, preprocessor
    conditions, enumerators, case labels, launch bounds) or as a launch's block shape, with what they are
    written with."""
    names: set[str] = set()
    for fn in program.device_functions:
        names |= values.follow(fn, fn) - _declared_in(fn)
    for n in walk(program.root):
        if n.type in _CONSTANT_CONTEXTS:
            names |= values.follow(n, n)
        elif n.type == "array_declarator":
            size = n.child_by_field_name("size")
            if size is not None:
                names |= values.follow(size, n)
        elif n.type in ("preproc_if", "preproc_elif"):
            cond = n.child_by_field_name("condition")
            if cond is not None:
                names |= values.follow(cond, n)
        elif n.type == "kernel_call_syntax":
            config = [c for c in n.named_children if c.type != "comment"]
            if len(config) > 1:
                names |= values.follow(config[1], n)
    return names


def product_factors(node: Node, values: Values, at: Node, depth: int = 0) -> list[str] | None:
    """The names a product is made of (`(size_t)n * sizeof(float)` -> [n]), locals and derived constants
    replaced by what they are written with; None when the expression is not a product."""
    while node.type in ("parenthesized_expression", "cast_expression"):
        inner = node.child_by_field_name("value") if node.type == "cast_expression" else (
            node.named_children[0] if node.named_children else None)
        if inner is None:
            return None
        node = inner
    if node.type in ("number_literal", "sizeof_expression"):
        return []
    if node.type == "identifier":
        value = values.get(node_text(node), at) if depth < 8 else None
        return product_factors(value, values, at, depth + 1) if value is not None else [node_text(node)]
    if node.type == "binary_expression":
        op = node.child_by_field_name("operator")
        left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
        if op is None or node_text(op) != "*" or left is None or right is None:
            return None
        a, b = product_factors(left, values, at, depth), product_factors(right, values, at, depth)
        return None if a is None or b is None else a + b
    return None


def multiples(program: Program, free: dict[str, int], known: dict[str, int], world_names: set[str],
              values: Values) -> dict[str, int]:
    """free size -> the number the small preset must keep it a multiple of: a size divided by the world size, or
    taken modulo it, stays a multiple of 4 (so of 2 as well); one divided by a literal or a fixed size stays a
    multiple of that."""
    out: dict[str, int] = {}
    for n in [x for root in [program.root, *values.derived.values()] for x in walk(root)]:
        if n.type != "binary_expression":
            continue
        op = n.child_by_field_name("operator")
        left, right = n.child_by_field_name("left"), n.child_by_field_name("right")
        if op is None or node_text(op) not in ("/", "%") or left is None or right is None:
            continue
        factors = product_factors(left, values, n)
        targets = [f for f in factors or [] if f in free]
        if not targets:
            continue
        if identifiers(right) & world_names:
            m = 4
        else:
            try:
                m = c_value(right, known)
            except Untranslatable:
                continue
        for size in targets:
            keep = m if free[size] % m == 0 else math.gcd(m, free[size])
            if keep > 1:
                out[size] = math.lcm(out.get(size, 1), keep)
                break
    return out


def accepted_worlds(frames: list[Frame], world_names: set[str], program: Program) -> list[int]:
    """The world sizes (1 to MAX_WORLD) the program runs on, from its guards on the world size alone (`if
    (nranks != 2) { ...; return 1; }`); empty when it refuses none."""
    refused: set[int] = set()
    for frame in frames:
        for s in body_statements(frame.body):
            cond = s.child_by_field_name("condition") if s.type == "if_statement" else None
            if cond is None or not identifiers(cond) or not identifiers(cond) <= world_names:
                continue
            if not _ends(s.child_by_field_name("consequence"), program):
                continue
            for w in range(1, MAX_WORLD + 1):
                try:
                    if c_value(_condition_value(cond), dict.fromkeys(world_names, w)):
                        refused.add(w)
                except Untranslatable:
                    break
    accepted = [w for w in range(1, MAX_WORLD + 1) if w not in refused]
    return accepted if refused else []


def _condition_value(cond: Node) -> Node:
    inner = cond.child_by_field_name("value") if cond.type == "condition_clause" else cond
    return inner if inner is not None else cond


def _ends(block: Node | None, program: Program) -> bool:
    """Whether a guard's branch ends the program (return, throw, exit, MPI_Abort/MPI_Finalize)."""
    if block is None:
        return False
    return any(n.type in ("return_statement", "throw_statement") for n in walk(block)) or any(
        short_name(c)[1] in _EXIT_CALLS for c in program.calls_in(block))


__all__ = ["Constant", "INTEGER_TYPES", "LocalSize", "MAX_WORLD", "Values", "accepted_worlds", "file_constants",
           "fixed_names", "is_integer_type", "local_sizes", "local_values", "multiples", "product_factors",
           "type_text"]
