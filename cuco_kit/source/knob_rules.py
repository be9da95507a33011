"""Knob rules: the constraints that make a point of the knob block invalid, written in the knob block itself
(docs/contracts.md, "Knob rules"; marker version 2).

A rule is a comment line of the knob block:

    // knob-rule: kAttnWarps * 16 * kAttnMTiles64 <= 2 * kAttnBlockK64

an expression over the block's knobs and integer literals with ``+ - * / % ( )``, the comparisons ``== != < <=
> >=``, ``and``, ``or`` and ``not``. A knob stands for its value: an integer, ``true`` / ``false`` as 1 / 0, or an
enumerator (``Issuer::kCta``), which may only be compared with ``==`` / ``!=`` to one of that knob's own values.
``/`` and ``%`` are C++'s (the quotient truncates toward zero). A point of the knob block is valid when every
rule holds; a rule states a limit that would otherwise surface as a failed build or launch (a static_assert of the
kernel, shared memory per block, threads per block), so the search never proposes such a point and L0 refuses it
with the rule's text.

Rules are parsed with Python's ``ast`` and only the node types above are accepted, each checked against the knob
block (names, integer or enumerator values); evaluation walks that tree, so no text is ever executed. Counting
the valid points enumerates only knobs that share a rule (connected through rules), each group at most
`ENUMERATE_LIMIT` points; knobs under no rule multiply in as they are.
"""
from __future__ import annotations

import ast
import itertools
import math
import random
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from cuco_kit.errors import BadInput
from cuco_kit.source import markers

RULE_TAG = "knob-rule:"
_RULE_RE = re.compile(r"^[ \t]*//[ \t]*knob-rule:[ \t]*(?P<expr>.*?)[ \t]*\r?$")
_RULE_LIKE_RE = re.compile(r"//[ \t]*knob-rule\b")
# A qualified C++ name (an enumerator such as Issuer::kCta): Python cannot parse `::`, so each becomes a
# placeholder name before parsing and a symbol of the rule after.
_QUALIFIED_RE = re.compile(r"(?<![\w:])[A-Za-z_]\w*(?:::[A-Za-z_]\w*)+")
_PLACEHOLDER = "__knob_symbol_{}__"
_INT_RE = re.compile(r"^[+-]?(?:0[xX][0-9a-fA-F]+|\d+)(?:[uU](?:ll|LL|l|L)?|(?:ll|LL|l|L)[uU]?)?$")
_SYMBOL_RE = re.compile(r"^(?:::)?[A-Za-z_]\w*(?:::[A-Za-z_]\w*)*$")
ENUMERATE_LIMIT = 2_000_000  # points of one group of rule-linked knobs counted one by one at most
GRAMMAR = ("knob names, integer literals, true / false, enumerators (Name::kValue, compared with == or !=), "
           "+ - * / % ( ), == != < <= > >=, and / or / not")

_ARITH = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.Mod: "%"}
_COMPARE = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">="}
# What a refused construct is called in the one-line message.
_NAMED = {ast.Pow: "'**'", ast.FloorDiv: "'//'", ast.BitAnd: "'&'", ast.BitOr: "'|'", ast.BitXor: "'^'",
          ast.LShift: "'<<'", ast.RShift: "'>>'", ast.Invert: "'~'", ast.MatMult: "'@'", ast.Call: "a call",
          ast.Attribute: "an attribute", ast.Subscript: "an index", ast.IfExp: "'x if c else y'",
          ast.Lambda: "a lambda", ast.In: "'in'", ast.NotIn: "'not in'", ast.Is: "'is'", ast.IsNot: "'is not'",
          ast.Tuple: "a tuple", ast.List: "a list", ast.Dict: "a dict", ast.Set: "a set",
          ast.NamedExpr: "':='", ast.Starred: "'*'"}


@dataclass(frozen=True)
class Rule:
    """One rule of the knob block: its expression as written (whitespace collapsed), its 1-based line and the
    knobs it reads, in order of first use. `holds` evaluates it at a point."""

    text: str
    line: int
    names: tuple[str, ...]
    _tree: ast.expr = field(repr=False, compare=False)
    _symbols: Mapping[str, str] = field(repr=False, compare=False)

    def holds(self, values: Mapping[str, object]) -> bool:
        """Whether the rule holds where each knob it reads has the value in `values` (source tokens or ints).
        A division by zero does not hold. Raises BadInput naming a knob without a value."""
        env: dict[str, int | str] = {}
        for n in self.names:
            if n not in values:
                raise BadInput(f"knob rule {self.text!r} reads {n}, which has no value here")
            env[n] = value_of(_token(values[n]))
        try:
            return bool(_eval(self._tree, env, self._symbols))
        except ZeroDivisionError:
            return False

    @property
    def label(self) -> str:
        """The rule as one names it: its text and line."""
        return f"knob rule '{self.text}' (line {self.line})"

    def describe(self, values: Mapping[str, object]) -> str:
        """One line: the rule, where it is written, and the values it does not hold at."""
        at = ", ".join(f"{n} = {_token(values[n])}" for n in self.names if n in values)
        return f"line {self.line}: knob rule '{self.text}' does not hold" + (f" at {at}" if at else "")


