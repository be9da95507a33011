"""Block-wise answers: a model returns EVOLVE blocks by name, and the kit splices them into the parent's frozen text.

A full rewrite or a crossover asks for the EVOLVE blocks only. The answer may quote them in one or several code
fences, with prose around, or send the whole file back: every ``// EVOLVE-BLOCK-START <name>`` ...
``// EVOLVE-BLOCK-END`` pair found in its code is taken as the new text of the parent's block of that name, and
every other byte comes from the parent, so frozen code cannot drift (a whole-file answer whose frozen text differs
is noted, and the parent's frozen text kept). Blocks the answer leaves out stay as they are.

A block answered under a name it does not match (the code of block "tuning" sent as "knobs", say) is refused with
a reason that names the block it resembles, so one retry can put it right. ``answer_token_cap`` sizes
``max_tokens`` from what is asked for.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass

from cuco_kit.errors import CucoError
from cuco_kit.source import markers, patch

# Characters per token assumed when sizing an answer: code tokenises at about 3.5 to 4 characters a token, so 3
# leaves room; the fixed part covers the NAME / RATIONALE / TAGS header and some prose.
CHARS_PER_TOKEN = 3.0
ANSWER_OVERHEAD_TOKENS = 1024
MIN_ANSWER_TOKENS = 2048
# A block answered under name A is taken for block B when it is at least this similar to B and A's own
# similarity is less than half of that.
WRONG_BLOCK_SIMILARITY = 0.6


class BlockAnswerError(CucoError):
    """A block-wise answer could not be spliced; the message says why and what to send instead."""


@dataclass(frozen=True)
class BlockSplice:
    """The spliced program, the blocks it took from the answer, and notes (frozen text of the answer dropped)."""

    code: str
    blocks: tuple[str, ...]
    notes: tuple[str, ...] = ()


def has_blocks(answer: str) -> bool:
    """Whether the answer quotes at least one EVOLVE block (start marker) in its text."""
    return markers.START_MARKER in answer


def _code_of(answer: str) -> str:
    """The answer's code: its fenced blocks joined (several fences allowed), or the whole text without fences."""
    bodies = patch.fenced_bodies(answer)
    return "\n".join(bodies) if bodies else answer


def answer_blocks(answer: str) -> list[markers.Block]:
    """The EVOLVE blocks quoted in an answer, in order. Raises BlockAnswerError for unbalanced markers."""
    try:
        return markers.blocks(_code_of(answer))
    except markers.MarkerError as exc:
        raise BlockAnswerError(f"the EVOLVE markers in the answer are malformed: {exc}; send each block between its "
                               "own START and END marker lines") from None


def _similarity(a: str, b: str) -> float:
    return difflib.SequenceMatcher(a=a.split("\n"), b=b.split("\n"), autojunk=False).ratio()


def _misplaced(name: str, text: str, parent: dict[str, str], answered: set[str]) -> str | None:
    """The parent block that ``text`` (answered as ``name``) really is, when it clearly resembles another."""
    own = _similarity(text, parent[name])
    others = [(_similarity(text, t), n) for n, t in parent.items() if n != name and n not in answered]
    if not others:
        return None
    best, other = max(others)
    if best >= WRONG_BLOCK_SIMILARITY and own < best / 2:
        return other
    return None


def splice(parent_code: str, answer: str) -> BlockSplice:
    """The parent with the answer's blocks put in place of the parent's blocks of the same names."""
    try:
        pblocks = markers.blocks(parent_code)
    except markers.MarkerError as exc:
        raise BlockAnswerError(f"the parent's EVOLVE markers are malformed: {exc}") from None
    got = answer_blocks(answer)
    if not got:
        raise BlockAnswerError("the answer quotes no EVOLVE block; send each block you change between its "
                               "'// EVOLVE-BLOCK-START <name>' and '// EVOLVE-BLOCK-END' lines")
    parent = {b.name: b.text for b in pblocks}
    unknown = [b.name for b in got if b.name not in parent]
    if unknown:
        raise BlockAnswerError(f"the answer names block(s) {', '.join(unknown)} that the program does not have; "
                               f"its blocks are {', '.join(parent)}")
    answered = {b.name for b in got}
    for b in got:
        other = _misplaced(b.name, b.text, parent, answered)
        if other is not None:
            raise BlockAnswerError(f"the code answered as block {b.name!r} is block {other!r} of the program (it "
                                   f"resembles {other!r}, not {b.name!r}); send it under "
                                   f"'// EVOLVE-BLOCK-START {other}'")
    new = {b.name: b.text for b in got}
    out, pos = [], 0
    for pb in pblocks:
        out.append(parent_code[pos:pb.start_offset])
        text = new.get(pb.name, pb.text)
        out.append(text if not text or text.endswith("\n") else text + "\n")
        pos = pb.end_offset
    out.append(parent_code[pos:])
    notes: list[str] = []
    code = _code_of(answer)
    if len(got) == len(pblocks) and markers.frozen_text(code).strip() != markers.frozen_text(parent_code).strip():
        notes.append("the answer's code outside the EVOLVE blocks differs from the parent's; the parent's was kept")
    return BlockSplice("".join(out), tuple(b.name for b in got), tuple(notes))


def evolve_chars(code: str) -> int:
    """Characters of the program's EVOLVE blocks with their marker lines (what a block-wise answer sends back)."""
    try:
        return sum(len(b.text) + len(b.name) + 48 for b in markers.blocks(code))
    except markers.MarkerError:
        return len(code)


def answer_token_cap(chars_asked: int, extra_tokens: int = 0, limit: int | None = None) -> int:
    """``max_tokens`` for an answer that sends back about ``chars_asked`` characters of code: room for the code
    at CHARS_PER_TOKEN, a quarter more for prose, the header, and ``extra_tokens`` (a reasoning model's thinking);
    at most ``limit`` when given (the room the model's context leaves)."""
    cap = int(chars_asked / CHARS_PER_TOKEN * 1.25) + ANSWER_OVERHEAD_TOKENS + extra_tokens
    cap = max(MIN_ANSWER_TOKENS, cap)
    return min(cap, limit) if limit is not None else cap
