"""Per-model, per-role usage of a run: answers, costs and win rate, from the store's ledger and programs.

Calls made for a configured model carry its name after an ``@`` in their purpose (``search.mutate.diff@cheap``);
programs a mutation model proposed carry the tag ``model:<name>``. A mutation "win" is a program that passed and
beat its parent's fitness. The role of a call comes from its purpose: ``search.mutate...`` mutation,
``search.meta`` meta, ``search.diagnose`` diagnosis, ``search.novelty.judge`` novelty_judge, ``...judge`` judge,
``...novelty`` / ``...embed`` novelty.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

MODEL_TAG = "model:"


def purpose_with_model(purpose: str, model: str | None) -> str:
    return f"{purpose}@{model}" if model else purpose


def split_purpose(purpose: str) -> tuple[str, str | None]:
    """(purpose without the model, the model named after '@' or None)."""
    base, sep, model = purpose.rpartition("@")
    return (base, model) if sep and base else (purpose, None)


def role_of(purpose: str) -> str:
    base = split_purpose(purpose)[0]
    if base.startswith("search.mutate"):
        return "mutation"
    if base.startswith("search.meta"):
        return "meta"
    if base.startswith("search.diagnose"):
        return "diagnosis"
    if base.startswith("search.novelty.judge"):
        return "novelty_judge"
    if "judge" in base:
        return "judge"
    if "novelty" in base or "embed" in base:
        return "novelty"
    return base.split(".")[0] or "other"


def model_of_program(tags: Iterable[str]) -> str | None:
    return next((t[len(MODEL_TAG):] for t in tags if t.startswith(MODEL_TAG)), None)


@dataclass
class ModelRole:
    model: str
    role: str
    calls: int = 0
    answers: int = 0  # calls that came back with an answer
    retries: int = 0  # calls made to repair or resample an earlier answer
    prompt_tokens: int = 0
    completion_tokens: int = 0
    dollars: float = 0.0
    unpriced_tokens: int = 0  # tokens of calls at unknown price (counted against the token budget)
    programs: int = 0  # programs proposed (mutation)
    wins: int = 0  # programs that beat their parent (mutation)
    improvement: float = 0.0  # sum of fitness gains over the parent (mutation)

    @property
    def win_rate(self) -> float | None:
        return self.wins / self.programs if self.programs else None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "win_rate": self.win_rate}


def model_roles(calls: Iterable[Mapping[str, Any]], programs: Iterable[Any] = (),
                fitness: Mapping[int, float | None] | None = None) -> list[ModelRole]:
    """Rows per (model, role). ``calls``: the store's llm_calls rows; ``programs``: objects or dicts with id,
    parent_id, tags; ``fitness``: program id -> fitness (None: did not pass)."""
    rows: dict[tuple[str, str], ModelRole] = {}

    def row(model: str, role: str) -> ModelRole:
        return rows.setdefault((model, role), ModelRole(model, role))

    for c in calls:
        base, named = split_purpose(str(c["purpose"]))
        r = row(named or str(c["model"]), role_of(base))
        r.calls += 1
        r.answers += bool(c["ok"])
        r.retries += any(w in base for w in (".repair", ".resample", ".continue"))
        r.prompt_tokens += int(c["prompt_tokens"] or 0)
        r.completion_tokens += int(c["completion_tokens"] or 0)
        if c["dollars"] is None:
            r.unpriced_tokens += int(c["prompt_tokens"] or 0) + int(c["completion_tokens"] or 0)
        else:
            r.dollars += float(c["dollars"])
    fit = fitness or {}
    for p in programs:
        d: Mapping[str, Any] = p if isinstance(p, Mapping) else vars(p)
        model = model_of_program(d.get("tags") or [])
        if model is None:
            continue
        r = row(model, "mutation")
        r.programs += 1
        parent = d.get("parent_id")
        mine, theirs = fit.get(d["id"]), fit.get(parent) if parent is not None else None
        if mine is not None and (theirs is None or mine > theirs):
            r.wins += 1
            r.improvement += mine - (theirs if theirs is not None else mine)
    return sorted(rows.values(), key=lambda r: (r.role, r.model))