@dataclass(frozen=True)
class SpaceCount:
    """How many points the knob block spans (`total`, the product of the knobs' values) and how many of them keep
    every rule (`valid`; None when a group of rule-linked knobs is too large to count, `note` says which)."""

    total: int
    valid: int | None
    note: str = ""


# --------------------------------------------------------------------------------------------------- values

def _token(raw: object) -> str:
    if isinstance(raw, bool):
        return "true" if raw else "false"
    return str(raw).strip()


def value_of(token: str) -> int | str:
    """A knob value as a rule sees it: an integer literal (C suffixes and hex allowed) or true / false as an
    int, anything else as the token itself (an enumerator)."""
    if token in ("true", "false"):
        return int(token == "true")
    if _INT_RE.match(token):
        digits = token.rstrip("uUlL")
        body = digits.lstrip("+-")
        base = 16 if body[:2] in ("0x", "0X") else 8 if len(body) > 1 and body[0] == "0" else 10  # C++'s octal
        try:
            return int(digits, base)
        except ValueError:  # 08, 09: not a C++ literal either
            return token
    return token


def _kind(knob: markers.Knob) -> str:
    """'int' when every value of the knob is an integer (or true / false), 'symbol' when every one is an
    enumerator or other name, else 'other' (a rule may not read it)."""
    values = [value_of(v) for v in knob.allowed]
    if all(isinstance(v, int) for v in values):
        return "int"
    if all(isinstance(v, str) and _SYMBOL_RE.match(v) for v in values):
        return "symbol"
    return "other"


# -------------------------------------------------------------------------------------------------- parsing

class _Checker:
    """Validates a parsed rule node by node against the knob block and returns each node's type."""

    def __init__(self, text: str, knobs: Mapping[str, markers.Knob], symbols: Mapping[str, str]) -> None:
        self.text, self.knobs, self.symbols = text, knobs, symbols
        self.names: list[str] = []

    def show(self, node: ast.expr) -> str:
        """A node as written (the enumerators' placeholders back to their names)."""
        text = ast.unparse(node)
        for name, symbol in self.symbols.items():
            text = text.replace(name, symbol)
        return text

    def fail(self, what: str) -> BadInput:
        return BadInput(f"knob rule {self.text!r}: {what}")

    def refuse(self, node: ast.AST) -> BadInput:
        what = _NAMED.get(type(node), f"'{type(node).__name__}'")
        return self.fail(f"{what} is not allowed; a rule uses {GRAMMAR}")

    def condition(self, node: ast.expr) -> None:
        self.check(node)
        if isinstance(node, (ast.Compare, ast.BoolOp)) or (isinstance(node, ast.UnaryOp) and
                                                            isinstance(node.op, ast.Not)):
            return
        if isinstance(node, ast.Name) and node.id in self.knobs and all(
                v in ("true", "false") for v in self.knobs[node.id].allowed):
            return  # a bool knob alone is a condition
        raise self.fail("a rule is a condition (a comparison, or comparisons joined with and / or), not a value")

    def check(self, node: ast.expr) -> str:
        if isinstance(node, ast.BoolOp):
            for v in node.values:
                self.want_int(v, "and / or")
            return "int"
        if isinstance(node, ast.UnaryOp):
            if not isinstance(node.op, (ast.Not, ast.USub, ast.UAdd)):
                raise self.refuse(node.op)
            self.want_int(node.operand, "not" if isinstance(node.op, ast.Not) else "a sign")
            return "int"
        if isinstance(node, ast.BinOp):
            if type(node.op) not in _ARITH:
                raise self.refuse(node.op)
            self.want_int(node.left, f"'{_ARITH[type(node.op)]}'")
            self.want_int(node.right, f"'{_ARITH[type(node.op)]}'")
            return "int"
        if isinstance(node, ast.Compare):
            for op in node.ops:
                if type(op) not in _COMPARE:
                    raise self.refuse(op)
            operands = [node.left, *node.comparators]
            kinds = [self.check(o) for o in operands]
            for op, (a, b), (ka, kb) in zip(node.ops, itertools.pairwise(operands), itertools.pairwise(kinds)):
                if ka == kb == "int":
                    continue
                if "int" in (ka, kb):
                    raise self.fail(f"compares an integer with an enumerator ({self.show(a)} "
                                    f"{_COMPARE[type(op)]} {self.show(b)})")
                if not isinstance(op, (ast.Eq, ast.NotEq)):
                    raise self.fail(f"enumerators compare with == and != only, not {_COMPARE[type(op)]}")
                self.same_enum(a, b)
            return "int"
        if isinstance(node, ast.Name):
            if node.id in self.symbols:
                return "symbol"
            if node.id in ("true", "false"):
                return "int"
            knob = self.knobs.get(node.id)
            if knob is None:
                raise self.fail(f"{node.id} is not a knob of the knob block (knobs: "
                                f"{', '.join(self.knobs) or '(none)'})")
            kind = _kind(knob)
            if kind == "other":
                raise self.fail(f"knob {node.id}'s values {knob.spec} are neither integers nor enumerators")
            if node.id not in self.names:
                self.names.append(node.id)
            return kind
        if isinstance(node, ast.Constant):
            if isinstance(node.value, bool) or not isinstance(node.value, int):
                raise self.fail(f"{node.value!r} is not an integer literal; a rule uses {GRAMMAR}")
            return "int"
        raise self.refuse(node)

    def want_int(self, node: ast.expr, where: str) -> None:
        if self.check(node) != "int":
            raise self.fail(f"{self.show(node)} is an enumerator; {where} takes integers")

    def same_enum(self, a: ast.expr, b: ast.expr) -> None:
        """An enumerator compared with a knob must be one of that knob's values (a misspelt one never matches)."""
        for knob_side, other in ((a, b), (b, a)):
            if isinstance(knob_side, ast.Name) and knob_side.id in self.knobs:
                allowed = self.knobs[knob_side.id].allowed
                if isinstance(other, ast.Name) and other.id in self.symbols and self.symbols[other.id] not in allowed:
                    raise self.fail(f"{self.symbols[other.id]} is not a value of {knob_side.id} "
                                    f"({self.knobs[knob_side.id].spec})")
                return
        raise self.fail(f"compares two enumerators ({self.show(a)}, {self.show(b)}) without a knob")


