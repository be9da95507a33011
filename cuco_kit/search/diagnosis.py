"""An LLM diagnosis of each failed or slow evaluation, fed to the next prompts of that line of programs.

A program is diagnosed when its evaluation ended with any verdict other than "pass" (not "unavailable", and not
an infrastructure error: a lost slot says nothing about the code), or when it passed at a lower speed-up than its
parent's. The ``search_diagnose`` prompt shows the model the change against the parent, the result and the
evaluation's log tails; the answer (cause, evidence, fix) is stored with the program (run metadata
``diagnosis/<program id>``) and shown where the raw failure text was: in the lineage failures of later prompts and,
for a slow program that becomes a parent, next to its result.

Each diagnosis is one call through the run's ledger (purpose ``search.diagnose``, with the role's model), so it
counts against the run's budget; ``DiagnosisConfig.enabled`` turns it off and ``max_per_round`` bounds it. A call
that fails leaves the program undiagnosed (its raw failure text is shown as before).
"""
from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from cuco_kit import prompts
from cuco_kit.llm.client import LLMBudgetExceeded, LLMClient, LLMError
from cuco_kit.search.model_stats import purpose_with_model
from cuco_kit.search.proposal import unified_diff

if TYPE_CHECKING:  # typing only: the population sits beside this module
    from cuco_kit.search.population import Population, ProgramView
    from cuco_kit.store import Store

log = logging.getLogger("cuco_kit.search")

KEY_PREFIX = "diagnosis/"  # run metadata, one key per diagnosed program
PURPOSE = "search.diagnose"
_NOT_DIAGNOSED = ("seed", "baseline")  # reference points: nothing to learn from their numbers
TEXT_CHARS = 1200  # a diagnosis longer than this is clipped (the prompt asks for six lines)


@dataclass
class DiagnosisConfig:
    enabled: bool = True  # off: failures reach prompts as raw text only, as before
    max_per_round: int = 8  # diagnoses asked per generation at most (the newest first; the rest go without)
    max_tokens: int = 400
    log_chars: int = 1500  # per stage's log tail shown to the model
    diff_chars: int = 6000  # the change against the parent, clipped


@dataclass
class Diagnosis:
    program_id: int
    evaluation_id: int | None
    kind: str  # "failed" | "slow"
    text: str
    model: str  # the model that answered (a fixture's name when a test server answered)
    generation: int
    fixture: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def kind_of(p: ProgramView, parent: ProgramView | None) -> str | None:
    """"failed", "slow" or None (nothing to diagnose) for program ``p`` with its latest result."""
    r = p.result
    if r is None or p.source in _NOT_DIAGNOSED:
        return None
    verdict = r.get("verdict")
    if verdict == "unavailable" or (r.get("provenance") or {}).get("infrastructure_error"):
        return None
    if verdict != "pass":
        return "failed"
    if p.fitness is not None and parent is not None and parent.fitness is not None and p.fitness < parent.fitness:
        return "slow"
    return None


def load(store: Store, run_id: int) -> dict[int, Diagnosis]:
    """Every stored diagnosis of the run, by program id."""
    out: dict[int, Diagnosis] = {}
    for key in store.meta_keys(run_id):
        if key.startswith(KEY_PREFIX):
            d = store.get_meta(run_id, key) or {}
            try:
                out[int(d["program_id"])] = Diagnosis(**{k: d[k] for k in Diagnosis.__dataclass_fields__ if k in d})
            except (KeyError, TypeError, ValueError):
                log.warning("diagnosis: run %s metadata %s is not a diagnosis; ignored", run_id, key)
    return out


def _what(kind: str, p: ProgramView, parent: ProgramView | None) -> str:
    r = p.result or {}
    if kind == "failed":
        return f"This candidate FAILED: verdict {r.get('verdict')} at {r.get('level_reached')}."
    mine = f"{p.fitness:.3f}x" if p.fitness is not None else "?"
    theirs = f"{parent.fitness:.3f}x" if parent is not None and parent.fitness is not None else "?"
    return (f"This candidate passed but is SLOWER than its parent: {mine} the seed against the parent's "
            f"{theirs}.")


def _logs(result: dict[str, Any], chars: int) -> str:
    parts = []
    for stage, text in (result.get("logs") or {}).items():
        text = str(text or "").strip()
        if text:
            parts.append(f"[{stage}]\n" + (text if len(text) <= chars else "..." + text[-chars:]))
    return "\n".join(parts) or "(no log lines were kept)"


class Diagnoser:
    """Asks the diagnosis role's model about failed and slow programs and stores what it says."""

    def __init__(self, config: DiagnosisConfig, llm: LLMClient | None, model: str | None, store: Store,
                 run_id: int, *, workload: str = "", backend: str = "", world_size: int = 1) -> None:
        self.config, self.llm, self.model = config, llm, model
        self.store, self.run_id = store, run_id
        self.workload, self.backend, self.world_size = workload, backend, world_size

    @property
    def active(self) -> bool:
        return self.config.enabled and self.llm is not None

    def messages(self, kind: str, p: ProgramView, parent: ProgramView | None) -> list[dict[str, str]]:
        diff = unified_diff(parent.code, p.code) if parent is not None else "(no parent: the whole program is new)"
        if len(diff) > self.config.diff_chars:
            diff = diff[:self.config.diff_chars] + "\n... (clipped)"
        text = prompts.render(
            "search_diagnose", workload=self.workload, backend=self.backend, world_size=self.world_size,
            what=_what(kind, p, parent), program_id=p.id, program_name=p.name or p.source,
            rationale=p.rationale or "(none given)", result=p.summary(),
            parent_id=parent.id if parent is not None else "-",
            parent_result=parent.summary() if parent is not None else "-", diff=diff,
            logs=_logs(p.result or {}, self.config.log_chars))
        return [{"role": "system", "content": prompts.load("search_system")}, {"role": "user", "content": text}]

    def diagnose(self, population: Population, program_ids: Iterable[int], generation: int) -> list[Diagnosis]:
        """Diagnose those of ``program_ids`` that failed or were slow (newest first, ``max_per_round`` at most),
        store each diagnosis and set it on the program. A spent budget ends the round's diagnoses quietly."""
        if not self.active:
            return []
        assert self.llm is not None
        todo = []
        for pid in sorted(set(program_ids), reverse=True):
            p = population.get(pid)
            if p is None or p.diagnosis:
                continue
            kind = kind_of(p, population.get(p.parent_id))
            if kind is not None:
                todo.append((p, kind))
        out: list[Diagnosis] = []
        for p, kind in todo[:self.config.max_per_round]:
            parent = population.get(p.parent_id)
            try:
                c = self.llm.complete(self.messages(kind, p, parent), purpose=purpose_with_model(PURPOSE, self.model),
                                      temperature=0.2, max_tokens=self.config.max_tokens)
            except LLMBudgetExceeded as exc:
                log.warning("diagnosis: LLM budget spent (%s); no more diagnoses this round", exc)
                break
            except LLMError as exc:
                log.warning("diagnosis of program %s failed (%s); its raw failure text is shown instead", p.id, exc)
                continue
            text = c.text.strip()[:TEXT_CHARS]
            if not text:
                continue
            d = Diagnosis(program_id=p.id, evaluation_id=p.evaluation_id, kind=kind, text=text, model=c.model,
                          generation=generation, fixture=c.fixture)
            self.store.put_meta(self.run_id, f"{KEY_PREFIX}{p.id}", d.to_dict())
            p.diagnosis = text
            out.append(d)
        return out
