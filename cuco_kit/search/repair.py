"""Repair instead of waste: the follow-up messages that give a model one more chance, and what they quote.

An answer whose SEARCH text is not found (or whose blocks are misplaced) gets one retry with the exact error and
the nearest lines of the program (patch.nearest_lines: difflib, after the whitespace-insensitive match in
patch.apply_edits has failed too); a proposal the novelty filter rejects is resampled with the reason; a
candidate that does not compile goes back to the same model once with the compiler's first errors; an answer cut
at the length limit is continued. Each follow-up is a new call whose purpose names it (``.repair.patch``,
``.resample.novelty``, ``.repair.build``, ``.continue``), so every retry is its own ledger row.
"""
from __future__ import annotations

import re
from typing import Any

from cuco_kit import prompts
from cuco_kit.source import patch

PURPOSE_PATCH = "repair.patch"
PURPOSE_BUILD = "repair.build"
PURPOSE_NOVELTY = "resample.novelty"
PURPOSE_CONTINUE = "continue"
BUILD_REPAIR_TAG = "repair:build"

_SEARCH_NOT_FOUND = re.compile(r"SEARCH text not found")
_ERROR_LINE = re.compile(r"\berror\b", re.IGNORECASE)


def follow_up(messages: list[dict[str, Any]], answer: str, user: str) -> list[dict[str, Any]]:
    """The conversation so far, the model's answer, and the follow-up request."""
    return [*messages, {"role": "assistant", "content": answer}, {"role": "user", "content": user}]


# Errors a retry cannot fix: the answer wants to change frozen code, which no rewording makes allowed.
_FINAL = ("is not inside one EVOLVE block", "contains an EVOLVE marker")


def retryable(error: str) -> bool:
    """Whether an answer that failed with ``error`` is worth one retry."""
    return not any(f in error for f in _FINAL)


def patch_repair(error: str, code: str, answer: str) -> str:
    """The retry request for an answer that could not be applied: the error, and for a SEARCH text that was
    not found, the program's lines nearest to it."""
    nearest = ""
    if _SEARCH_NOT_FOUND.search(error):
        n = int(m.group(1)) if (m := re.match(r"edit (\d+):", error)) else 1
        edits = patch.parse_edits(answer) or patch.edits_from_unified_diff(answer)
        if 0 < n <= len(edits):
            nearest = ("\nThe program's lines nearest to that SEARCH text (line numbers are not part of the "
                       f"code):\n```\n{patch.nearest_lines(code, edits[n - 1].search)}\n```\n")
    return prompts.render("search_repair", error=error, nearest=nearest)


def build_errors(result: dict[str, Any], n: int = 8) -> str:
    """The compiler's first error lines from an evaluation result (its build log, else its reason)."""
    log = (result.get("logs") or {}).get("build") or result.get("reason") or ""
    lines = [ln.strip() for ln in str(log).splitlines() if _ERROR_LINE.search(ln)]
    return "\n".join(lines[:n]) or str(result.get("reason", ""))[:800]


def is_build_failure(result: dict[str, Any] | None) -> bool:
    return result is not None and result.get("level_reached") == "L1" and result.get("verdict") == "fail"


def build_repair(result: dict[str, Any]) -> str:
    return prompts.render("search_build_repair", errors=build_errors(result))


def resample(reason: str) -> str:
    return prompts.render("search_resample", reason=reason)


def continuation() -> str:
    return prompts.load("search_continue")
