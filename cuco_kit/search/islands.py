"""Islands and ring migration.

Each island evolves its own sub-population (children inherit their parent's island); every
``migration_interval`` generations the best program of island i is copied to island (i + 1) mod n. A copy is
a membership, not a new row: the program keeps its id, lineage and result (re-evaluating an identical program
would only spend GPU time), and the migration is recorded in the run's metadata so a resume rebuilds it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cuco_kit.errors import BadInput
from cuco_kit.search.population import Population


@dataclass
class IslandConfig:
    islands: int = 2
    migration_interval: int = 3  # generations between migrations; 0 = never
    migrants: int = 1  # best programs copied from each island per migration

    def __post_init__(self) -> None:
        if self.islands < 1:
            raise BadInput(f"islands must be >= 1, got {self.islands}")
        if self.migration_interval < 0 or self.migrants < 1:
            raise BadInput("migration_interval must be >= 0 and migrants >= 1")


def island_for_slot(slot: int, config: IslandConfig) -> int:
    """Slots of a generation go round the islands so every island advances each generation."""
    return slot % config.islands


def due(generation: int, config: IslandConfig) -> bool:
    """Whether a migration follows generation ``generation`` (1-based count of finished generations)."""
    return config.islands > 1 and config.migration_interval > 0 and generation > 0 \
        and generation % config.migration_interval == 0


def migrate(population: Population, generation: int, config: IslandConfig) -> list[dict[str, Any]]:
    """Copy the best ``migrants`` of each island to the next island on the ring; returns the migrations made
    ({"generation", "program_id", "from", "to"}), already applied to ``population``. Programs already on the
    target island are not copied again."""
    moves: list[dict[str, Any]] = []
    # Decide all moves from the state before any of them, so the ring order does not matter.
    for i in range(config.islands):
        target = (i + 1) % config.islands
        own = [p for p in population.island_members(i) if p.source != "baseline"]
        best = population.top(config.migrants, own)
        present = {p.id for p in population.island_members(target)}
        for p in best:
            if p.id not in present:
                moves.append({"generation": generation, "program_id": p.id, "from": i, "to": target})
    for m in moves:
        population.migrate(m["program_id"], m["to"])
    return moves
