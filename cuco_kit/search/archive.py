"""The archive: the best program per design-space cell (MAP-Elites style), the source of inspirations.

A cell is derived from the program itself, never from what a proposal claims: the backend, every knob of the
knob block (placement, sync scope, issuer and chunking are knobs by contract; a numeric range knob by its
bucket, low / middle / high, so a thread count does not make one cell per value) and a few features of the
communication analyser (device API used, number of streams). The program's API type (LSA, GIN or host,
`search/api_type.py`) is a dimension of its own, so GIN and LSA designs hold cells apart. Proposal tags are
advisory only.
"""
from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cuco_kit.search.api_type import api_type, program_features
from cuco_kit.search.population import Population, ProgramView
from cuco_kit.source import markers

log = logging.getLogger("cuco_kit.search")

DEFAULT_FEATURES = ("uses_device_api", "n_streams")


def _knobs(code: str) -> list[markers.Knob]:
    try:
        return markers.knobs(code)
    except Exception:  # noqa: BLE001 - a broken knob block is L0's finding, not the archive's
        return []


def knob_values(code: str) -> dict[str, str]:
    """The knob block's values ({} when the program has none or its knob block is broken)."""
    return {k.name: k.value for k in _knobs(code)}


def analyzer_features(code: str, keys: Sequence[str] = DEFAULT_FEATURES) -> dict[str, Any]:
    """Selected analyser features, or {} where the analyser (tree-sitter) is not installed or fails."""
    if not keys:
        return {}
    feats = program_features(code)
    return {k: feats[k] for k in keys if k in feats}


def cell_key(knobs: dict[str, str], backend: str, features: dict[str, Any] | None = None,
             api: str | None = None) -> str:
    """``backend=<b>|api=<a>|<knob>=<v>|...|<feature>=<v>``: stable (sorted) and readable in the lineage viewer.
    `knobs` are cell values (`markers.cell_values`: a range knob's bucket, not its value)."""
    head = [f"backend={backend}"] + ([f"api={api}"] if api else [])
    parts = head + ([markers.design_cell(knobs)] if knobs else ["knobs=-"])
    features = features or {}
    for k in sorted(features):
        v = features[k]
        parts.append(f"{k}={int(v) if isinstance(v, bool) else v}")
    return "|".join(parts)


def cell_of(code: str, backend: str, feature_keys: Sequence[str] = DEFAULT_FEATURES) -> tuple[dict[str, str], str]:
    """(knob values, cell key) of a program; range knobs enter the key by bucket (`markers.cell_value`)."""
    found = _knobs(code)
    return ({k.name: k.value for k in found},
            cell_key(markers.cell_values(found), backend, analyzer_features(code, feature_keys), api_type(code)))


@dataclass
class Archive:
    """cell key -> the id of its elite (the fittest passing program of the cell; earlier wins ties)."""

    def __post_init__(self) -> None:
        self.elites: dict[str, int] = {}

    def update(self, program: ProgramView, population: Population) -> bool:
        """Offer ``program``; True when it became its cell's elite."""
        if program.fitness is None or program.cell is None or program.source == "seed":
            return False
        cur = population.get(self.elites.get(program.cell))
        if cur is None or cur.fitness is None or program.fitness > cur.fitness:
            self.elites[program.cell] = program.id
            return True
        return False

    @classmethod
    def rebuild(cls, population: Population) -> Archive:
        a = cls()
        for p in population.all():
            a.update(p, population)
        return a

    def cells(self) -> dict[str, int]:
        return dict(self.elites)

    def inspirations(self, population: Population, rng: random.Random, k: int,
                     exclude: Sequence[int] = (), prefer_not_island: int | None = None) -> list[ProgramView]:
        """Up to k elites of other cells, fittest first among a random half-pool, preferring other islands'
        programs so a prompt sees designs its own lineage has not tried."""
        pool = [population.programs[i] for i in self.elites.values() if i not in set(exclude)]
        pool.sort(key=lambda p: (p.island == prefer_not_island, -(p.fitness or 0.0), p.id))
        head = pool[:max(k * 2, k)]
        rng.shuffle(head)
        chosen = sorted(head[:k], key=lambda p: (-(p.fitness or 0.0), p.id))
        return chosen
