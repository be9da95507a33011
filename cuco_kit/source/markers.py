"""EVOLVE blocks, the knob block and frozen-region hashing: the marker contract (docs/contracts.md, marker v2).

A candidate's mutable code sits between ``// EVOLVE-BLOCK-START <name>`` and ``// EVOLVE-BLOCK-END`` lines. A START
without a name (CUCo's and ShinkaEvolve's files) opens a block named by its place in the file, ``block_<n>`` for
the n-th block (`auto_named` lists them, `naming_note` says it in one line). Every byte outside the blocks (marker
lines included) is frozen: its sha256 must equal the parent's. The block
named ``knobs`` holds ``constexpr`` design-space knobs, each with its allowed values in a ``// knob:`` comment: a
written set ``{a, b, c}`` or an integer range (``range 64..1024 step 64``, ``pow2 1..16``), see docs/contracts.md.
Its ``// knob-rule:`` comment lines say which points are invalid; `cuco_kit.source.knob_rules` reads them.

This module reads and rewrites that structure and nothing else; it needs no parser, so the search and the GPU
image use it bare. What a candidate may do inside its blocks (the L0 policy) is `cuco_kit.source.static_check`.
"""
from __future__ import annotations

import hashlib
import itertools
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from cuco_kit.errors import BadInput

MARKER_VERSION = 2  # 2: knob rules (`// knob-rule:` lines), which a version-1 reader would skip as comments
KNOB_BLOCK = "knobs"
AUTO_PREFIX = "block_"  # unnamed blocks are block_1, block_2, ... in file order

START_MARKER = _START = "EVOLVE-BLOCK-START"
END_MARKER = _END = "EVOLVE-BLOCK-END"
_START_RE = re.compile(r"^[ \t]*//[ \t]*EVOLVE-BLOCK-START(?:[ \t]+(?P<name>\S+))?[ \t]*\r?$")
_END_RE = re.compile(r"^[ \t]*//[ \t]*EVOLVE-BLOCK-END[ \t]*\r?$")
_IDENT_RE = re.compile(r"^[A-Za-z_]\w*$")
_KNOB_RE = re.compile(
    r"^[ \t]*(?:static[ \t]+)?constexpr[ \t]+(?P<type>[^=;]+?)[ \t]+(?P<name>[A-Za-z_]\w*)[ \t]*="
    r"[ \t]*(?P<value>[^;]+?)[ \t]*;[ \t]*//[ \t]*knob:[ \t]*"
    r"(?:\{(?P<allowed>.*)\}|(?P<range>(?:range|pow2)\b[^{}]*?))[ \t]*\r?$")
# The two range forms, inclusive at both ends: `range LO..HI [step S]` and `pow2 LO..HI`.
_RANGE_RE = re.compile(r"^range[ \t]+(?P<low>-?\d+)[ \t]*\.\.[ \t]*(?P<high>-?\d+)(?:[ \t]+step[ \t]+(?P<step>\d+))?$")
_POW2_RE = re.compile(r"^pow2[ \t]+(?P<low>\d+)[ \t]*\.\.[ \t]*(?P<high>\d+)$")
MAX_RANGE_VALUES = 4096  # a range knob expands to its values; a wider one wants a coarser step
RANGE_CELL_BUCKETS = 3  # archive cells split a range knob into this many contiguous buckets (low, middle, high)
# A knob-looking line: what the contract calls a knob declaration (constexpr carrying `// knob:`).
_KNOB_LIKE_RE = re.compile(r"\bconstexpr\b.*//[ \t]*knob:")
_COMMENT_RE = re.compile(r"^[ \t]*(//.*|/\*.*\*/[ \t]*)?\r?$")


class MarkerError(BadInput):
    """EVOLVE markers are not well formed (unbalanced, nested, duplicated, not alone on their line)."""


@dataclass(frozen=True)
class Block:
    """One EVOLVE block. start_line/end_line: 1-based lines of its START and END markers. text: the code between
    the markers (each line with its newline). start_offset/end_offset: character offsets of that code in the
    file, so `code[start_offset:end_offset] == text`."""

    name: str
    start_line: int
    end_line: int
    text: str
    start_offset: int = 0
    end_offset: int = 0
    auto_named: bool = False  # its START had no name: `name` is block_<n>, n its place among the blocks


@dataclass(frozen=True)
class KnobRange:
    """An integer range knob's written range: kind "range" (low, low + step, ..., high) or "pow2" (low, 2 low,
    ..., high; both powers of two)."""

    kind: str
    low: int
    high: int
    step: int = 1

    def values(self) -> tuple[str, ...]:
        if self.kind == "pow2":
            out, v = [], self.low
            while v <= self.high:
                out.append(str(v))
                v *= 2
            return tuple(out)
        return tuple(str(v) for v in range(self.low, self.high + 1, self.step))

    @property
    def spec(self) -> str:
        """The range as written in a knob comment."""
        if self.kind == "pow2":
            return f"pow2 {self.low}..{self.high}"
        return f"range {self.low}..{self.high}" + (f" step {self.step}" if self.step != 1 else "")


