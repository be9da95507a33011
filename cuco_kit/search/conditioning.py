"""What a search prompt says about the setting, as the paper's design-space specification does: the workload's
description, the hardware the evaluations run on (from the evaluator's provenance), the NCCL device API excerpt
for the program's backend (quoted from the installed headers by cuco_kit.prompts.nccl_api, as the fast path
does), and the failure diagnoses of the parent's own lineage rather than the last failures of the whole run.
"""
from __future__ import annotations

from typing import Any

from cuco_kit import prompts
from cuco_kit.errors import CucoError
from cuco_kit.search.population import Population, ProgramView
from cuco_kit.search.proposal import FailureNote

# Provenance keys shown as the hardware line, with their labels; only those an evaluation reported appear.
_HARDWARE_KEYS = (("gpu", "GPU"), ("gpus", "GPUs on the host"), ("sm_count", "SMs"), ("gpu_memory_gib", "GiB"),
                  ("world", "ranks"), ("backend", "backend"), ("topology", "topology"), ("nccl", "NCCL"),
                  ("mps", "MPS"))


def device_api_kind(code: str) -> str:
    """"gin" for a program that uses the GIN one-sided API, else "lsa" (load/store over NVLink)."""
    return "gin" if "ncclGin" in code else "lsa"


def api_excerpt(code: str) -> str:
    """The NCCL device-API declarations for the program's backend, or one line saying why there are none."""
    try:  # nccl_api imports tree-sitter at module level (absent on the GPU image): only when a prompt needs it
        from cuco_kit.prompts.nccl_api import device_api_excerpts

        return device_api_excerpts(device_api_kind(code))
    except (CucoError, ImportError) as exc:
        return f"(the NCCL device API excerpt is unavailable here: {exc})"


def hardware(population: Population) -> str:
    """One line from the provenance of the newest evaluation that reported one ("not measured yet" before)."""
    for p in reversed(population.all()):
        prov: dict[str, Any] = (p.result or {}).get("provenance") or {}
        parts = [f"{label} {prov[k]}" for k, label in _HARDWARE_KEYS if prov.get(k) not in (None, "", [])]
        if parts:
            badge = (p.result or {}).get("badge", "real")
            return ", ".join(parts) + ("" if badge == "real" else f" (evaluations are {badge})")
    return "not measured yet"


def lineage_failures(population: Population, parent: ProgramView, k: int) -> list[FailureNote]:
    """The k newest failed evaluations among the children of the parent and of its ancestors (what this line
    of programs already tried and how it failed), newest first."""
    line: set[int] = set()
    p: ProgramView | None = parent
    while p is not None and p.id not in line:
        line.add(p.id)
        p = population.get(p.parent_id)
    notes = [f for f in population.failures(len(population)) if (population.get(f.program_id) or parent).parent_id
             in line]
    return notes[:k]


def render_context(population: Population, parent: ProgramView, *, workload: str, description: str, backend: str,
                   world_size: int) -> str:
    """The ``search_context`` prompt section."""
    return prompts.render("search_context", workload=workload, description=description.strip() or "(none given)",
                          backend=backend, world_size=world_size, hardware=hardware(population),
                          api=api_excerpt(parent.code))
