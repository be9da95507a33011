"""Applying proposals to a candidate: SEARCH/REPLACE edits or a full rewrite; diff data for viewers.

An edit proposal holds one or more edits in the form

    <<<<<<< SEARCH
    exact lines of the current code
    =======
    their replacement
    >>>>>>> REPLACE

applied in order, each to the result of the previous one. Each SEARCH text must occur exactly once and lie
inside one EVOLVE block (frozen code cannot change). A full rewrite is the last ```cuda fenced block of the
answer; the L0 check judges what it changed.
"""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from cuco_kit.errors import CucoError
from cuco_kit.source import markers

_EDIT_RE = re.compile(
    r"^<{7}[ \t]*SEARCH[ \t]*\r?\n(?P<search>.*?)^={7}[ \t]*\r?\n(?P<replace>.*?)^>{7}[ \t]*REPLACE[ \t]*\r?$",
    re.MULTILINE | re.DOTALL)
_FENCE_RE = re.compile(r"^[ \t]*```[ \t]*(?P<lang>[\w+#.-]*)[^\n]*\n(?P<body>.*?)^[ \t]*```[ \t]*$",
                       re.MULTILINE | re.DOTALL)
_CODE_LANGS = frozenset({"cuda", "cu", "cuh", "cpp", "c++", "cxx", "cc", "c", "h", "hpp"})


class PatchError(CucoError):
    """A proposal could not be applied; the message names the edit and why."""


@dataclass(frozen=True)
class Edit:
    search: str
    replace: str


def _drop_final_newline(text: str) -> str:
    if text.endswith("\r\n"):
        return text[:-2]
    return text[:-1] if text.endswith("\n") else text


def parse_edits(text: str) -> list[Edit]:
    """All SEARCH/REPLACE edits in `text`, in order (empty when there are none)."""
    return [Edit(_drop_final_newline(m.group("search")), _drop_final_newline(m.group("replace")))
            for m in _EDIT_RE.finditer(text)]


def _occurrences(code: str, needle: str) -> list[int]:
    out, pos = [], code.find(needle)
    while pos != -1:
        out.append(pos)
        pos = code.find(needle, pos + 1)
    return out


def _line_of(code: str, offset: int) -> int:
    return code.count("\n", 0, offset) + 1


def _squash(line: str) -> str:
    """A line with every run of whitespace made one space and the ends stripped."""
    return " ".join(line.split())


def relaxed_match(code: str, search: str) -> tuple[int, int] | None:
    """(start, end) offsets of the whole lines of ``code`` that equal ``search`` line by line when whitespace is
    ignored (indentation, tabs, trailing spaces, runs of spaces); None unless exactly one such place exists."""
    want = [_squash(line) for line in search.split("\n")]
    while want and not want[-1]:
        want.pop()
    if not any(want):
        return None
    lines = code.split("\n")
    squashed = [_squash(line) for line in lines]
    hits = [i for i in range(len(lines) - len(want) + 1) if squashed[i:i + len(want)] == want]
    if len(hits) != 1:
        return None
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line) + 1)
    i = hits[0]
    return offsets[i], offsets[i + len(want)] - 1


def nearest_lines(code: str, search: str, context: int = 2) -> str:
    """The lines of ``code`` closest to ``search`` (difflib over windows of as many lines), numbered, with
    ``context`` lines around: what a retry prompt shows so the model can copy the exact text."""
    lines = code.split("\n")
    n = max(1, len(search.strip("\n").split("\n")))
    want = "\n".join(_squash(x) for x in search.split("\n"))
    best, at = -1.0, 0
    for i in range(max(1, len(lines) - n + 1)):
        got = "\n".join(_squash(x) for x in lines[i:i + n])
        r = difflib.SequenceMatcher(a=want, b=got, autojunk=False).ratio()
        if r > best:
            best, at = r, i
    lo, hi = max(0, at - context), min(len(lines), at + n + context)
    return "\n".join(f"{k + 1:5d}| {lines[k]}" for k in range(lo, hi))


def _whitespace_hint(code: str, search: str) -> str:
    """Say where the SEARCH text would match if whitespace were ignored."""
    hit = relaxed_match(code, search)
    if hit is None:
        return ""
    return f"; it matches line {_line_of(code, hit[0])} if whitespace is ignored: copy the lines exactly"


