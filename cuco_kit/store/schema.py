"""The schema: the version this code writes, the tables of every version, and the migrations between them
(``MIGRATIONS[i]`` turns version ``i`` into ``i + 1``; append, never edit a released one)."""
from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Callable, Mapping
from typing import Any

from cuco_kit.errors import BadInput
from cuco_kit.store.rows import BADGES

SCHEMA_VERSION = 1

# Result fields with a column of their own; the rest of EvalResult.to_dict() lives in the `result` JSON copy.
RESULT_SCALARS = ("level_reached", "verdict", "reason", "median_ms", "spread_ms", "seed_median_ms", "speedup",
                   "max_rel_err")
RESULT_JSON = ("iteration_ms", "per_rank_median_ms", "logs", "provenance")


# The prototype's unversioned layout. Kept so the 0 -> 1 migration has something real to be tested against.
V0_LAYOUT = """
CREATE TABLE runs (id INTEGER PRIMARY KEY, workload TEXT NOT NULL, config TEXT NOT NULL,
                   created_at REAL NOT NULL);
CREATE TABLE programs (id INTEGER PRIMARY KEY, run_id INTEGER NOT NULL, parent_id INTEGER, code TEXT NOT NULL,
                       source TEXT NOT NULL, created_at REAL NOT NULL);
CREATE TABLE evaluations (id INTEGER PRIMARY KEY, program_id INTEGER NOT NULL, result TEXT,
                          created_at REAL NOT NULL);
"""
V0_TABLES = ("runs", "programs", "evaluations")

_V1_LAYOUT = """
CREATE TABLE runs (
    id INTEGER PRIMARY KEY,
    workload TEXT NOT NULL,
    config TEXT NOT NULL,              -- JSON
    seed INTEGER NOT NULL DEFAULT 0,
    badge TEXT NOT NULL DEFAULT 'real',
    state TEXT NOT NULL DEFAULT 'running',
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE programs (
    id INTEGER PRIMARY KEY,
    run_id INTEGER NOT NULL REFERENCES runs(id),
    parent_id INTEGER REFERENCES programs(id),
    second_parent_id INTEGER REFERENCES programs(id),
    source TEXT NOT NULL,
    name TEXT NOT NULL DEFAULT '',
    rationale TEXT NOT NULL DEFAULT '',
    code TEXT NOT NULL,
    code_hash TEXT NOT NULL,           -- sha256 hex of the UTF-8 code
    tags TEXT NOT NULL DEFAULT '[]',   -- JSON list
    knobs TEXT NOT NULL DEFAULT '{}',  -- JSON dict name -> value (strings, as in the knob block)
    cell TEXT,                         -- design-space cell key
    island INTEGER NOT NULL DEFAULT 0,
    generation INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL
);
CREATE INDEX programs_by_run ON programs(run_id, id);
CREATE INDEX programs_by_hash ON programs(run_id, code_hash);
CREATE INDEX programs_by_parent ON programs(parent_id);
CREATE TABLE proposals (
    id INTEGER PRIMARY KEY,
    run_id INTEGER NOT NULL REFERENCES runs(id),
    parent_id INTEGER REFERENCES programs(id),
    second_parent_id INTEGER REFERENCES programs(id),
    source TEXT NOT NULL,
    name TEXT NOT NULL,
    rationale TEXT NOT NULL,
    diff TEXT NOT NULL,
    code TEXT NOT NULL,                -- replaced by the human's code on an 'edited' decision
    original_code TEXT,                -- the proposed code, kept when an edit replaced it
    tags TEXT NOT NULL DEFAULT '[]',
    status TEXT NOT NULL DEFAULT 'pending',
    decided_by TEXT,
    decided_at REAL,
    note TEXT NOT NULL DEFAULT '',
    program_id INTEGER REFERENCES programs(id),
    created_at REAL NOT NULL
);
CREATE INDEX proposals_by_run ON proposals(run_id, status, id);
CREATE TABLE decisions (             -- audit trail: one row per decide() call
    id INTEGER PRIMARY KEY,
    proposal_id INTEGER NOT NULL REFERENCES proposals(id),
    decision TEXT NOT NULL,
    decided_by TEXT NOT NULL,
    note TEXT NOT NULL DEFAULT '',
    created_at REAL NOT NULL
);
CREATE INDEX decisions_by_proposal ON decisions(proposal_id);
CREATE TABLE evaluations (
    id INTEGER PRIMARY KEY,
    program_id INTEGER NOT NULL REFERENCES programs(id),
    run_id INTEGER NOT NULL REFERENCES runs(id),
    status TEXT NOT NULL DEFAULT 'in_flight',
    world_size INTEGER NOT NULL,
    backend TEXT NOT NULL,
    badge TEXT NOT NULL,
    request TEXT NOT NULL,             -- JSON of the EvalRequest
    level_reached TEXT,
    verdict TEXT,
    reason TEXT,
    median_ms REAL,
    spread_ms REAL,
    seed_median_ms REAL,
    speedup REAL,
    max_rel_err REAL,
    flagged INTEGER NOT NULL DEFAULT 0,
    iteration_ms TEXT,                 -- JSON list
    per_rank_median_ms TEXT,           -- JSON list
    logs TEXT,                         -- JSON dict
    provenance TEXT,                   -- JSON dict, as the evaluator gave it
    gpu TEXT, driver TEXT, cuda TEXT, nccl TEXT, mps INTEGER, git_rev TEXT,
    result TEXT,                       -- JSON of the whole EvalResult.to_dict()
    started_at REAL NOT NULL,
    finished_at REAL
);
CREATE INDEX evaluations_by_program ON evaluations(program_id, id);
CREATE INDEX evaluations_by_run ON evaluations(run_id, status);
CREATE INDEX evaluations_best ON evaluations(run_id, verdict, median_ms);
CREATE TABLE llm_calls (
    id INTEGER PRIMARY KEY,
    run_id INTEGER REFERENCES runs(id),
    model TEXT NOT NULL,
    purpose TEXT NOT NULL,
    prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    latency_s REAL NOT NULL,
    dollars REAL,                      -- NULL: price unknown
    ok INTEGER NOT NULL,
    error TEXT NOT NULL DEFAULT '',
    request_hash TEXT NOT NULL DEFAULT '',
    created_at REAL NOT NULL
);
CREATE INDEX llm_calls_by_run ON llm_calls(run_id);
CREATE TABLE meta (
    run_id INTEGER NOT NULL REFERENCES runs(id),
    key TEXT NOT NULL,
    value TEXT NOT NULL,               -- JSON
    updated_at REAL NOT NULL,
    PRIMARY KEY (run_id, key)
);
"""


