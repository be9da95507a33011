"""Islands and migration.

Each island evolves its own sub-population (children inherit their parent's island); every
``migration_interval`` generations the best programs of each island are copied along the edges of the
``topology``. A copy is a membership, not a new row: the program keeps its id, lineage and result, and the
migration is recorded in the run's metadata so a resume rebuilds it.

An island may have an API type (``IslandConfig.api``: "lsa", "gin" or "host", `search/api_type.py`): its members
are the programs of that type placed on it, its LLM prompts use that type's system prompt
(``prompts/search_system_<api>.md``), and a migrant only goes to an island that takes its type, unless
``cross_api_migration`` is set. An island may also start from programs of its own (``initial_programs``) instead
of the baseline, and carry a system-prompt file of its own (``system_prompts``) on top of its type's prompt.

Where a migrant goes (``topology``): "ring" (the default), the next island after its own that takes it; "star",
from every island to the hub and from the hub to every other island; "full", to every other island; or an explicit
list of directed edges ``[[from, to], ...]``. Only the ring skips an island that does not take a migrant; on the
other topologies such an edge carries nothing. Whether a migrant has earned its move (re-measured beside the seed)
is the engine's business (`search/remeasure.py`): this module only says where moves go.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cuco_kit import prompts
from cuco_kit.errors import BadInput
from cuco_kit.search.api_type import api_type, check_api
from cuco_kit.search.population import Population, ProgramView
from cuco_kit.search.start_point import read_start
from cuco_kit.source.source_file import read_text

TOPOLOGIES = ("ring", "star", "full")
# A system-prompt file is prose a person wrote; anything larger is not one (and would crowd out the program).
MAX_PROMPT_BYTES = 64 << 10
ISLAND_HINT = "give the path of an existing file (in a run file, a relative path is read from the run file's folder)"


@dataclass
class IslandConfig:
    islands: int = 2
    migration_interval: int = 3  # generations between migrations; 0 = never
    migrants: int = 1  # best programs copied from each island per migration
    # The API type of each island ("lsa", "gin", "host"; "" for an island that takes any), one entry per island;
    # empty: no island has one. E.g. ["lsa", "lsa", "gin", "gin"] with islands=4.
    api: list[str] = field(default_factory=list)
    cross_api_migration: bool = False  # let a migrant go to an island of another API type
    # Where migrants go: "ring", "star" (through the hub island), "full", or directed edges [[from, to], ...].
    topology: str | list[list[int]] = "ring"
    hub: int = 0  # the centre of the "star" topology
    # Programs (files, each checked like a --from result) an island starts from instead of the baseline, one list
    # per island ([] for an island that starts from the baseline as before); empty: none has any. An island with
    # programs of its own does not take the baseline as a member, so its first parent is one of them.
    initial_programs: list[list[str]] = field(default_factory=list)
    # A system-prompt file per island ("" for none), added to the island's prompt (its API type's, or the general
    # one): where the file says $base, that prompt goes there; otherwise the file's text follows it. Empty: none.
    system_prompts: list[str] = field(default_factory=list)

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
        # A run file may give one file per island as a plain string: kept as a one-file list.
        self.initial_programs = [_file_list(v, i) for i, v in enumerate(self.initial_programs)]
        for name in ("initial_programs", "system_prompts"):
            got = len(getattr(self, name))
            if got and got != self.islands:
                raise BadInput(f"islands.{name} has {got} entr{'y' if got == 1 else 'ies'} for {self.islands} "
                               "island(s); give one per island ([] or \"\" for an island without)")
        for i, v in enumerate(self.system_prompts):
            if not isinstance(v, str):
                raise BadInput(f"islands.system_prompts[{i}]: {v!r} is not a file path; give a path or \"\"")
        if not isinstance(self.hub, int) or not 0 <= self.hub < self.islands:
            raise BadInput(f"islands.hub {self.hub!r} is not an island (0..{self.islands - 1}); name the star's "
                           "centre")
        self.topology = _check_topology(self.topology, self.islands)

    def api_of(self, island: int) -> str:
        """The island's API type ("" when it takes any)."""
        return self.api[island] if self.api else ""

    def api_map(self) -> dict[int, str]:
        """island -> API type, for the islands that have one."""
        return {i: a for i, a in enumerate(self.api) if a}

    def programs_of(self, island: int) -> list[str]:
        """The files ``island`` starts from ([] when it starts from the baseline)."""
        return list(self.initial_programs[island]) if self.initial_programs else []

    def prompt_of(self, island: int) -> str:
        """The island's own system-prompt file ("" when it has none)."""
        return self.system_prompts[island] if self.system_prompts else ""

    def seeded(self) -> set[int]:
        """The islands that start from programs of their own."""
        return {i for i in range(self.islands) if self.programs_of(i)}


def _file_list(value: Any, island: int) -> list[str]:
    if isinstance(value, str):
        return [value] if value else []
    if isinstance(value, list) and all(isinstance(v, str) and v for v in value):
        return list(value)
    raise BadInput(f"islands.initial_programs[{island}]: {value!r} is not a list of file paths; give e.g. "
                   "[\"lsa_design.cu\"] (or [] for an island that starts from the baseline)")