@dataclass(frozen=True)
class Knob:
    """One knob of the knob block. value and allowed are source tokens (strings); line is 1-based. A range knob
    carries its `range` and `allowed` holds the range's values in increasing order."""

    name: str
    type: str
    value: str
    allowed: tuple[str, ...]
    line: int
    range: KnobRange | None = None

    @property
    def spec(self) -> str:
        """The allowed values as written: `{a, b}` or the range."""
        return self.range.spec if self.range else "{" + ", ".join(self.allowed) + "}"


# --------------------------------------------------------------------------------------------------- markers

def _line_offsets(lines: list[str]) -> list[int]:
    offsets, pos = [], 0
    for line in lines:
        offsets.append(pos)
        pos += len(line) + 1
    return offsets


def blocks(code: str) -> list[Block]:
    """The EVOLVE blocks of `code`, in file order; an unnamed block is named block_<n> (n: its place among the
    blocks). Raises MarkerError when the markers are not well formed."""
    lines = code.split("\n")
    offsets = _line_offsets(lines)
    found: list[Block] = []
    seen: dict[str, int] = {}
    open_name: str | None = None
    open_line = 0
    open_auto = False
    for i, line in enumerate(lines):
        no = i + 1
        if _START in line:
            m = _START_RE.match(line)
            if m is None:
                raise MarkerError(f"line {no}: '// {_START} <name>' must be alone on its line")
            name = m.group("name") or f"{AUTO_PREFIX}{len(found) + 1 + (open_name is not None)}"
            if not _IDENT_RE.match(name):
                raise MarkerError(f"line {no}: block name {name!r} is not an identifier")
            what = f"block {name!r}" + ("" if m.group("name") else " (unnamed)")
            if open_name is not None:
                raise MarkerError(f"line {no}: {what} starts inside block {open_name!r} (started at line "
                                  f"{open_line}); blocks do not nest, close it with '// {_END}' first")
            if name in seen and m.group("name"):
                raise MarkerError(f"line {no}: block name {name!r} is used twice (first at line {seen[name]})")
            if name in seen:
                raise MarkerError(f"line {no}: {what} would have the name of the block at line {seen[name]}; "
                                  "name one of them")
            seen[name] = no
            open_name, open_line, open_auto = name, no, not m.group("name")
        elif _END in line:
            if _END_RE.match(line) is None:
                raise MarkerError(f"line {no}: '// {_END}' must be alone on its line")
            if open_name is None:
                raise MarkerError(f"line {no}: {_END} without a matching {_START}")
            start = offsets[open_line] if open_line < len(lines) else len(code)
            end = offsets[i]
            found.append(Block(open_name, open_line, no, code[start:end], start, end, open_auto))
            open_name = None
    if open_name is not None:
        raise MarkerError(f"line {open_line}: block {open_name!r} is never closed (add '// {_END}')")
    return found


def auto_named(blks: list[Block]) -> list[Block]:
    """The blocks whose START had no name (named block_<n> by `blocks`)."""
    return [b for b in blks if b.auto_named]


def naming_note(blks: list[Block]) -> str | None:
    """One line saying which names the unnamed blocks got (None when every block is named)."""
    named = auto_named(blks)
    if not named:
        return None
    return "unnamed EVOLVE blocks named by their place in the file: " + ", ".join(
        f"{b.name} = lines {b.start_line}-{b.end_line}" for b in named)


def block_at(blks: list[Block], line: int) -> Block | None:
    """The block whose code holds 1-based `line` (marker lines belong to no block)."""
    for b in blks:
        if b.start_line < line < b.end_line:
            return b
    return None


def frozen_lines(code: str, blks: list[Block]) -> list[tuple[int, str]]:
    """(1-based line number, text) of every frozen line: outside blocks, marker lines included."""
    inside: set[int] = set()
    for b in blks:
        inside.update(range(b.start_line + 1, b.end_line))
    return [(i + 1, line) for i, line in enumerate(code.split("\n")) if i + 1 not in inside]


def frozen_text(code: str) -> str:
    """Everything outside the EVOLVE blocks, marker lines included, joined with newlines (byte-exact)."""
    return "\n".join(line for _, line in frozen_lines(code, blocks(code)))


def frozen_hash(code: str) -> str:
    """sha256 (hex) of `frozen_text(code)` in UTF-8."""
    return hashlib.sha256(frozen_text(code).encode("utf-8")).hexdigest()


