"""C size expressions -> Python expressions over the workload's parameters.

`cuco init` reads buffer sizes such as ``(size_t)kRows * kCols * sizeof(float)`` from a host program and writes
them into ``workload.py`` as ``p["kRows"] * p["kCols"]``. Only integer arithmetic on size constants, the world size
and literals is translated; anything else (a function call, a variable the plan does not know) is reported, so
the user fixes the plan instead of getting a shape that is silently wrong.
"""
from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable, Mapping

from cuco_kit.source.cuda_parse import Node, node_text, parse, walk

# sizeof(T) of the element types cuco init maps to workload dtypes (and a few common ones in size expressions).
SIZEOF = {"float": 4, "double": 8, "int": 4, "unsigned": 4, "int32_t": 4, "uint32_t": 4, "int64_t": 8,
          "uint64_t": 8, "size_t": 8, "long": 8, "half": 2, "__half": 2, "__nv_bfloat16": 2, "nv_bfloat16": 2,
          "char": 1, "uint8_t": 1, "int8_t": 1, "__nv_fp8_e4m3": 1}
_OPS = {"+": "+", "-": "-", "*": "*", "/": "//", "%": "%", "<<": "<<", ">>": ">>"}
WORLD = "world"  # the name plans use for the number of ranks


class Untranslatable(Exception):
    """The expression uses something other than sizes, the world size, literals and integer arithmetic."""


def _expression(text: str) -> Node:
    tree = parse(f"auto __cuco_x = {text};")
    for n in walk(tree.root_node):
        if n.type == "init_declarator":
            value = n.child_by_field_name("value")
            if value is not None:
                return value
    raise Untranslatable(f"{text!r} does not parse as an expression")


def _literal(text: str) -> int:
    t = re.sub(r"[uUlL]+$", "", text)
    try:
        return int(t, 0)
    except ValueError:
        raise Untranslatable(f"{text!r} is not an integer literal") from None


def translate(text: str, names: dict[str, str]) -> str:
    """`text` (C) as a Python expression. `names` maps C identifiers to Python text (a size to ``p["N"]``, the
    world variable to ``w``, a local to its own translated definition in parentheses)."""
    return _tr(_expression(text), names)


def _tr(n: Node, names: dict[str, str]) -> str:
    t = n.type
    if t == "number_literal":
        return str(_literal(node_text(n)))
    if t == "identifier":
        name = node_text(n)
        if name not in names:
            raise Untranslatable(f"'{name}' is not a size, the world size or a literal")
        return names[name]
    if t == "parenthesized_expression":
        inner = [c for c in n.children if c.is_named]
        if len(inner) != 1:
            raise Untranslatable(f"{node_text(n)!r}")
        return f"({_tr(inner[0], names)})"
    if t == "cast_expression":
        value = n.child_by_field_name("value")
        if value is None:
            raise Untranslatable(f"{node_text(n)!r}")
        return _tr(value, names)
    if t == "sizeof_expression":
        type_name = node_text(n)[len("sizeof"):].strip().strip("()").strip()
        if type_name in SIZEOF:
            return str(SIZEOF[type_name])
        raise Untranslatable(f"sizeof({type_name}) of a type cuco init does not know")
    if t == "binary_expression":
        left, right = n.child_by_field_name("left"), n.child_by_field_name("right")
        op = n.child_by_field_name("operator")
        op_text = node_text(op) if op is not None else ""
        if left is None or right is None or op_text not in _OPS:
            raise Untranslatable(f"operator {op_text!r} in {node_text(n)!r}")
        return f"{_tr(left, names)} {_OPS[op_text]} {_tr(right, names)}"
    raise Untranslatable(f"{node_text(n)!r} ({t})")


_C_OPS: dict[str, Callable[[int, int], int]] = {
    "+": operator.add, "-": operator.sub, "*": operator.mul, "<<": operator.lshift, ">>": operator.rshift,
    "&": operator.and_, "|": operator.or_, "^": operator.xor,
    "==": lambda a, b: int(a == b), "!=": lambda a, b: int(a != b), "<": lambda a, b: int(a < b),
    ">": lambda a, b: int(a > b), "<=": lambda a, b: int(a <= b), ">=": lambda a, b: int(a >= b),
    "&&": lambda a, b: int(bool(a) and bool(b)), "||": lambda a, b: int(bool(a) or bool(b)),
}