def code_hash(code: str) -> str:
    """The sha256 hex digest stored as ``programs.code_hash``."""
    return hashlib.sha256(code.encode("utf-8")).hexdigest()


def table_names(conn: sqlite3.Connection) -> set[str]:
    rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")
    return {r[0] for r in rows}


def loads_lenient(text: str | None, default: Any) -> Any:
    """Legacy JSON that does not parse is kept, wrapped, rather than lost."""
    if text is None:
        return default
    try:
        return json.loads(text)
    except ValueError:
        return {"_raw": text}


def _migrate_0_to_1(conn: sqlite3.Connection) -> None:
    legacy = table_names(conn) & set(V0_TABLES)
    # Rows are copied in id order and a parent may point anywhere: check references once, at COMMIT.
    conn.execute("PRAGMA defer_foreign_keys = ON")
    if legacy:
        for t in legacy:
            conn.execute(f"ALTER TABLE {t} RENAME TO _v0_{t}")
    for stmt in _split_sql(_V1_LAYOUT):
        conn.execute(stmt)
    if not legacy:
        return
    # Copied in Python, not SQL: the code hash and the result's fields need parsing SQLite cannot do.
    program_run: dict[int, int] = {}
    if "runs" in legacy:
        for rid, workload, config, created in conn.execute(
                "SELECT id, workload, config, created_at FROM _v0_runs ORDER BY id").fetchall():
            cfg = loads_lenient(config, {})
            conn.execute("INSERT INTO runs (id, workload, config, seed, badge, state, created_at, updated_at) "
                         "VALUES (?, ?, ?, 0, 'real', 'stopped', ?, ?)",
                         (rid, workload, json.dumps(cfg), created, created))
    if "programs" in legacy:
        for pid, rid, parent, code, source, created in conn.execute(
                "SELECT id, run_id, parent_id, code, source, created_at FROM _v0_programs ORDER BY id").fetchall():
            program_run[pid] = rid
            conn.execute("INSERT INTO programs (id, run_id, parent_id, source, code, code_hash, created_at) "
                         "VALUES (?, ?, ?, ?, ?, ?, ?)", (pid, rid, parent, source, code, code_hash(code), created))
    if "evaluations" in legacy:
        for eid, pid, result, created in conn.execute(
                "SELECT id, program_id, result, created_at FROM _v0_evaluations ORDER BY id").fetchall():
            try:
                res = None if result is None else json.loads(result)
            except ValueError:
                res = {"_raw": result}
            # A v0 row without a (readable) result was in flight when its process died.
            status = "done" if isinstance(res, dict) and "verdict" in res else "interrupted"
            res = res if isinstance(res, dict) else {}
            prov = res["provenance"] if isinstance(res.get("provenance"), dict) else {}
            badge = res.get("badge") if res.get("badge") in BADGES else "real"
            try:
                world = int(prov.get("world") or 1)
            except (TypeError, ValueError):
                world = 1
            conn.execute("INSERT INTO evaluations (id, program_id, run_id, status, world_size, backend, badge, "
                         "request, result, started_at, finished_at) VALUES (?, ?, ?, ?, ?, ?, ?, '{}', ?, ?, ?)",
                         (eid, pid, program_run.get(pid), status, world, str(prov.get("backend", "")), badge,
                          json.dumps(res) if res else None, created, created if status == "done" else None))
            if status == "done":
                write_result(conn, eid, dict(res, provenance=prov, badge=badge), created)
    for t in legacy:
        conn.execute(f"DROP TABLE _v0_{t}")