def parse_rule(text: str, knobs: Iterable[markers.Knob], line: int = 0) -> Rule:
    """One rule's expression (what follows `// knob-rule:`) checked against `knobs`. Raises BadInput with one line
    naming the rule and what is wrong with it."""
    text = " ".join(text.split())
    by_name = {k.name: k for k in knobs}
    if not text:
        raise BadInput("knob rule is empty: write a condition after 'knob-rule:', e.g. 'kThreads % 32 == 0'")
    for c_op, ours in (("&&", "and"), ("||", "or")):
        if c_op in text:
            raise BadInput(f"knob rule {text!r}: write '{ours}' instead of '{c_op}'")
    if re.search(r"!(?!=)", text):
        raise BadInput(f"knob rule {text!r}: write 'not' instead of '!'")
    if "__knob_symbol_" in text:
        raise BadInput(f"knob rule {text!r}: names starting with __knob_symbol_ are reserved")
    symbols: dict[str, str] = {}

    def placeholder(m: re.Match[str]) -> str:
        name = _PLACEHOLDER.format(len(symbols))
        symbols[name] = m.group(0)
        return name

    try:
        tree = ast.parse(_QUALIFIED_RE.sub(placeholder, text), mode="eval")
    except SyntaxError as exc:
        raise BadInput(f"knob rule {text!r}: not an expression ({exc.msg}); a rule uses {GRAMMAR}") from None
    checker = _Checker(text, by_name, symbols)
    checker.condition(tree.body)
    if not checker.names:
        raise BadInput(f"knob rule {text!r} reads no knob: it holds everywhere or nowhere")
    return Rule(text, line, tuple(checker.names), tree.body, dict(symbols))


def is_rule_line(line: str) -> bool:
    """Whether `line` is meant as a knob rule (a comment carrying `knob-rule`), well formed or not."""
    return bool(_RULE_LIKE_RE.search(line))


