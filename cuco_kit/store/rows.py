"""What the store holds: the enumerations it checks, and rows as the read methods return them (JSON
columns decoded)."""
from __future__ import annotations

from typing import Any, TypedDict

RUN_STATES = ("running", "paused", "stopped", "finished")
PROGRAM_SOURCES = ("seed", "baseline", "llm_diff", "llm_full", "llm_crossover", "design_space", "human",
                   "fastpath")
BADGES = ("real", "replayed", "simulated", "unmeasured")
PROPOSAL_STATUSES = ("pending", "approved", "rejected", "edited")
DECISIONS = ("approved", "rejected", "edited")
EVALUATION_STATUSES = ("in_flight", "done", "interrupted")



# ---- rows as the read methods return them (JSON columns decoded) ------------------------------------------------

class RunRow(TypedDict):
    id: int
    workload: str
    config: dict[str, Any]
    seed: int
    badge: str
    state: str
    created_at: float
    updated_at: float


class ProgramRow(TypedDict):
    id: int
    run_id: int
    parent_id: int | None
    second_parent_id: int | None
    source: str
    name: str
    rationale: str
    code: str
    code_hash: str
    tags: list[str]
    knobs: dict[str, str]
    cell: str | None
    island: int
    generation: int
    created_at: float


class ProposalRow(TypedDict):
    id: int
    run_id: int
    parent_id: int | None
    second_parent_id: int | None
    source: str
    name: str
    rationale: str
    diff: str
    code: str
    original_code: str | None
    tags: list[str]
    status: str
    decided_by: str | None
    decided_at: float | None
    note: str
    program_id: int | None
    created_at: float


class DecisionRow(TypedDict):
    id: int
    proposal_id: int
    decision: str
    decided_by: str
    note: str
    created_at: float


class EvaluationRow(TypedDict):
    id: int
    program_id: int
    run_id: int
    status: str
    world_size: int
    backend: str
    badge: str
    request: dict[str, Any]
    level_reached: str | None
    verdict: str | None
    reason: str | None
    median_ms: float | None
    spread_ms: float | None
    seed_median_ms: float | None
    speedup: float | None
    max_rel_err: float | None
    flagged: bool
    iteration_ms: list[Any] | None
    per_rank_median_ms: list[float] | None
    logs: dict[str, str] | None
    provenance: dict[str, Any] | None
    gpu: str | None
    driver: str | None
    cuda: str | None
    nccl: str | None
    mps: bool | None
    git_rev: str | None
    result: dict[str, Any] | None
    started_at: float
    finished_at: float | None


class BestRow(EvaluationRow):
    """The best evaluation plus its program, and that program's code and name for convenience."""

    program: ProgramRow
    code: str
    name: str


class LLMCallRow(TypedDict):
    id: int
    run_id: int | None
    model: str
    purpose: str
    prompt_tokens: int
    completion_tokens: int
    latency_s: float
    dollars: float | None
    ok: bool
    error: str
    request_hash: str
    created_at: float