def apply_edits(code: str, edits: list[Edit], *, relaxed: bool = False) -> str:
    """Apply edits in order. Raises PatchError naming the first edit (1-based) that fails and why. With
    ``relaxed``, a SEARCH text found nowhere exactly is matched once more ignoring whitespace (whole lines)."""
    for n, edit in enumerate(edits, 1):
        first = edit.search.strip().split("\n")[0][:60] if edit.search.strip() else ""
        if not edit.search.strip():
            raise PatchError(f"edit {n}: the SEARCH text is empty; quote the exact lines to replace")
        if markers.START_MARKER in edit.replace or markers.END_MARKER in edit.replace:
            raise PatchError(f"edit {n}: the REPLACE text contains an EVOLVE marker; markers are frozen")
        hits = _occurrences(code, edit.search)
        span = relaxed_match(code, edit.search) if relaxed and not hits else None
        if span is not None:
            hits, edit = [span[0]], Edit(code[span[0]:span[1]], edit.replace)
        if not hits:
            raise PatchError(f"edit {n}: SEARCH text not found (first line {first!r})"
                             f"{_whitespace_hint(code, edit.search)}")
        if len(hits) > 1:
            lines = ", ".join(str(_line_of(code, h)) for h in hits[:5])
            raise PatchError(f"edit {n}: SEARCH text matches {len(hits)} times (lines {lines}); add context lines "
                             "so it matches once")
        start, end = hits[0], hits[0] + len(edit.search)
        try:
            found = markers.blocks(code)
        except markers.MarkerError as exc:
            raise PatchError(f"edit {n}: the code's EVOLVE markers are malformed: {exc}") from None
        inside = next((b for b in found if b.start_offset <= start and end <= b.end_offset), None)
        if inside is None:
            raise PatchError(f"edit {n}: SEARCH text at line {_line_of(code, start)} is not inside one EVOLVE block; "
                             f"only code between the markers may change (blocks: "
                             f"{', '.join(b.name for b in found) or 'none'})")
        replace = edit.replace
        # A deletion also takes the line break after the deleted lines, so no blank line is left behind.
        if replace == "" and code[end:end + 1] == "\n" and end + 1 <= inside.end_offset:
            end += 1
        code = code[:start] + replace + code[end:]
    return code


def fenced_bodies(text: str) -> list[str]:
    """The bodies of every fenced block labelled cuda/cu/cpp/c, or unlabelled, in order."""
    return [m.group("body") for m in _FENCE_RE.finditer(text) if m.group("lang").lower() in _CODE_LANGS
            or not m.group("lang")]


def _is_marker(line: str) -> bool:
    return markers.START_MARKER in line or markers.END_MARKER in line


_HUNK_RE = re.compile(r"^@@ -\d+(?:,\d+)? \+\d+(?:,\d+)? @@.*$", re.MULTILINE)


def edits_from_unified_diff(text: str) -> list[Edit]:
    """SEARCH/REPLACE edits equivalent to the hunks of a unified diff in ``text`` (context and removed lines
    are the SEARCH text, context and added lines the REPLACE); empty when the text has no hunk."""
    out: list[Edit] = []
    heads = list(_HUNK_RE.finditer(text))
    for k, h in enumerate(heads):
        body = text[h.end() + 1: heads[k + 1].start() if k + 1 < len(heads) else len(text)]
        old: list[str] = []
        new: list[str] = []
        for line in body.split("\n"):
            if line.startswith("```") or line.startswith("--- ") or line.startswith("+++ "):
                break
            tag, rest = line[:1], line[1:]
            if tag in (" ", ""):
                old.append(rest)
                new.append(rest)
            elif tag == "-":
                old.append(rest)
            elif tag == "+":
                new.append(rest)
            elif tag != "\\":  # "\ No newline at end of file"
                break
        # Context that is blank or a marker line is trimmed from both ends: markers are frozen, and a SEARCH
        # text that quotes one would lie outside the block it edits.
        while old and new and old[-1] == new[-1] and (not old[-1].strip() or _is_marker(old[-1])):
            old.pop()
            new.pop()
        while old and new and old[0] == new[0] and (not old[0].strip() or _is_marker(old[0])):
            old.pop(0)
            new.pop(0)
        if any(x.strip() for x in old):
            out.append(Edit("\n".join(old), "\n".join(new)))
    return out


