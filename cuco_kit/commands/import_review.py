"""Decisions on the terminal for `cuco init --llm`: the LLM's port of the program, then its torch reference, each
shown with what the checks found; approve, reject with a note (it goes into the next request), edit (a file
holding your version, checked like the draft), keep what the deterministic import wrote, or quit.

Nothing reaches the workload folder that the person has not approved. LLM text is printed through
`cuco_kit.terminal.clean`, so an answer cannot drive the terminal.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from cuco_kit.errors import BadInput, CucoError
from cuco_kit.importer.session import Draft, ImportSession
from cuco_kit.source.source_file import read_source
from cuco_kit.terminal import clean

PROMPT = "decision: [a]pprove | [r]eject NOTE | [e]dit FILE | [k]eep what is there | [q]uit > "
MAX_DRAFTS = 5  # requests per part before the review gives up asking and keeps what is there


def _show(draft: Draft, round_: int, out: TextIO) -> None:
    who = "FIXTURE answer" if draft.fixture else f"model {draft.model or '?'}"
    what = "the port (a diff against the original program)" if draft.kind == "port" else \
        "the torch reference (a diff against the one in workload.py)"
    print(clean(f"\n== {draft.kind} draft {round_} ({who}): {what} =="), file=out)
    print(clean(draft.diff or "(no code block in the answer)"), file=out)
    for p in draft.problems:
        print(clean(f"  check: {p}"), file=out)
    if draft.ok:
        print("  checks: none failed", file=out)


def _review(kind: str, propose: Callable[[str], Draft], accept: Callable[[str], Path], kept: str,
            inp: TextIO, out: TextIO) -> str:
    """One part's loop; returns what happened to it (one line)."""
    note = ""
    for round_ in range(1, MAX_DRAFTS + 1):
        draft = propose(note)
        _show(draft, round_, out)
        while True:
            print(PROMPT, end="", file=out, flush=True)
            line = inp.readline()
            if not line:
                raise BadInput(f"--llm: no decision on the {kind} (end of input); run it on a terminal or pipe "
                               "decisions in")
            cmd, _, rest = line.strip().partition(" ")
            rest = rest.strip()
            if cmd in ("a", "approve"):
                if not draft.ok:
                    print(clean(f"the checks refuse this {kind}: "
                                f"{(draft.problems or ['no code'])[0]}; reject it or edit it"), file=out)
                    continue
                assert draft.code is not None
                return f"{kind}: approved draft {round_}, written to {accept(draft.code)}"
            if cmd in ("r", "reject"):
                note = rest
                break
            if cmd in ("e", "edit"):
                if not rest:
                    print(f"edit needs the file with your {kind}, e.g.: e my_{kind}.txt", file=out)
                    continue
                try:
                    path = accept(read_source(rest, f"edited {kind}"))
                except BadInput as exc:
                    print(clean(str(exc)), file=out)
                    continue
                return f"{kind}: your edit, written to {path}"
            if cmd in ("k", "keep"):
                return f"{kind}: kept {kept}"
            if cmd in ("q", "quit"):
                raise CucoError(f"stopped at the {kind} by the user; the folder keeps what was approved so far")
            print(clean(f"unknown decision {cmd!r}"), file=out)
    return f"{kind}: {MAX_DRAFTS} drafts rejected; kept {kept}"


def review_import(session: ImportSession, inp: TextIO, out: TextIO) -> list[str]:
    """Ask for the port, then the reference, a decision on each; what happened to each part, one line each.
    The folder must be written first (`session.write()`)."""
    return [_review("port", lambda note: session.propose_port(note), session.accept_port,
                    "the deterministic port (seed_nccl.cu)", inp, out),
            _review("reference", lambda note: session.propose_reference(note), session.accept_reference,
                    "workload.py's TODO reference: fill it by hand", inp, out)]
