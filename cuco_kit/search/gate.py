"""The approval gate in front of evaluation: "auto" approves every proposal; "manual" keeps each one waiting
for a person's approve / edit / reject.

Nothing blocks on a person: `decide` (called from a widget's button handler or another thread) only puts the
decision on a thread-safe queue and returns; the engine drains the queue between evaluations, records each
decision in the store (with the edited code, if any) and keeps evaluating the work already approved.
"""
from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Literal

from cuco_kit.errors import BadInput
from cuco_kit.search.proposal import Proposal

GateMode = Literal["auto", "manual"]
MODES: tuple[GateMode, ...] = ("auto", "manual")


def gate_mode(mode: str) -> GateMode:
    """``mode`` as a GateMode; BadInput (one line) when it is none."""
    for m in MODES:
        if mode == m:
            return m
    raise BadInput(f"gate mode {mode!r} is not one of {', '.join(MODES)}")


@dataclass
class Decision:
    proposal_id: int
    decision: str  # approved | rejected | edited
    by: str
    note: str = ""
    code: str | None = None  # the edited code, for "edited"


class ApprovalGate:
    def __init__(self, mode: str = "auto") -> None:
        self._mode = gate_mode(mode)
        self._lock = threading.Lock()
        self._pending: dict[int, Proposal] = {}
        self._claimed: set[int] = set()  # decided by a person, not yet drained
        self._queue: queue.Queue[Decision] = queue.Queue()
        self._wake = threading.Event()

    # -- any thread -----------------------------------------------------------------------------------------
    @property
    def mode(self) -> GateMode:
        return self._mode

    def set_mode(self, mode: str) -> None:
        """Switch modes; switching to "auto" approves what is waiting (at the engine's next drain)."""
        self._mode = gate_mode(mode)
        if mode == "auto":
            for pid in self.pending_ids():
                try:
                    self.decide(pid, "approved", by="auto")
                except BadInput:
                    pass  # decided meanwhile
        self._wake.set()

    def pending(self) -> list[tuple[int, Proposal]]:
        """Proposals waiting for a decision, oldest first."""
        with self._lock:
            return [(pid, p) for pid, p in sorted(self._pending.items()) if pid not in self._claimed]

    def pending_ids(self) -> list[int]:
        return [pid for pid, _ in self.pending()]

    def decide(self, proposal_id: int, decision: str, code: str | None = None, *, note: str = "",
               by: str = "user") -> None:
        """Queue a decision on a waiting proposal and return at once. 'edited' approves the given ``code``
        instead of the proposed one."""
        if decision not in ("approved", "rejected", "edited"):
            raise BadInput(f"decision {decision!r} is not one of approved, rejected, edited")
        if decision == "edited" and not code:
            raise BadInput(f"proposal {proposal_id}: an 'edited' decision needs the edited code (code=...)")
        if decision != "edited" and code is not None:
            raise BadInput(f"proposal {proposal_id}: code=... goes with an 'edited' decision only")
        with self._lock:
            if proposal_id not in self._pending:
                raise BadInput(f"proposal {proposal_id} is not waiting for a decision "
                               f"(waiting: {sorted(set(self._pending) - self._claimed) or 'none'})")
            if proposal_id in self._claimed:
                raise BadInput(f"proposal {proposal_id} was already decided")
            self._claimed.add(proposal_id)
        self._queue.put(Decision(proposal_id, decision, by, note, code))
        self._wake.set()

    # -- engine thread --------------------------------------------------------------------------------------
    def submit(self, proposal_id: int, proposal: Proposal) -> None:
        """A stored proposal enters the gate; in "auto" mode it is approved at once."""
        with self._lock:
            self._pending[proposal_id] = proposal
        if self._mode == "auto":
            self.decide(proposal_id, "approved", by="auto")

    def drain(self) -> list[tuple[Decision, Proposal]]:
        """Decisions made since the last drain, in the order they were made, with their proposals."""
        out: list[tuple[Decision, Proposal]] = []
        while True:
            try:
                d = self._queue.get_nowait()
            except queue.Empty:
                break
            with self._lock:
                p = self._pending.pop(d.proposal_id)
                self._claimed.discard(d.proposal_id)
            out.append((d, p))
        return out

    def waiting(self) -> int:
        with self._lock:
            return len(self._pending)

    def wait(self, timeout: float) -> bool:
        """Sleep until a decision arrives (or ``wake`` is called) or ``timeout`` passes."""
        got = self._wake.wait(timeout)
        self._wake.clear()
        return got

    def wake(self) -> None:
        self._wake.set()

    def restore(self, proposal_id: int, proposal: Proposal) -> None:
        """Put back a proposal that was pending when the run stopped (resume), without auto-approving it
        twice: in "auto" mode it is approved now."""
        self.submit(proposal_id, proposal)