def extract_code_block(text: str) -> str | None:
    """The last fenced code block labelled cuda/cu/cpp/c (or, when none is labelled, the last unlabelled
    one) of an LLM answer; None when the answer has no fenced code."""
    labelled, bare = None, None
    for m in _FENCE_RE.finditer(text):
        lang = m.group("lang").lower()
        if lang in _CODE_LANGS:
            labelled = m.group("body")
        elif not lang:
            bare = m.group("body")
    return labelled if labelled is not None else bare


def apply_proposal(code: str, answer: str) -> str:
    """New code from an LLM or human answer: its SEARCH/REPLACE edits applied to `code`, or else the full
    rewrite in its last ```cuda block. Raises PatchError when it has neither or an edit fails."""
    edits = parse_edits(answer)
    if edits:
        return apply_edits(code, edits)
    if "<<<<<<< SEARCH" in answer:
        raise PatchError("the answer has a '<<<<<<< SEARCH' line but no complete edit; each edit needs "
                         "'=======' and '>>>>>>> REPLACE' lines")
    rewrite = extract_code_block(answer)
    if rewrite is None:
        raise PatchError("the answer has no SEARCH/REPLACE edit and no ```cuda code block")
    return rewrite


# ----------------------------------------------------------------------------------------------- diff data

@dataclass(frozen=True)
class DiffRow:
    """One row of a side-by-side diff. kind: equal, replace, delete, insert or skip (a run of `skipped` equal
    lines folded away). Line numbers are 1-based; None on the side that has no line."""

    kind: str
    old_no: int | None
    old_text: str | None
    new_no: int | None
    new_text: str | None
    skipped: int = 0


def diff_rows(old: str, new: str, context: int | None = None) -> list[DiffRow]:
    """Side-by-side rows (difflib line matching). With `context`, equal runs longer than 2*context+1 are folded
    into one "skip" row, keeping `context` lines around each change."""
    a, b = old.split("\n"), new.split("\n")
    rows: list[DiffRow] = []
    sm = difflib.SequenceMatcher(a=a, b=b, autojunk=False)
    opcodes = sm.get_opcodes()
    for idx, (tag, i1, i2, j1, j2) in enumerate(opcodes):
        if tag == "equal":
            pairs = [(i1 + k, j1 + k) for k in range(i2 - i1)]
            if context is not None:
                head = 0 if idx == 0 else context
                tail = 0 if idx == len(opcodes) - 1 else context
                if len(pairs) > head + tail + 1:
                    for i, j in pairs[:head]:
                        rows.append(DiffRow("equal", i + 1, a[i], j + 1, b[j]))
                    rows.append(DiffRow("skip", None, None, None, None, len(pairs) - head - tail))
                    pairs = pairs[len(pairs) - tail:] if tail else []
            for i, j in pairs:
                rows.append(DiffRow("equal", i + 1, a[i], j + 1, b[j]))
        elif tag == "replace":
            for k in range(max(i2 - i1, j2 - j1)):
                i, j = i1 + k, j1 + k
                rows.append(DiffRow("replace", i + 1 if i < i2 else None, a[i] if i < i2 else None,
                                    j + 1 if j < j2 else None, b[j] if j < j2 else None))
        elif tag == "delete":
            rows.extend(DiffRow("delete", i + 1, a[i], None, None) for i in range(i1, i2))
        else:
            rows.extend(DiffRow("insert", None, None, j + 1, b[j]) for j in range(j1, j2))
    return rows


def unified_diff(old: str, new: str, old_name: str = "parent", new_name: str = "candidate", n: int = 3) -> str:
    """A unified diff of two sources ("" when equal)."""
    lines = list(difflib.unified_diff(old.split("\n"), new.split("\n"), fromfile=old_name, tofile=new_name,
                                      n=n, lineterm=""))
    return "\n".join(lines) + "\n" if lines else ""
