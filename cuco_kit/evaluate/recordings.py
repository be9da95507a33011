"""What the recorded real runs hold: which workload was measured at which world size, backend and sizes.

The replay evaluator answers only what was recorded, so everything that offers a configuration without a GPU
(the notebooks' widgets, `cuco search --evaluator replay`) asks this catalogue first: recordings are found by
name (the workload and the configuration, read from the stores, not from file names), recorded configurations
are offered first, and a request outside them is told which nearby configurations are recorded.
"""
from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

RECORDING_SUFFIXES = (".sqlite", ".sqlite3", ".db")


@dataclass(frozen=True)
class RecordedConfig:
    """One measured configuration: `evaluations` passing-or-failing REAL evaluations of `programs` distinct
    programs of `workload` at `world_size` ranks on `backend` with the resolved sizes `params`."""

    workload: str
    world_size: int
    backend: str
    params: tuple[tuple[str, int], ...]
    evaluations: int = 0
    programs: int = 0
    paths: tuple[str, ...] = field(default=(), compare=False)

    @property
    def sizes(self) -> dict[str, int]:
        return dict(self.params)

    def label(self) -> str:
        """'4 ranks, symm, M=4096 N=4096 K=4096'."""
        ranks = f"{self.world_size} rank{'s' if self.world_size != 1 else ''}"
        return f"{ranks}, {self.backend}, {sizes_text(self.sizes)}"


def sizes_text(params: Mapping[str, int]) -> str:
    """'M=4096 N=4096 K=4096', in the order given (the workload's parameter order)."""
    return " ".join(f"{k}={v}" for k, v in params.items()) or "default sizes"


def recording_files(directory: str | Path) -> list[Path]:
    """The recordings (*.sqlite, *.sqlite3, *.db at any depth) under `directory`, sorted by name."""
    base = Path(directory)
    if not base.is_dir():
        return []
    return sorted(p for p in base.rglob("*") if p.suffix in RECORDING_SUFFIXES and p.is_file())


def _workload_name(workload_dir: str) -> str:
    return Path(str(workload_dir).rstrip("/")).name


def _rows(path: Path, badges: tuple[str, ...]) -> Iterable[tuple[str, int, str, dict[str, int], str]]:
    """(workload, world, backend, request params, code hash) of every finished evaluation badged one of
    `badges` in one store, read with plain sqlite3 (no schema migration, nothing written)."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        marks = ", ".join("?" for _ in badges)
        cur = con.execute(
            "SELECT r.workload, e.world_size, e.backend, e.request, p.code_hash FROM evaluations e "
            "JOIN programs p ON p.id = e.program_id JOIN runs r ON r.id = e.run_id "
            f"WHERE e.status = 'done' AND e.badge IN ({marks})", badges)
        for workload, world, backend, request, code_hash in cur:
            req = json.loads(request or "{}")
            name = _workload_name(req.get("workload_dir") or "") or str(workload or "")
            yield name, int(world), str(backend), {k: int(v) for k, v in (req.get("params") or {}).items()}, \
                str(code_hash)
    except sqlite3.DatabaseError:
        return
    finally:
        con.close()


def catalogue(paths: Iterable[str | Path], defaults: Mapping[str, Mapping[str, int]] | None = None, *,
              badges: tuple[str, ...] = ("real",)) -> list[RecordedConfig]:
    """Every recorded configuration in `paths` (of evaluations badged one of `badges`), most evaluations first.
    `defaults` maps a workload name to its default sizes, so a request that left a size at its default and one
    that spelled it out are the same."""
    acc: dict[tuple[str, int, str, tuple[tuple[str, int], ...]], tuple[int, set[str], set[str]]] = {}
    for path in paths:
        for name, world, backend, params, code_hash in _rows(Path(path), badges):
            full = {**dict((defaults or {}).get(name, {})), **params}
            key = (name, world, backend, tuple(full.items()))  # the workload's parameter order
            n, hashes, where = acc.get(key, (0, set(), set()))
            hashes.add(code_hash)
            where.add(str(path))
            acc[key] = (n + 1, hashes, where)
    out = [RecordedConfig(k[0], k[1], k[2], k[3], n, len(h), tuple(sorted(w))) for k, (n, h, w) in acc.items()]
    return sorted(out, key=lambda c: (c.workload, -c.evaluations, c.world_size, c.backend, c.params))


def _distance(c: RecordedConfig, world: int, backend: str, params: Mapping[str, int]) -> tuple[int, int, float]:
    size_gap = sum(abs(v - params.get(k, v)) / max(v, 1) for k, v in c.params)
    return (c.backend != backend) + (c.world_size != world), abs(c.world_size - world), size_gap


def nearby(configs: Iterable[RecordedConfig], workload: str, world: int, backend: str,
           params: Mapping[str, int], limit: int = 3) -> list[RecordedConfig]:
    """The recorded configurations of `workload` closest to the one asked for (same backend and world size
    first, then the nearest sizes)."""
    mine = [c for c in configs if c.workload == workload and (c.world_size, c.backend, c.sizes) !=
            (world, backend, dict(params))]
    return sorted(mine, key=lambda c: _distance(c, world, backend, params))[:limit]


def miss_hint(configs: Iterable[RecordedConfig], workload: str, world: int, backend: str,
              params: Mapping[str, int]) -> str:
    """One clause for a replay miss: whether this configuration is recorded at all, and what is nearby."""
    configs = list(configs)
    asked = RecordedConfig(workload, world, backend, tuple(params.items()))
    if any((c.world_size, c.backend, c.workload, c.sizes) == (world, backend, workload, dict(params))
           for c in configs):
        return (f"{asked.label()} is recorded, but not this program (an edited or new program can only be "
                "measured on a GPU)")
    near = nearby(configs, workload, world, backend, params)
    if not near:
        return f"nothing of {workload} is recorded"
    return f"{asked.label()} is not recorded; recorded nearby: " + "; ".join(c.label() for c in near)