def c_value(node: Node, names: Mapping[str, int]) -> int:
    """The value of a C integer expression (a syntax node): literals, `names`, casts, sizeof of known types,
    arithmetic, comparisons, logic and `?:`. Untranslatable for anything else."""
    t = node.type
    if t == "number_literal":
        return _literal(node_text(node))
    if t in ("identifier", "type_identifier"):
        name = node_text(node)
        if name not in names:
            raise Untranslatable(f"'{name}' has no known value")
        return int(names[name])
    if t in ("parenthesized_expression", "preproc_arg"):
        inner = [c for c in node.children if c.is_named]
        if len(inner) != 1:
            raise Untranslatable(f"{node_text(node)!r}")
        return c_value(inner[0], names)
    if t == "cast_expression":
        value = node.child_by_field_name("value")
        if value is None:
            raise Untranslatable(f"{node_text(node)!r}")
        return c_value(value, names)
    if t == "sizeof_expression":
        return int(_tr(node, {}))
    if t == "unary_expression":
        arg = node.child_by_field_name("argument")
        op = node.child_by_field_name("operator")
        if arg is None or op is None or node_text(op) not in ("-", "+", "!", "~"):
            raise Untranslatable(f"{node_text(node)!r}")
        v = c_value(arg, names)
        return {"-": -v, "+": v, "!": int(not v), "~": ~v}[node_text(op)]
    if t == "conditional_expression":
        cond, yes, no = (node.child_by_field_name(f) for f in ("condition", "consequence", "alternative"))
        if cond is None or yes is None or no is None:
            raise Untranslatable(f"{node_text(node)!r}")
        return c_value(yes if c_value(cond, names) else no, names)
    if t == "binary_expression":
        left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
        op = node.child_by_field_name("operator")
        op_text = node_text(op) if op is not None else ""
        if left is None or right is None:
            raise Untranslatable(f"{node_text(node)!r}")
        a, b = c_value(left, names), c_value(right, names)
        if op_text in ("/", "%"):
            if b == 0:
                raise Untranslatable(f"{node_text(node)!r} divides by zero")
            q = abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1)  # C truncates toward zero
            return q if op_text == "/" else a - q * b
        if op_text not in _C_OPS:
            raise Untranslatable(f"operator {op_text!r} in {node_text(node)!r}")
        return _C_OPS[op_text](a, b)
    raise Untranslatable(f"{node_text(node)!r} ({t})")


def expression(text: str) -> Node:
    """`text` parsed as one C expression."""
    return _expression(text)


def element_count(bytes_text: str, ctype: str) -> str:
    """The element count of an allocation of `bytes_text` bytes of `ctype`, as C text: ``n * sizeof(float)`` ->
    ``n``; otherwise ``(bytes) / sizeof(T)``."""
    e = _expression(bytes_text)
    while e.type == "parenthesized_expression" and len([c for c in e.children if c.is_named]) == 1:
        e = next(c for c in e.children if c.is_named)
    if e.type == "binary_expression":
        op = e.child_by_field_name("operator")
        left, right = e.child_by_field_name("left"), e.child_by_field_name("right")
        if op is not None and node_text(op) == "*" and left is not None and right is not None:
            if right.type == "sizeof_expression":
                return node_text(left)
            if left.type == "sizeof_expression":
                return node_text(right)
    return f"({bytes_text}) / sizeof({ctype})"


_AST_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
            ast.Mod: operator.mod, ast.LShift: operator.lshift, ast.RShift: operator.rshift}


def evaluate(expr: str, params: dict[str, int], world: int) -> int:
    """The value of a translated expression: integer literals, ``p["NAME"]``, ``w`` and the operators above
    only (walked with `ast`, never `eval`)."""
    def ev(n: ast.AST) -> int:
        if isinstance(n, ast.Constant) and isinstance(n.value, int):
            return n.value
        if isinstance(n, ast.Name) and n.id == "w":
            return int(world)
        if isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name) and n.value.id == "p" and \
                isinstance(n.slice, ast.Constant) and str(n.slice.value) in params:
            return int(params[str(n.slice.value)])
        if isinstance(n, ast.BinOp) and type(n.op) in _AST_OPS:
            return int(_AST_OPS[type(n.op)](ev(n.left), ev(n.right)))
        raise Untranslatable(f"{ast.unparse(n)!r} in {expr!r}")

    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError:
        raise Untranslatable(f"{expr!r} is not an expression") from None
    try:
        return ev(tree.body)
    except ZeroDivisionError:
        raise Untranslatable(f"{expr!r} divides by zero") from None
