"""The search's reasoning as plain data, for the person approving proposals (widgets/reasoning.py draws it).

Everything is read from the store, so a dashboard over a running, finished or resumed run shows the same thing:
the current meta-summary (its three steps: the summary of recent programs, the run's scratchpad and the ranked
recommendations), the proposals the novelty filter rejected and the answers the LLM source resampled or
gave up on (run metadata ``llm_notes``), the phase and each island's size and best, the model bandit's arms, and
for each crossover both of its parents.
"""
from __future__ import annotations

from collections import Counter
from typing import Any

from cuco_kit.search import bandit
from cuco_kit.search.llm_source import NOTES_KEY
from cuco_kit.search.model_stats import model_roles
from cuco_kit.search.models import ModelsConfig
from cuco_kit.search.novelty_judge import KEY as JUDGEMENTS_KEY
from cuco_kit.search.population import Population
from cuco_kit.store import Store


def _program_line(pop: Population, pid: int | None) -> dict[str, Any] | None:
    p = pop.get(pid)
    if p is None:
        return None
    return {"id": p.id, "name": p.name, "island": p.island, "result": p.summary()}


def reasoning_state(store: Store, run_id: int, population: Population | None = None,
                    recent: int = 10) -> dict[str, Any]:
    """The reasoning panel's data for run ``run_id`` (``population``: the engine's, else rebuilt from the store)."""
    st = store.get_meta(run_id, "state", {}) or {}
    pop = population if population is not None else Population.from_store(store, run_id, st.get("migrations", []))
    meta = store.get_meta(run_id, "meta_summary") or {}
    proposals = store.proposals(run_id)
    novelty = [{"proposal_id": p["id"], "name": p["name"], "parent_id": p["parent_id"], "note": p["note"]}
               for p in proposals if p["status"] == "rejected" and p["decided_by"] == "novelty"]
    notes = list(store.get_meta(run_id, NOTES_KEY, []) or [])
    sizes = Counter(p.island for p in pop.all())
    islands = []
    for i in sorted(sizes):
        best = pop.best(pop.island_members(i))
        islands.append({"island": i, "programs": sizes[i], "best_id": best.id if best else None,
                        "best_fitness": best.fitness if best else None})
    models = ModelsConfig.from_dict((store.run(run_id)["config"] or {}).get("models") or {})
    names = [m.name for m in models.mutation]
    arms = []
    if names:
        progs = pop.all()
        roles = model_roles(store.llm_calls(run_id), progs, {p.id: p.fitness for p in progs})
        arms = [a.to_dict() for a in bandit.arms(names, roles, models.bandit_c)]
    crossovers = [{"proposal_id": p["id"], "name": p["name"], "status": p["status"],
                   "parent_a": _program_line(pop, p["parent_id"]),
                   "parent_b": _program_line(pop, p["second_parent_id"])}
                  for p in proposals if p["second_parent_id"] is not None][-recent:]
    return {"meta_summary": {"text": meta.get("text", ""), "generation": meta.get("generation"),
                             "method": meta.get("method"), "summary": meta.get("summary", ""),
                             "scratchpad": meta.get("scratchpad", ""),
                             "recommendations": list(meta.get("recommendations") or [])},
            "phase": st.get("phase") or {}, "generation_done": st.get("generation_done", 0),
            "migrations": len(st.get("migrations", [])), "islands": islands,
            "novelty_rejections": novelty[-recent:],
            "novelty_judgements": list(store.get_meta(run_id, JUDGEMENTS_KEY, []) or [])[-recent:],
            "llm_notes": notes[-recent:], "bandit": arms,
            "crossovers": crossovers}
