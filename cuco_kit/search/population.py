"""The search's in-memory view of a run's programs and their latest results, rebuilt from the store on resume.

The store is the record; this view answers the questions selection, islands, the archive and the prompts ask
(who is on island i, which programs passed, how many children a program has) without a query each time.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from cuco_kit.search.api_type import api_type
from cuco_kit.search.proposal import FailureNote
from cuco_kit.store import ProgramRow, Store

ROOT_SOURCES = ("baseline",)  # generation-0 programs every island starts from
# Tag of the fast-path stages a search started from a fast-path result (search/start_point.py): drawn in the
# lineage, never parents, never evaluated by the search.
LINEAGE_TAG = "lineage"


@dataclass
class ProgramView:
    id: int
    code: str
    parent_id: int | None
    source: str
    name: str = ""
    rationale: str = ""
    tags: list[str] = field(default_factory=list)
    knobs: dict[str, str] = field(default_factory=dict)
    cell: str | None = None
    island: int = 0
    generation: int = 0
    second_parent_id: int | None = None
    result: dict[str, Any] | None = None  # the latest finished evaluation's EvalResult dict
    evaluation_id: int | None = None
    fitness: float | None = None  # higher is better; None unless passed (and not flagged)
    diagnosis: str = ""  # a model's reading of a failed or slow result (search/diagnosis.py); "" when none
    _api: str | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def api(self) -> str:
        """The program's API type ("lsa", "gin", "host"), derived from its code once."""
        if self._api is None:
            self._api = api_type(self.code)
        return self._api

    @property
    def evaluated(self) -> bool:
        return self.result is not None

    @property
    def passed(self) -> bool:
        return self.result is not None and self.result.get("verdict") == "pass"

    def summary(self) -> str:
        """One line for prompts and logs."""
        r = self.result
        if r is None:
            return "not evaluated yet"
        if r.get("verdict") == "pass":
            sp = r.get("speedup")
            ms = r.get("median_ms")
            parts = [f"passed, median {ms:.4f} ms" if ms is not None else "passed"]
            if sp is not None:
                parts.append(f"{sp:.3f}x the seed")
            if r.get("flagged"):
                parts.append("FLAGGED for review (implausible speed-up)")
            return ", ".join(parts)
        return f"{r.get('verdict')} at {r.get('level_reached')}: {r.get('reason', '')}"


def fitness_of(result: dict[str, Any] | None, reference_ms: float | None) -> float | None:
    """Speed-up over the seed (higher is better). The evaluator's own ratio wins (seed re-measured in the same
    run); else the stored reference; else 1/median. Failed and flagged results have no fitness."""
    if not result or result.get("verdict") != "pass" or result.get("flagged"):
        return None
    sp = result.get("speedup")
    if sp is not None and math.isfinite(sp) and sp > 0:
        return float(sp)
    ms = result.get("median_ms")
    if ms is None or not ms > 0:
        return None
    return float(reference_ms / ms) if reference_ms else 1.0 / float(ms)


