"""Islands and migration.

Each island evolves its own sub-population (children inherit their parent's island); every
``migration_interval`` generations the best programs of each island are copied to another island. A copy is
a membership, not a new row: the program keeps its id, lineage and result, and the migration is recorded in the
run's metadata so a resume rebuilds it.

An island may have an API type (``IslandConfig.api``: "lsa", "gin" or "host", `search/api_type.py`): its members
are the programs of that type placed on it, its LLM prompts use that type's system prompt
(``prompts/search_system_<api>.md``), and a migrant only goes to an island that takes its type, unless
``cross_api_migration`` is set. Where a migrant goes: on the ring, the next island after its own that takes it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cuco_kit import prompts
from cuco_kit.errors import BadInput
from cuco_kit.search.api_type import check_api
from cuco_kit.search.population import Population, ProgramView


@dataclass
class IslandConfig:
    islands: int = 2
    migration_interval: int = 3  # generations between migrations; 0 = never
    migrants: int = 1  # best programs copied from each island per migration
    # The API type of each island ("lsa", "gin", "host"; "" for an island that takes any), one entry per island;
    # empty: no island has one. E.g. ["lsa", "lsa", "gin", "gin"] with islands=4.
    api: list[str] = field(default_factory=list)
    cross_api_migration: bool = False  # let a migrant go to an island of another API type

    def __post_init__(self) -> None:
        if self.islands < 1:
            raise BadInput(f"islands must be >= 1, got {self.islands}")
        if self.migration_interval < 0 or self.migrants < 1:
            raise BadInput("migration_interval must be >= 0 and migrants >= 1")
        if self.api and len(self.api) != self.islands:
            raise BadInput(f"islands.api names {len(self.api)} API type(s) for {self.islands} island(s); give one "
                           "per island (\"\" for an island that takes any)")
        for i, a in enumerate(self.api):
            check_api(a, f"islands.api[{i}]")

    def api_of(self, island: int) -> str:
        """The island's API type ("" when it takes any)."""
        return self.api[island] if self.api else ""

    def api_map(self) -> dict[int, str]:
        """island -> API type, for the islands that have one."""
        return {i: a for i, a in enumerate(self.api) if a}


def island_for_slot(slot: int, config: IslandConfig) -> int:
    """Slots of a generation go round the islands so every island advances each generation."""
    return slot % config.islands


def due(generation: int, config: IslandConfig) -> bool:
    """Whether a migration follows generation ``generation`` (1-based count of finished generations)."""
    return config.islands > 1 and config.migration_interval > 0 and generation > 0 \
        and generation % config.migration_interval == 0


def takes(island: int, program: ProgramView, config: IslandConfig) -> bool:
    """Whether ``island`` takes ``program`` as a member (its API type allows it)."""
    want = config.api_of(island)
    return not want or config.cross_api_migration or program.api == want


def targets(island: int, program: ProgramView, config: IslandConfig) -> list[int]:
    """The islands a migrant of ``island`` goes to: on the ring, the next island after its own that takes it."""
    for step in range(1, config.islands):
        j = (island + step) % config.islands
        if takes(j, program, config):
            return [j]
    return []


def system_prompt(island: int, config: IslandConfig) -> str:
    """The system prompt of the LLM's proposals on ``island``: its API type's prompt file, else the default."""
    base = prompts.load("search_system")
    api = config.api_of(island)
    return prompts.render(f"search_system_{api}", base=base) if api else base


def plan(population: Population, generation: int, config: IslandConfig) -> list[dict[str, Any]]:
    """The migrations due now ({"generation", "program_id", "from", "to"}), not applied: the best ``migrants``
    of each island, each to the island(s) `targets` names, unless already there. All are decided from the state
    before any of them, so the order of the islands does not matter."""
    moves: list[dict[str, Any]] = []
    for i in range(config.islands):
        own = [p for p in population.island_members(i) if p.source != "baseline"]
        for p in population.top(config.migrants, own):
            for target in targets(i, p, config):
                if p.id not in {q.id for q in population.island_members(target)}:
                    moves.append({"generation": generation, "program_id": p.id, "from": i, "to": target})
    return moves


def apply(population: Population, moves: list[dict[str, Any]]) -> None:
    for m in moves:
        population.migrate(m["program_id"], m["to"])


def migrate(population: Population, generation: int, config: IslandConfig) -> list[dict[str, Any]]:
    """Plan the migrations due now and apply them to ``population``; returns them."""
    moves = plan(population, generation, config)
    apply(population, moves)
    return moves