def _check_topology(value: Any, islands: int) -> str | list[list[int]]:
    """``value`` when it names a topology or is a list of directed edges between existing islands, else BadInput."""
    if isinstance(value, str):
        if value not in TOPOLOGIES:
            raise BadInput(f"islands.topology {value!r} is not one of {', '.join(TOPOLOGIES)}; or give directed edges "
                           "such as [[0, 2], [1, 2]]")
        return value
    if not isinstance(value, (list, tuple)):
        raise BadInput(f"islands.topology {value!r} is neither a name ({', '.join(TOPOLOGIES)}) nor a list of "
                       "directed edges such as [[0, 2], [1, 2]]")
    edges: list[list[int]] = []
    for e in value:
        if not (isinstance(e, (list, tuple)) and len(e) == 2 and all(isinstance(x, int) and not isinstance(x, bool)
                                                                      for x in e)):
            raise BadInput(f"islands.topology: edge {e!r} is not [from, to]; give pairs of island numbers")
        a, b = int(e[0]), int(e[1])
        if not (0 <= a < islands and 0 <= b < islands) or a == b:
            raise BadInput(f"islands.topology: edge [{a}, {b}] must join two different islands of 0..{islands - 1}")
        if [a, b] not in edges:
            edges.append([a, b])
    return edges


def edges(config: IslandConfig) -> list[tuple[int, int]]:
    """The directed edges migrants travel along (the ring's plain edges; `targets` skips islands on it)."""
    n = config.islands
    t = config.topology
    if n < 2:
        return []
    if t == "ring":
        return [(i, (i + 1) % n) for i in range(n)]
    if t == "star":
        return [(i, config.hub) for i in range(n) if i != config.hub] + \
            [(config.hub, i) for i in range(n) if i != config.hub]
    if t == "full":
        return [(i, j) for i in range(n) for j in range(n) if i != j]
    assert isinstance(t, list)  # checked in __post_init__
    return [(a, b) for a, b in t]


@dataclass
class IslandFiles:
    """What the islands' own files hold, read once at set-up: island -> [(path, code)] and island -> prompt."""

    programs: dict[int, list[tuple[str, str]]] = field(default_factory=dict)
    prompts: dict[int, str] = field(default_factory=dict)


def read_files(config: IslandConfig) -> IslandFiles:
    """Read and check every island's own program and prompt files; BadInput (one line naming the field, the file
    and the fix) for a missing or unreadable one, a program that is not a search start (``read_start``'s
    checks), or one of another API type than its island takes."""
    out = IslandFiles()
    for i in range(config.islands):
        for k, path in enumerate(config.programs_of(i)):
            what = f"islands.initial_programs[{i}][{k}]"
            try:
                code = read_start(path, what, "mark what the search may change with EVOLVE blocks "
                                  "(docs/contracts.md)")
            except BadInput as exc:
                raise _with_hint(exc) from None
            want = config.api_of(i)
            if want and not config.cross_api_migration and api_type(code) != want:
                raise BadInput(f"{what} {path}: a {api_type(code)} program, but island {i} takes {want} programs "
                               f"(islands.api[{i}]); give it a {want} design or another island")
            out.programs.setdefault(i, []).append((path, code))
        path = config.prompt_of(i)
        if path:
            try:
                out.prompts[i] = read_text(path, f"islands.system_prompts[{i}]", kind="a system prompt (text)",
                                           max_bytes=MAX_PROMPT_BYTES)
            except BadInput as exc:
                raise _with_hint(exc) from None
    return out


def _with_hint(exc: BadInput) -> BadInput:
    """``exc`` with the fix for a path that names no file (the other problems carry their own)."""
    text = str(exc)
    return BadInput(f"{text}; {ISLAND_HINT}" if text.endswith(("no such file", "not a regular file")) else text)


def resolve_paths(config: dict[str, Any], folder: str | Path) -> None:
    """In a run file's [islands] table (``config``), make the relative file paths relative to ``folder`` (the
    run file's), so a run file works from any directory."""
    base = Path(folder)

    def fix(p: Any) -> Any:
        return str(base / p) if isinstance(p, str) and p and not Path(p).is_absolute() else p

    if isinstance(config.get("initial_programs"), list):
        config["initial_programs"] = [[fix(p) for p in v] if isinstance(v, list) else fix(v)
                                      for v in config["initial_programs"]]
    if isinstance(config.get("system_prompts"), list):
        config["system_prompts"] = [fix(p) for p in config["system_prompts"]]


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
    """The islands a migrant of ``island`` goes to: on the ring, the next island after its own that takes it;
    on the other topologies, every island an edge from ``island`` leads to that takes it."""
    if config.topology == "ring":
        for step in range(1, config.islands):
            j = (island + step) % config.islands
            if takes(j, program, config):
                return [j]
        return []
    return [b for a, b in edges(config) if a == island and takes(b, program, config)]


def system_prompt(island: int, config: IslandConfig, own: str = "") -> str:
    """The system prompt of the LLM's proposals on ``island``: its API type's prompt file, else the default; with
    ``own`` (the text of the island's own prompt file, `read_files`), that text on top: in place of its $base
    when it has one, else after it."""
    base = prompts.load("search_system")
    api = config.api_of(island)
    text = prompts.render(f"search_system_{api}", base=base) if api else base
    if not own.strip():
        return text
    if "$base" in own or "${base}" in own:
        return own.replace("${base}", text).replace("$base", text)
    return f"{text.rstrip()}\n\n{own.strip()}\n"


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
