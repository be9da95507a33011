"""Decisions on the terminal for `cuco fastpath --manual`: each attempt's diff, then approve, reject with a note
(it goes into the next prompt) or edit (a file holding the edited code, checked and evaluated like any attempt).

Candidate and LLM text is printed through `cuco_kit.terminal.clean`, so an answer cannot drive the terminal.
"""
from __future__ import annotations

from typing import Any, TextIO

from cuco_kit.errors import BadInput, CucoError
from cuco_kit.fastpath import FastPath, StageOutcome
from cuco_kit.source.static_check import load_source
from cuco_kit.terminal import clean

PROMPT = "decision: [a]pprove | [r]eject NOTE | [e]dit FILE | [q]uit > "


def show(fp: FastPath, out: TextIO) -> None:
    a = fp.pending
    assert a is not None
    who = "FIXTURE answer" if a.fixture else f"model {a.llm_model or '?'}"
    print(clean(f"\n== stage {a.stage}, attempt {a.number} ({who}): the proposal against the stage's input =="),
          file=out)
    print(clean(a.diff or "(no change)"), file=out)


def decide(fp: FastPath, inp: TextIO, out: TextIO) -> Any:
    """Show the pending attempt, read one decision from `inp` and apply it; returns what the fast path returns
    (the next pending StageOutcome or the FastPathResult)."""
    show(fp, out)
    while True:
        print(PROMPT, end="", file=out, flush=True)
        line = inp.readline()
        if not line:
            raise BadInput("--manual: no decision (end of input); run it on a terminal or pipe decisions in")
        cmd, _, rest = line.strip().partition(" ")
        rest = rest.strip()
        if cmd in ("a", "approve"):
            return fp.approve()
        if cmd in ("r", "reject"):
            return fp.reject(rest)
        if cmd in ("e", "edit"):
            if not rest:
                print("edit needs the file with your edited code, e.g.: e my_stage_a.cu", file=out)
                continue
            return fp.edit(load_source(rest, "edited attempt"))
        if cmd in ("q", "quit"):
            raise CucoError(f"stopped at stage {fp.pending.stage if fp.pending else '?'} by the user; the "
                            "database keeps every decision so far")
        print(clean(f"unknown decision {cmd!r}"), file=out)


def run_manual(fp: FastPath, inp: TextIO, out: TextIO) -> Any:
    """fp.run() with a decision at every attempt, until the fast path returns its result."""
    res = fp.run()
    while isinstance(res, StageOutcome) and res.status == "pending":
        res = decide(fp, inp, out)
    return res