def scan_rules(code: str, blks: Sequence[markers.Block], knobs: Iterable[markers.Knob]) -> tuple[list[Rule], list[str]]:
    """The rules of the knob block of `code` (whose blocks are `blks` and knobs `knobs`) and one problem line per
    malformed rule or rule outside the knob block; `rules` raises on the first, the L0 check reports them all."""
    knobs = list(knobs)
    found: list[Rule] = []
    problems: list[str] = []
    kb = next((b for b in blks if b.name == markers.KNOB_BLOCK), None)
    inside = set(range(kb.start_line + 1, kb.end_line)) if kb else set()
    for i, line in enumerate(code.split("\n")):
        no = i + 1
        if not is_rule_line(line):
            continue
        if no not in inside:
            if blks:
                owner = markers.block_at(list(blks), no)
                where = f"block {owner.name!r}" if owner else "frozen code"
                problems.append(f"line {no}: knob rule outside the knob block (in {where}); rules belong in "
                                f"'// {markers.START_MARKER} {markers.KNOB_BLOCK}'")
            continue
        m = _RULE_RE.match(line)
        if m is None:
            problems.append(f"line {no}: a knob rule is a comment line of its own: '// {RULE_TAG} CONDITION' "
                            f"(found {line.strip()[:80]!r})")
            continue
        try:
            found.append(parse_rule(m.group("expr"), knobs, no))
        except BadInput as exc:
            problems.append(f"line {no}: {exc}")
    return found, problems


def rules(code: str) -> list[Rule]:
    """The rules of `code`'s knob block. Raises BadInput (MarkerError for markers) on a broken knob block or the
    first malformed rule."""
    blks = markers.blocks(code)
    found, problems = scan_rules(code, blks, markers.knobs(code))
    if problems:
        raise BadInput(problems[0])
    return found


# -------------------------------------------------------------------------------------------------- checking

def violated(found: Iterable[Rule], values: Mapping[str, object]) -> list[str]:
    """One line per rule of `found` that does not hold at `values` (empty: the point is valid)."""
    return [r.describe(values) for r in found if not r.holds(values)]


def is_valid(found: Iterable[Rule], values: Mapping[str, object]) -> bool:
    return all(r.holds(values) for r in found)


def first_broken(found: Iterable[Rule], values: Mapping[str, object]) -> Rule | None:
    """The first rule of `found` that does not hold at `values`; None at a valid point."""
    return next((r for r in found if not r.holds(values)), None)


def rule_set_problems(mine: Sequence[Rule], theirs: Sequence[Rule]) -> list[str]:
    """A candidate keeps its parent's rules: one line per rule the parent had and the candidate dropped or
    changed, and per rule the candidate added (rules compare by their text, whitespace aside)."""
    out: list[str] = []
    left = [r.text for r in mine]
    for p in theirs:
        if p.text in left:
            left.remove(p.text)
        else:
            out.append(f"parent line {p.line}: knob rule '{p.text}' was dropped or changed; only knob values may "
                       "change")
    for r in mine:
        if r.text in left:
            left.remove(r.text)
            out.append(f"line {r.line}: knob rule '{r.text}' is new; the rules are the parent's and only knob "
                       "values may change")
    return out


def _c_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)  # ZeroDivisionError for b == 0: the rule does not hold
    return q if (a >= 0) == (b >= 0) else -q


def _eval(node: ast.expr, env: Mapping[str, int | str], symbols: Mapping[str, str]) -> int | str:
    """The value of a node `parse_rule` accepted (so every type below is one it checked)."""
    if isinstance(node, ast.BoolOp):
        if isinstance(node.op, ast.And):
            return int(all(_eval(v, env, symbols) for v in node.values))
        return int(any(_eval(v, env, symbols) for v in node.values))
    if isinstance(node, ast.UnaryOp):
        x = _eval(node.operand, env, symbols)
        assert isinstance(x, int)
        return int(not x) if isinstance(node.op, ast.Not) else -x if isinstance(node.op, ast.USub) else x
    if isinstance(node, ast.BinOp):
        a, b = _eval(node.left, env, symbols), _eval(node.right, env, symbols)
        assert isinstance(a, int) and isinstance(b, int)
        if isinstance(node.op, ast.Add):
            return a + b
        if isinstance(node.op, ast.Sub):
            return a - b
        if isinstance(node.op, ast.Mult):
            return a * b
        if isinstance(node.op, ast.Div):
            return _c_div(a, b)
        return a - _c_div(a, b) * b  # C++'s %: the sign of the dividend
    if isinstance(node, ast.Compare):
        left = _eval(node.left, env, symbols)
        for op, right_node in zip(node.ops, node.comparators):
            right = _eval(right_node, env, symbols)
            if isinstance(op, ast.Eq):
                ok = left == right
            elif isinstance(op, ast.NotEq):
                ok = left != right
            else:
                assert isinstance(left, int) and isinstance(right, int)
                ok = (left < right if isinstance(op, ast.Lt) else left <= right if isinstance(op, ast.LtE)
                      else left > right if isinstance(op, ast.Gt) else left >= right)
            if not ok:
                return 0
            left = right
        return 1
    if isinstance(node, ast.Name):
        if node.id in symbols:
            return symbols[node.id]
        if node.id in ("true", "false"):
            return int(node.id == "true")
        return env[node.id]
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    raise AssertionError(f"unchecked node {type(node).__name__}")  # parse_rule refuses every other node