def strip_markers(code: str) -> str:
    """`code` without its marker lines: the unannotated source, byte for byte."""
    lines = code.split("\n")
    marker_lines: set[int] = set()
    for b in blocks(code):
        marker_lines.update((b.start_line, b.end_line))
    kept = [line for i, line in enumerate(lines) if i + 1 not in marker_lines]
    # A marker on the last line without a newline took the previous line's "\r\n": drop its "\r" too.
    if len(lines) in marker_lines and kept and kept[-1].endswith("\r"):
        kept[-1] = kept[-1][:-1]
    return "\n".join(kept)


# ----------------------------------------------------------------------------------------------------- knobs

def is_knob_declaration(line: str) -> bool:
    """Whether `line` declares a knob (a constexpr carrying `// knob:`), well formed or not."""
    return bool(_KNOB_LIKE_RE.search(line))


def _split_allowed(text: str) -> tuple[str, ...]:
    """Split a knob's allowed set on top-level commas (commas inside (), [] or {} belong to a value)."""
    items: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            items.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    items.append("".join(cur).strip())
    out: list[str] = []
    for item in items:
        if item and item not in out:
            out.append(item)
    return tuple(out)


def parse_range(text: str) -> KnobRange:
    """A range knob's spec (`range LO..HI [step S]` or `pow2 LO..HI`) -> KnobRange. Raises BadInput naming what
    is wrong with it."""
    text = " ".join(text.split())
    m = _RANGE_RE.match(text)
    if m is not None:
        low, high, step = int(m.group("low")), int(m.group("high")), int(m.group("step") or 1)
        if step < 1 or high <= low or (high - low) % step:
            raise BadInput(f"range {text!r} needs LO < HI and HI - LO a multiple of a step >= 1 "
                           f"(e.g. 'range 64..1024 step 64')")
        r = KnobRange("range", low, high, step)
    else:
        m = _POW2_RE.match(text)
        if m is None:
            raise BadInput(f"range {text!r} is neither 'range LO..HI [step S]' nor 'pow2 LO..HI'")
        low, high = int(m.group("low")), int(m.group("high"))
        if low < 1 or high <= low or low & (low - 1) or high & (high - 1):
            raise BadInput(f"range {text!r} needs powers of two LO < HI (e.g. 'pow2 1..16')")
        r = KnobRange("pow2", low, high)
    n = (r.high - r.low) // r.step + 1 if r.kind == "range" else (r.high // r.low).bit_length()
    if n > MAX_RANGE_VALUES:
        raise BadInput(f"range {text!r} has {n} values, more than {MAX_RANGE_VALUES}; use a coarser step")
    return r


def scan_knobs(code: str, blks: list[Block]) -> tuple[list[Knob], list[str]]:
    """Knobs of the knob block of `code` (whose blocks are `blks`) and one problem line per violation of the knob
    contract; `knobs` raises on the first, the L0 check reports them all."""
    knobs: list[Knob] = []
    problems: list[str] = []
    kb = next((b for b in blks if b.name == KNOB_BLOCK), None)
    knob_lines = set(range(kb.start_line + 1, kb.end_line)) if kb else set()
    for i, line in enumerate(code.split("\n")):
        no = i + 1
        if no in knob_lines:
            m = _KNOB_RE.match(line)
            if m is None:
                if _COMMENT_RE.match(line):
                    continue
                what = "a constexpr without '// knob: {a, b, ...}'" if "constexpr" in line else "not a knob"
                problems.append(f"line {no}: {what} in the knob block: {line.strip()[:80]!r} (the knob block "
                                f"holds only 'constexpr <type> NAME = VALUE; // knob: {{a, b}}' lines (or "
                                f"'// knob: range LO..HI step S', '// knob: pow2 LO..HI'), "
                                f"'// knob-rule: CONDITION' lines and comments)")
                continue
            name, value = m.group("name"), m.group("value").strip()
            rng: KnobRange | None = None
            if m.group("range") is not None:
                try:
                    rng = parse_range(m.group("range"))
                except BadInput as exc:
                    problems.append(f"line {no}: knob {name}: {exc}")
                    continue
                allowed = rng.values()
            else:
                allowed = _split_allowed(m.group("allowed"))
            if not allowed:
                problems.append(f"line {no}: knob {name} has an empty allowed set")
            elif value not in allowed:
                spec = rng.spec if rng else "{" + ", ".join(allowed) + "}"
                problems.append(f"line {no}: knob {name} = {value} is not in its allowed set {spec}")
            if any(k.name == name for k in knobs):
                problems.append(f"line {no}: knob {name} is declared twice in the knob block")
                continue
            knobs.append(Knob(name, " ".join(m.group("type").split()), value, allowed, no, rng))
        elif blks and is_knob_declaration(line):
            # Only an annotated file (one with EVOLVE blocks) has a knob block to belong to; in a fast-path stage
            # output, '// knob:' lines are what the annotate step gathers into it.
            m = _KNOB_RE.match(line)
            name = m.group("name") if m else line.strip()[:60]
            owner = block_at(blks, no)
            where = f"block {owner.name!r}" if owner else "frozen code"
            problems.append(f"line {no}: knob declaration {name} outside the knob block (in {where}); knobs "
                            f"belong in '// {_START} {KNOB_BLOCK}'")
    return knobs, problems