class Population:
    def __init__(self) -> None:
        self.programs: dict[int, ProgramView] = {}
        self.order: list[int] = []
        self.reference_ms: float | None = None  # the seed's median, when measured
        self.extra_members: dict[int, set[int]] = {}  # island -> program ids migrated in
        self.island_api: dict[int, str] = {}  # island -> its API type, for islands that have one
        # Islands that start from programs of their own (IslandConfig.initial_programs): the roots are not members.
        self.seeded_islands: set[int] = set()
        # Programs whose advantage did not hold when measured again (search/remeasure.py): never promoted (the
        # best, the top few, migrants), still possible parents.
        self.held_back: set[int] = set()

    # -- building -------------------------------------------------------------------------------------------
    def add(self, p: ProgramView) -> ProgramView:
        self.programs[p.id] = p
        self.order.append(p.id)
        return p

    def add_row(self, row: ProgramRow) -> ProgramView:
        return self.add(ProgramView(
            id=row["id"], code=row["code"], parent_id=row.get("parent_id"), source=row["source"],
            name=row.get("name", ""), rationale=row.get("rationale", ""), tags=list(row.get("tags") or []),
            knobs=dict(row.get("knobs") or {}), cell=row.get("cell"), island=int(row.get("island") or 0),
            generation=int(row.get("generation") or 0), second_parent_id=row.get("second_parent_id")))

    def set_result(self, program_id: int, result: dict[str, Any], evaluation_id: int | None = None) -> ProgramView:
        p = self.programs[program_id]
        p.result = dict(result)
        p.evaluation_id = evaluation_id
        if p.source == "seed" and p.passed and result.get("median_ms"):
            self.reference_ms = float(result["median_ms"])
        p.fitness = fitness_of(result, self.reference_ms)
        return p

    def migrate(self, program_id: int, island: int) -> None:
        self.extra_members.setdefault(island, set()).add(program_id)

    @classmethod
    def from_store(cls, store: Store, run_id: int, migrations: Iterable[dict[str, Any]] = ()) -> Population:
        pop = cls()
        for row in store.programs(run_id):
            pop.add_row(row)
        latest: dict[int, tuple[dict[str, Any], int]] = {}  # program -> (its latest result, evaluation id)
        for ev in store.evaluations(run_id=run_id):
            result = ev.get("result")
            if ev["status"] == "done" and result is not None:
                latest[ev["program_id"]] = (result, ev["id"])
        # Seeds first, so every other fitness is relative to the measured seed.
        for pid in sorted(latest, key=lambda i: (pop.programs[i].source != "seed", i)):
            if pid in pop.programs:
                pop.set_result(pid, *latest[pid])
        for m in migrations:
            pop.migrate(int(m["program_id"]), int(m["to"]))
        return pop

    # -- questions ------------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.order)

    def all(self) -> list[ProgramView]:
        return [self.programs[i] for i in self.order]

    def get(self, program_id: int | None) -> ProgramView | None:
        return None if program_id is None else self.programs.get(program_id)

    def roots(self) -> list[ProgramView]:
        return [p for p in self.all() if p.source in ROOT_SOURCES]

    def evolvable(self) -> list[ProgramView]:
        """Programs that may be parents: everything but the reference seed (it has no knob block) and the
        fast-path stages drawn before the start."""
        return [p for p in self.all() if p.source != "seed" and LINEAGE_TAG not in p.tags]

    def island_members(self, island: int) -> list[ProgramView]:
        """Programs placed on the island (and the roots, unless it starts from programs of its own), of its API type
        when it has one, and those migrated in."""
        extra = self.extra_members.get(island, set())
        api = self.island_api.get(island)
        roots = island not in self.seeded_islands
        return [p for p in self.evolvable()
                if p.id in extra or ((p.island == island or (roots and p.source in ROOT_SOURCES))
                                     and (not api or p.api == api))]

    def island_start(self, island: int) -> list[ProgramView]:
        """What the island's first parent is drawn from while none of its members has a fitness: its own starting
        programs when it has them, else the roots."""
        if island in self.seeded_islands:
            extra = self.extra_members.get(island, set())
            own = [p for p in self.evolvable() if (p.island == island or p.id in extra) and p.generation == 0
                   and p.source not in ROOT_SOURCES]
            if own:
                return own
        return self.roots()

    def scored(self, programs: Iterable[ProgramView] | None = None) -> list[ProgramView]:
        """Programs with a fitness (passed, not flagged), in id order."""
        src = self.evolvable() if programs is None else programs
        return [p for p in src if p.fitness is not None]

    def promotable(self, programs: Iterable[ProgramView] | None = None) -> list[ProgramView]:
        """Scored programs that may be promoted (not held back by a re-measure), in id order."""
        return [p for p in self.scored(programs) if p.id not in self.held_back]

    def best(self, programs: Iterable[ProgramView] | None = None) -> ProgramView | None:
        scored = self.promotable(programs)
        # Ties go to the earlier program, so the best never flips on equal numbers.
        return max(scored, key=lambda p: (p.fitness, -p.id)) if scored else None

    def top(self, k: int, programs: Iterable[ProgramView] | None = None) -> list[ProgramView]:
        return sorted(self.promotable(programs), key=lambda p: (-(p.fitness or 0.0), p.id))[:k]  # never None

    def children_of(self, program_id: int) -> list[ProgramView]:
        return [p for p in self.all() if p.parent_id == program_id or p.second_parent_id == program_id]

    def child_counts(self) -> dict[int, int]:
        counts: dict[int, int] = {}
        for p in self.all():
            for parent in (p.parent_id, p.second_parent_id):
                if parent is not None:
                    counts[parent] = counts.get(parent, 0) + 1
        return counts

    def unevaluated(self) -> list[ProgramView]:
        return [p for p in self.all() if p.result is None and LINEAGE_TAG not in p.tags]

    def failures(self, k: int, *, island: int | None = None) -> list[FailureNote]:
        """The k most recent failed evaluations (newest first), with log tails, to feed back into prompts."""
        out: list[FailureNote] = []
        for p in reversed(self.all()):
            r = p.result
            if r is None or r.get("verdict") == "pass" or r.get("verdict") == "unavailable":
                continue
            if (r.get("provenance") or {}).get("infrastructure_error"):  # lost slots teach nothing about code
                continue
            if island is not None and p.island != island:
                continue
            logs = r.get("logs") or {}
            tail = "\n".join(f"[{k}] {v}" for k, v in logs.items() if v)
            out.append(FailureNote(program_id=p.id, name=p.name, level=str(r.get("level_reached")),
                                   verdict=str(r.get("verdict")), reason=str(r.get("reason", "")), log_tail=tail,
                                   diagnosis=p.diagnosis))
            if len(out) >= k:
                break
        return out

    def max_generation(self) -> int:
        return max((p.generation for p in self.all()), default=0)
