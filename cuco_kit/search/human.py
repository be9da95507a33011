"""The human mutation source: code or SEARCH/REPLACE edits typed by the user become proposals with source
"human", in the same format as every other proposal. Submissions may come from any thread (a widget); the
engine collects them between evaluations."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

from cuco_kit.errors import BadInput
from cuco_kit.search.proposal import Proposal, ProposalContext, unified_diff
from cuco_kit.source import patch


@dataclass
class HumanEdit:
    parent_id: int
    code: str | None = None  # the whole edited program
    edits: str | None = None  # or SEARCH/REPLACE edits against the parent
    name: str = ""
    rationale: str = ""
    tags: list[str] = field(default_factory=list)


def human_proposal(parent_id: int, parent_code: str, *, code: str | None = None, edits: str | None = None,
                   name: str = "", rationale: str = "", tags: list[str] | None = None) -> Proposal:
    """A proposal from a person's edit: either the whole ``code`` or SEARCH/REPLACE ``edits`` (applied with
    cuco_kit.source.patch, so edits outside EVOLVE blocks are refused with a message naming the edit)."""
    if (code is None) == (edits is None):
        raise BadInput("a human proposal needs exactly one of code=... (the whole program) or edits=... "
                       "(SEARCH/REPLACE blocks)")
    if edits is not None:
        try:
            code = patch.apply_proposal(parent_code, edits)
        except patch.PatchError as exc:
            raise BadInput(f"your edit to program {parent_id} could not be applied: {exc}") from None
    assert code is not None
    if code == parent_code:
        raise BadInput(f"your edit leaves program {parent_id} unchanged; nothing to evaluate")
    return Proposal(name=name or "human edit", rationale=rationale or "edited by hand", diff=unified_diff(
        parent_code, code), tags=list(tags or []) + ["human"], source="human", parent_id=parent_id, code=code)


class HumanSource:
    """Queue of edits typed by the user. ``kinds`` is empty: phases never draw it; the engine drains it."""

    name = "human"
    kinds: tuple[str, ...] = ()

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: list[HumanEdit] = []

    def submit(self, edit: HumanEdit) -> None:
        if (edit.code is None) == (edit.edits is None):
            raise BadInput("a human edit needs exactly one of code=... or edits=...")
        with self._lock:
            self._queue.append(edit)

    def waiting(self) -> int:
        with self._lock:
            return len(self._queue)

    def propose(self, context: ProposalContext) -> list[Proposal]:
        """Every queued edit whose parent exists becomes a proposal; a broken edit is reported through
        ``self.errors`` (and the engine's log) instead of being dropped silently."""
        with self._lock:
            items, self._queue = self._queue, []
        out: list[Proposal] = []
        self.errors: list[str] = []
        for e in items:
            parent = context.population.get(e.parent_id)
            if parent is None:
                self.errors.append(f"human edit: no program {e.parent_id} in this run")
                continue
            try:
                out.append(human_proposal(e.parent_id, parent.code, code=e.code, edits=e.edits, name=e.name,
                                          rationale=e.rationale, tags=e.tags))
            except BadInput as exc:
                self.errors.append(str(exc))
        return out