def knobs(code: str) -> list[Knob]:
    """The knobs of the knob block. Raises BadInput (MarkerError for markers) when the contract is broken."""
    found, problems = scan_knobs(code, blocks(code))
    if problems:
        raise BadInput(problems[0])
    return found


def knob_space(code: str, names: Iterable[str] | None = None) -> list[dict[str, str]]:
    """Every combination of the knob block's allowed values (of the named knobs only, when `names` is given) as
    {name: value}: knobs in file order, each over its allowed set in written order, the last knob varying
    fastest (a range knob over its values in increasing order). No knobs: one empty combination. Raises BadInput
    like `knobs`, or naming an unknown knob. With range knobs the space can be large: `space_size` counts it."""
    found = knobs(code)
    if names is not None:
        wanted = set(names)
        unknown = sorted(wanted - {k.name for k in found})
        if unknown:
            raise BadInput(f"unknown knob(s) {', '.join(unknown)}; knobs: "
                           f"{', '.join(k.name for k in found) or '(none)'}")
        found = [k for k in found if k.name in wanted]
    return [dict(zip((k.name for k in found), combo)) for combo in itertools.product(*(k.allowed for k in found))]


def space_size(code: str) -> int:
    """How many points the knob block's space has (the product of every knob's number of values)."""
    return math.prod(len(k.allowed) for k in knobs(code))


def _format_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value).strip()


def set_knobs(code: str, values: Mapping[str, object]) -> str:
    """`code` with the named knobs set to new values (each must be in the knob's allowed set); every other byte
    is kept. Raises BadInput naming an unknown knob or a value outside its set."""
    by_name = {k.name: k for k in knobs(code)}
    lines = code.split("\n")
    for name, raw in values.items():
        knob = by_name.get(name)
        if knob is None:
            raise BadInput(f"unknown knob {name!r}; knobs: {', '.join(sorted(by_name)) or '(none)'}")
        value = _format_value(raw)
        if value not in knob.allowed:
            raise BadInput(f"knob {name} = {value} is not in its allowed set {knob.spec}")
        line = lines[knob.line - 1]
        m = _KNOB_RE.match(line)
        assert m is not None  # knobs() matched this very line
        lines[knob.line - 1] = line[:m.start("value")] + value + line[m.end("value"):]
    return "\n".join(lines)


def cell_value(knob: Knob) -> str:
    """A knob's value as the archive sees it: a written set's value itself; a range knob's bucket, one of
    RANGE_CELL_BUCKETS contiguous runs of its values written `first..last` (so 16 thread counts make 3 cells,
    not 16)."""
    if knob.range is None:
        return knob.value
    n = len(knob.allowed)
    buckets = min(RANGE_CELL_BUCKETS, n)
    mine = knob.allowed.index(knob.value) * buckets // n
    run = [v for i, v in enumerate(knob.allowed) if i * buckets // n == mine]
    return run[0] if len(run) == 1 else f"{run[0]}..{run[-1]}"


def cell_values(found: Iterable[Knob]) -> dict[str, str]:
    """{name: cell_value} of every knob."""
    return {k.name: cell_value(k) for k in found}


def design_cell(knob_values: Iterable[Knob] | Mapping[str, object]) -> str:
    """A stable archive key from knob values: every knob, sorted by name, as `name=value` joined with `|`
    ("-" when there are none); Knob objects contribute their `cell_value` (range knobs bucketed), a mapping its
    values as given. All knobs count as structural: the contract makes structural variants (placement, sync
    scope, issuer, chunking) knobs, and telling them apart by name would be guesswork."""
    if isinstance(knob_values, Mapping):
        pairs = {str(k): _format_value(v) for k, v in knob_values.items()}
    else:
        pairs = cell_values(knob_values)
    return "|".join(f"{k}={pairs[k]}" for k in sorted(pairs)) or "-"


def plain_knob(text: str) -> str:
    """A knob name or value as a person says it: 'Placement::kTwoStream' -> 'TwoStream', 'kChunks' -> 'chunks'."""
    if "::" in text:
        tail = text.rsplit("::", 1)[-1]
        return tail[1:] if tail.startswith("k") and tail[1:2].isupper() else tail
    return text[1].lower() + text[2:] if text.startswith("k") and text[1:2].isupper() else text
