"""The one proposal type every mutation source emits, and the protocol the sources share.

A proposal is a candidate program plus why it was made: LLM diffs, full rewrites and crossovers, offline
design-space moves and a person's edits all arrive as a `Proposal`, go through the same novelty filter and
approval gate, and become programs in the store with the same lineage fields.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from cuco_kit.source import patch

if TYPE_CHECKING:  # pragma: no cover - typing only
    from cuco_kit.llm.client import LLMClient
    from cuco_kit.search.engine import SearchEngine
    from cuco_kit.search.phases import PhaseSettings
    from cuco_kit.search.population import Population, ProgramView

# Program sources (the store's PROGRAM_SOURCES) that proposals may carry.
PROPOSAL_SOURCES = ("llm_diff", "llm_full", "llm_crossover", "design_space", "human")
# Log characters a failure shown with its diagnosis keeps (the diagnosis already says what the log means).
DIAGNOSED_TAIL_CHARS = 200
# Mutation kinds a phase mixes; each maps to the program source its proposals carry.
MUTATION_KINDS = {"diff": "llm_diff", "full": "llm_full", "crossover": "llm_crossover",
                  "design_space": "design_space"}


@dataclass
class Proposal:
    """A candidate program and its story. ``diff`` is a unified diff against the parent (viewers show it);
    ``code`` is the whole candidate. ``meta`` holds source details (temperature, model, fixture flag, trial
    params) that are logged but not needed to evaluate."""

    name: str
    rationale: str
    diff: str
    tags: list[str]
    source: str
    parent_id: int | None
    code: str
    second_parent_id: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.source not in PROPOSAL_SOURCES:
            raise ValueError(f"proposal source {self.source!r} is not one of {', '.join(PROPOSAL_SOURCES)}")
        self.tags = [str(t) for t in self.tags]


@dataclass
class FailureNote:
    """A failed evaluation fed back into prompts: what was tried and how it failed (log tail included)."""

    program_id: int
    name: str
    level: str
    verdict: str
    reason: str
    log_tail: str = ""
    diagnosis: str = ""  # a model's reading of the failure (search/diagnosis.py), when one was asked for

    def render(self, max_chars: int = 600) -> str:
        tail = self.log_tail.strip()
        # A diagnosis says what the log means; the log's last lines stay as evidence, shorter.
        limit = min(max_chars, DIAGNOSED_TAIL_CHARS) if self.diagnosis else max_chars
        if len(tail) > limit:
            tail = "..." + tail[-limit:]
        out = f"- program {self.program_id} ({self.name or 'unnamed'}): {self.verdict} at {self.level}: {self.reason}"
        if self.diagnosis:
            out += "\n  diagnosis:\n" + "\n".join("    " + line for line in self.diagnosis.strip().splitlines())
        if tail:
            out += "\n  log tail:\n" + "\n".join("    " + line for line in tail.splitlines())
        return out


@dataclass
class ProposalContext:
    """Everything a source may use to propose children of ``parent`` (read-only by convention).

    ``rng`` is derived from the run's seed and the generation, so offline sources are reproducible. ``kind``
    is the mutation kind the phase drew for this slot ("diff", "full", "crossover", "design_space")."""

    run_id: int
    generation: int
    island: int
    parent: ProgramView
    population: Population
    phase: PhaseSettings
    rng: random.Random
    kind: str = "diff"
    second_parent: ProgramView | None = None
    inspirations: list[ProgramView] = field(default_factory=list)
    failures: list[FailureNote] = field(default_factory=list)
    meta_summary: str = ""
    seed: int = 0
    parallel: int = 1  # evaluations that run at once (the design-space source picks its sampler by it)
    n: int = 1  # how many proposals are wanted
    system_prompt: str = ""  # the island's system prompt for LLM sources ("" = the default, search_system.md)


@runtime_checkable
class ProposalSource(Protocol):
    """A mutation source. ``kinds`` are the mutation kinds it can serve; ``propose`` may return fewer than
    ``context.n`` proposals (or none) and must not raise for a bad answer from a model: it logs and returns
    what it has."""

    name: str
    kinds: tuple[str, ...]

    def propose(self, context: ProposalContext) -> list[Proposal]: ...


# Optional capabilities of a source; the engine narrows with isinstance.

@runtime_checkable
class BindsEngine(Protocol):
    """Wants the engine once it is set up (its ledger, workload and config), before the first proposal."""

    def bind(self, engine: SearchEngine) -> None: ...


@runtime_checkable
class RepairsBuilds(Protocol):
    """Given a program of its own that did not compile, proposes a child of ``ctx.parent`` that makes the same
    change in a way that compiles (or nothing)."""

    def repair_build(self, ctx: ProposalContext, failed: ProgramView) -> list[Proposal]: ...


@runtime_checkable
class HasClient(Protocol):
    """Talks to an LLM; the meta-summary uses ``meta_client``, or ``client`` when that is None."""

    @property
    def client(self) -> LLMClient: ...

    meta_client: LLMClient | None


@runtime_checkable
class ServesRoles(Protocol):
    """Has a client for each side role the search asks ("meta", "diagnosis", "novelty_judge"): the role's own
    model when one is configured, else the source's first client; with the configured model's name."""

    def role_client(self, role: str) -> tuple[LLMClient, str | None]: ...


def unified_diff(old: str, new: str) -> str:
    """The one diff format every proposal carries (viewers show it): cuco_kit.source.patch's unified diff."""
    return patch.unified_diff(old, new, "parent", "candidate")