def _split_sql(script: str) -> list[str]:
    # conn.executescript() commits first, which would break the one-transaction-per-migration guarantee.
    out, buf = [], []
    for line in script.splitlines():
        line = line.split("--", 1)[0]
        buf.append(line)
        if line.rstrip().endswith(";"):
            stmt = "\n".join(buf).strip()
            if stmt.rstrip(";").strip():
                out.append(stmt)
            buf = []
    return out


# MIGRATIONS[i] turns schema version i into i + 1; append, never edit a released one.
MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [_migrate_0_to_1]
assert len(MIGRATIONS) == SCHEMA_VERSION


def provenance_columns(prov: Mapping[str, Any]) -> dict[str, Any]:
    def text(*keys: str) -> str | None:
        for k in keys:
            if prov.get(k) is not None:
                return str(prov[k])
        return None

    mps = prov.get("mps")
    if isinstance(mps, str):
        mps = {"on": True, "true": True, "1": True, "yes": True,
               "off": False, "false": False, "0": False, "no": False}.get(mps.strip().lower())
    return {"gpu": text("gpu"), "driver": text("driver"), "cuda": text("cuda"), "nccl": text("nccl"),
            "mps": None if mps is None else int(bool(mps)), "git_rev": text("git", "git_rev", "git_revision")}


def write_result(conn: sqlite3.Connection, evaluation_id: int, result: Mapping[str, Any], now: float) -> None:
    prov = result.get("provenance") or {}
    if not isinstance(prov, Mapping):
        raise BadInput(f"evaluation {evaluation_id}: result['provenance'] must be a dict, got {type(prov).__name__}")
    cols: dict[str, Any] = {k: result.get(k) for k in RESULT_SCALARS}
    cols.update({k: (None if result.get(k) is None else json.dumps(result.get(k))) for k in RESULT_JSON})
    cols["flagged"] = int(bool(result.get("flagged", False)))
    cols.update(provenance_columns(prov))
    cols["result"] = json.dumps(dict(result))
    cols["status"] = "done"
    cols["finished_at"] = now
    if result.get("badge") is not None:
        cols["badge"] = result["badge"]
    sets = ", ".join(f"{k} = ?" for k in cols)
    conn.execute(f"UPDATE evaluations SET {sets} WHERE id = ?", (*cols.values(), evaluation_id))