# -------------------------------------------------------------------------------------------------- the space

def _groups(knobs: Sequence[markers.Knob], found: Sequence[Rule]) -> list[tuple[list[str], list[Rule]]]:
    """Knobs linked through shared rules, each group with its rules, knobs in file order; knobs under no rule
    are left out."""
    parent = {k.name: k.name for k in knobs}

    def root(n: str) -> str:
        while parent[n] != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    for r in found:
        for a, b in itertools.pairwise(r.names):
            parent[root(a)] = root(b)
    order = [k.name for k in knobs]
    groups: dict[str, tuple[list[str], list[Rule]]] = {}
    for r in found:
        if r.names:
            groups.setdefault(root(r.names[0]), ([], []))[1].append(r)
    for n in order:
        if root(n) in groups:
            groups[root(n)][0].append(n)
    return list(groups.values())


def _walk(names: Sequence[str], allowed: Mapping[str, Sequence[str]], found: Sequence[Rule],
          reverse: bool = False) -> Iterable[dict[str, str]]:
    """Every assignment of `names` that keeps `found` (rules over these names only), depth first in the order of
    `names`, each knob over its values in order (reversed: from the last value); a rule is checked as soon as
    its last knob has a value, so a broken prefix is never extended."""
    due: dict[int, list[Rule]] = {}
    for r in found:
        due.setdefault(max(names.index(n) for n in r.names), []).append(r)
    values: dict[str, str] = {}

    def go(i: int) -> Iterable[dict[str, str]]:
        if i == len(names):
            yield dict(values)
            return
        for v in (reversed(allowed[names[i]]) if reverse else allowed[names[i]]):
            values[names[i]] = v
            if all(r.holds(values) for r in due.get(i, ())):
                yield from go(i + 1)
        values.pop(names[i], None)

    return go(0)


def count_points(knobs: Sequence[markers.Knob], found: Sequence[Rule],
                 limit: int = ENUMERATE_LIMIT) -> SpaceCount:
    """Total and valid points of a knob block: knobs under no rule multiply in; each group of rule-linked knobs
    of at most `limit` points is walked point by point (otherwise `valid` is None and `note` names the group)."""
    allowed = {k.name: k.allowed for k in knobs}
    total = math.prod(len(v) for v in allowed.values())
    grouped = _groups(knobs, found)
    linked = {n for names, _ in grouped for n in names}
    valid = math.prod(len(allowed[n]) for n in allowed if n not in linked)
    for names, rs in grouped:
        size = math.prod(len(allowed[n]) for n in names)
        if size > limit:
            return SpaceCount(total, None, f"knobs {', '.join(names)} share rules over {size:,} points, more than "
                                           f"{limit:,} to count one by one")
        valid *= sum(1 for _ in _walk(names, allowed, rs))
    return SpaceCount(total, valid)


def count_valid(code: str, limit: int = ENUMERATE_LIMIT) -> SpaceCount:
    """`count_points` of `code`'s knob block. Raises BadInput like `rules`."""
    return count_points(markers.knobs(code), rules(code), limit)


def corner(knobs: Sequence[markers.Knob], found: Sequence[Rule], largest: bool = False) -> dict[str, str] | None:
    """The valid point with the smallest values (each knob's first value, in file order, as far as the rules
    allow: the lexicographically first valid point), or with `largest` the largest; None when no point is valid.
    Walks each group of rule-linked knobs only as far as its first valid point."""
    allowed = {k.name: k.allowed for k in knobs}
    point = {n: (v[-1] if largest else v[0]) for n, v in allowed.items()}
    for names, rs in _groups(knobs, found):
        first = next(iter(_walk(names, allowed, rs, reverse=largest)), None)
        if first is None:
            return None
        point.update(first)
    return point


def sample(knobs: Sequence[markers.Knob], found: Sequence[Rule], rng: random.Random,
           tries: int = 1000) -> dict[str, str] | None:
    """A uniformly random valid point (drawn, and drawn again while a rule fails), None after `tries` draws."""
    for _ in range(tries):
        point = {k.name: rng.choice(list(k.allowed)) for k in knobs}
        if is_valid(found, point):
            return point
    return None
