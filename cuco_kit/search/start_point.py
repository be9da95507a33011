"""Where a search starts when it continues a fast path: `cuco search DIR --from RESULT.cu`.

The fast path's annotated result becomes generation 0: its bytes are the baseline root, so its frozen text is
every first child's L0 parent, and its knob block (when the annotation made one) is the design space. When the
result was stored by a fast path in the same database, its stages (seed -> Stage A -> Stage B -> annotate) come
along as the lineage's first nodes: programs of source "fastpath" tagged ``stage:<name>`` and ``lineage``, with
their evaluations copied, at generations -n..-1. They are drawn, never selected as parents nor evaluated again
(`Population` leaves them out).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cuco_kit.errors import BadInput
from cuco_kit.search.population import LINEAGE_TAG
from cuco_kit.source import knob_rules, markers
from cuco_kit.source.source_file import read_source
from cuco_kit.store import Store, code_hash
from cuco_kit.workload import Workload


@dataclass
class StageProgram:
    """One fast-path stage's program, with its evaluations' results (EvalResult dicts) as the fast path stored
    them."""

    stage: str
    name: str
    code: str
    rationale: str = ""
    results: list[dict[str, Any]] = field(default_factory=list)
    evaluations: list[dict[str, Any]] = field(default_factory=list)  # world_size, backend, badge per result


@dataclass
class StartPoint:
    code: str  # the result's bytes: the baseline root, L0 parent of the first children
    name: str
    lineage: list[StageProgram] = field(default_factory=list)  # the fast path's stages, oldest first

    @property
    def sha(self) -> str:
        return code_hash(self.code)


def _stage_of(row: dict[str, Any]) -> str:
    tag = next((t for t in row.get("tags") or [] if t.startswith("stage:")), None)
    return tag.split(":", 1)[1] if tag else str(row.get("source") or "?")


def fastpath_lineage(store: Store, code: str) -> list[StageProgram]:
    """The fast-path stages that led to `code` in `store` (empty when no fast path stored it there)."""
    h = code_hash(code)
    for run in reversed(store.runs()):
        row = store.find_program_by_hash(run["id"], h)
        if row is None or row["source"] not in ("fastpath", "human") or LINEAGE_TAG in (row.get("tags") or []):
            continue
        chain: list[StageProgram] = []
        cur: Any = row
        while cur is not None:
            evs = [e for e in store.evaluations(program_id=cur["id"]) if e["status"] == "done" and e.get("result")]
            chain.append(StageProgram(_stage_of(cur), str(cur.get("name") or ""), cur["code"],
                                      str(cur.get("rationale") or ""), [dict(e["result"] or {}) for e in evs],
                                      [{"world_size": e["world_size"], "backend": e["backend"],
                                        "badge": e["badge"]} for e in evs]))
            cur = store.program(cur["parent_id"]) if cur.get("parent_id") is not None else None
        return list(reversed(chain))
    return []


BASELINE_HINT = "mark what the search may change with EVOLVE blocks, the knobs in a knob block (docs/contracts.md)"
FROM_HINT = "pass the fast path's annotated result (cuco fastpath ... --out RESULT.cu)"


def read_baseline(workload: Workload) -> str:
    """The workload's baseline, checked like a ``--from`` file (`read_start`); BadInput when it has none."""
    if not workload.baseline:
        raise BadInput(f"workload {workload.name}: no baseline (the device-initiated program with the knob block) "
                       "to start the search from; pass --from RESULT.cu, the fast path's annotated result "
                       "(cuco fastpath DIR/seed_nccl.cu --workload DIR --out RESULT.cu), or set Workload.baseline "
                       "in workload.py")
    return read_start(workload.path(workload.baseline), f"workload {workload.name}: baseline", BASELINE_HINT)


def read_start(path: str | Path, what: str, hint: str) -> str:
    """The code of a file a search starts from (a ``--from`` result, a workload's baseline): readable source
    text with well-formed EVOLVE markers, at least one block (the search changes code only inside them) and a
    knob block that keeps the contract, if it has one, its knob values keeping its knob rules. BadInput (one line
    naming ``what`` and the file, then ``hint``) otherwise, before anything is evaluated."""
    code = read_source(path, what)
    try:
        found = markers.blocks(code)
        values = {k.name: k.value for k in markers.knobs(code)}
        broken = knob_rules.violated(knob_rules.rules(code), values)
    except BadInput as exc:
        raise BadInput(f"{what} {path}: {exc}") from None
    if broken:
        raise BadInput(f"{what} {path}: {broken[0]}, so its own point is invalid; set its knobs to a point that "
                       "keeps the rules")
    if not found:
        raise BadInput(f"{what} {path}: no EVOLVE blocks, so the search could change nothing; {hint}")
    return code


INITIAL_TAG = "initial"  # tag of the further programs a search starts from (SearchConfig.initial_programs)


def read_initial(path: str | Path) -> str:
    """The code of one of the further programs a search starts from (`cuco search --from A.cu --from B.cu`: B),
    checked like a ``--from`` file."""
    return read_start(path, "--from", FROM_HINT)


def start_from(path: str | Path, store: Store | None = None) -> StartPoint:
    """The start point of a search from a fast-path result file (`read_start` checks it)."""
    code = read_start(path, "--from", FROM_HINT)
    lineage = fastpath_lineage(store, code) if store is not None else []
    if lineage and lineage[-1].code == code:
        lineage = lineage[:-1]  # the result itself is the baseline root
    return StartPoint(code, f"fast-path result ({Path(path).name})", lineage)


def add_lineage(store: Store, run_id: int, start: StartPoint) -> int | None:
    """Store the fast-path stages in the search run (programs and copies of their evaluations); returns the id
    of the last, the baseline's parent (None without a lineage)."""
    parent: int | None = None
    n = len(start.lineage)
    for i, sp in enumerate(start.lineage):
        parent = store.add_program(run_id=run_id, code=sp.code, parent_id=parent, source="fastpath",
                                   name=f"fast path: {sp.stage}", rationale=sp.rationale[:2000],
                                   tags=[f"stage:{sp.stage}", LINEAGE_TAG], generation=i - n)
        for res, ev in zip(sp.results, sp.evaluations, strict=True):
            eid = store.start_evaluation(parent, world_size=int(ev["world_size"]), backend=str(ev["backend"]),
                                         badge=str(ev["badge"]), request={"copied_from": "fast path"})
            store.finish_evaluation(eid, res)
    return parent
