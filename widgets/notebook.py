"""What the notebooks show from the workbench: a `Note` as a coloured banner, each attempt of a fast-path
stage as a DiffReview against the stage's input, and kit errors as their one line (`short_errors`)."""
from __future__ import annotations

from typing import Any

from IPython import get_ipython
from IPython.display import display

from cuco_kit.errors import CucoError
from cuco_kit.fastpath import FastPath, StageOutcome
from cuco_kit.workbench import Note

from ._common import badge_colour, esc
from .diff_review import DiffReview

_STAGE_BEFORE = {"A": None, "B": "A", "annotate": "B"}  # whose output a stage rewrites (None: the seed)


class Banner:
    """A one-line note with a coloured bar in the badge's colour; plain text where HTML is not shown."""

    def __init__(self, text: str, badge: str = "info") -> None:
        self.text = text
        self.badge = badge

    def _repr_html_(self) -> str:
        return (f'<div style="border-left:4px solid {badge_colour(self.badge)};padding:4px 8px;margin:4px 0;'
                f'background:#fafafa">{esc(self.text)}</div>')

    def __str__(self) -> str:
        return self.text

    __repr__ = __str__


def banner(note: Note | str, badge: str = "info") -> Banner:
    """A Banner for a workbench `Note` (its own badge), or for `note` as text under `badge`."""
    if isinstance(note, Note):
        return Banner(note.text, note.badge)
    return Banner(note, badge)


def review_attempts(fp: FastPath, outcome: StageOutcome) -> None:
    """Display a stage's outcome (from fp.stage_a(), stage_b() or annotate()) and each of its attempts as a
    side-by-side diff against the stage's input. Attempts already decided show their verdict, frozen."""
    before = _STAGE_BEFORE.get(outcome.stage)
    stage_input = fp.seed_code if before is None else fp.outcomes[before].code
    display(Banner(f"stage {outcome.stage}: {outcome.status} - {outcome.message}",
                   "info" if outcome.ok else "simulated"))
    for a in outcome.attempts:
        prop = {"id": a.proposal_id or a.number, "name": f"stage {a.stage}, attempt {a.number} ({a.source})",
                "rationale": f"{a.verdict} at {a.level or '-'}: {a.reason}"
                             + (f" | model {a.llm_model}" if a.llm_model else "")
                             + (" | FIXTURE answer" if a.fixture else ""),
                "source": a.source, "tags": ["fixture"] if a.fixture else [],
                "parent_code": stage_input, "code": a.code or ""}
        review = DiffReview(prop)
        if a.verdict != "pending":
            review.freeze(a.verdict)
        display(review)


def _one_line(shell: Any, etype: type, value: BaseException, tb: Any, tb_offset: Any = None) -> None:
    display(Banner(f"{etype.__name__}: {value}", "error"))


def short_errors() -> bool:
    """Show the kit's own errors (CucoError: bad input, a missing recording ...) as their one-line message in
    a red banner instead of a multi-frame traceback; other exceptions keep theirs. True when installed (in an
    IPython kernel)."""
    shell = get_ipython()
    if shell is None:
        return False
    shell.set_custom_exc((CucoError,), _one_line)
    return True
