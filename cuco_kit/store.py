"""The run database: one SQLite file (WAL) per search holding runs, program lineage, proposals and decisions,
evaluations, the LLM ledger and per-run key/value metadata.

A run resumes from this file, so every write is its own committed transaction: once a method returns, the row
survives a killed process ("complete" means committed). Evaluations still ``in_flight`` after a kill are found
by :meth:`Store.mark_interrupted`, marked ``interrupted`` and re-run by the caller.

Schema versions
    ``SCHEMA_VERSION`` is the version this code writes. The ``schema_version`` table holds one row per applied
    migration (``version``, ``applied_at``); the file's version is the largest. ``MIGRATIONS[i]`` turns version
    ``i`` into ``i + 1``, each in one transaction, so a file is never left half-migrated. Version 0 is either an
    empty file or the prototype's unversioned layout (``V0_LAYOUT``: runs, programs, evaluations with the result
    as one JSON blob, no ``schema_version`` table). A file newer than this code is refused, never touched.

Enumerations (run state, program source, badge, proposal status, evaluation status) are checked here in Python,
not with SQL CHECK constraints, so a later version can add a value without rebuilding a table.

Provenance (table ``evaluations``)
    ``provenance`` keeps the evaluator's dict as JSON, unchanged. Its well-known keys are copied into their own
    columns so they can be filtered and grouped in SQL: ``gpu`` (TEXT, e.g. "NVIDIA H200"), ``driver`` (TEXT),
    ``cuda`` (TEXT), ``nccl`` (TEXT), ``mps`` (INTEGER 0/1, NULL = unknown), ``git_rev`` (TEXT, from the
    provenance key ``git``; ``git_rev`` / ``git_revision`` are accepted too) and ``badge`` (TEXT: real, replayed,
    simulated or unmeasured; the result's badge wins over the one given at start). Per-rank timings are
    ``per_rank_median_ms`` and ``iteration_ms`` (JSON lists); ``logs`` is a JSON dict of log tails; ``result``
    keeps the whole ``EvalResult.to_dict()`` so fields added later are not lost.

Refused files: an existing file is inspected before any connection can change it (a writable connection switches
it to WAL at once): one that is not SQLite, holds foreign tables, has a newer schema or -- opened for writing --
fails SQLite's quick_check is refused with one line and left as it was, byte for byte, with no -wal or -shm file
next to it. A statement that meets a damaged page later raises :class:`StoreError` (one line), not SQLite's error.

One owner: a search drives its runs as the database's owner (:meth:`Store.acquire_owner`): an OS file lock
(flock) on ``<real path>.lock``, next to the file the path leads to (symlinks resolved), so every path to one
file -- a symlink, a relative path, another mount of the folder -- meets the same lock. The lock file names the
owner's pid and host for the refusal a second search gets, and is removed when the owner lets go. The kernel drops
the lock when the owner dies, even by kill -9, so a resume is never blocked by a dead owner (its file, left
behind, is taken over). Read-only Stores (dashboards, reports) need no lock and may look while the owner writes.

One name: SQLite keeps its journal (``-wal``, ``-shm``) beside the name a file was opened by, so two writers
through two hard links of one file write two journals and corrupt it. A file with more than one hard link is
refused for writing, with one line, before any connection opens it.

Threads: one connection guarded by a re-entrant lock, so one writer thread and any number of reader threads may
share a ``Store``; :meth:`Store.transaction` groups writes into one commit. Other processes (a CLI looking at a
running search) open their own ``Store``; WAL lets them read while the search writes.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypedDict, cast

from cuco_kit.errors import BadInput, CucoError

SCHEMA_VERSION = 1

RUN_STATES = ("running", "paused", "stopped", "finished")
PROGRAM_SOURCES = ("seed", "baseline", "llm_diff", "llm_full", "llm_crossover", "design_space", "human",
                   "fastpath")
BADGES = ("real", "replayed", "simulated", "unmeasured")
PROPOSAL_STATUSES = ("pending", "approved", "rejected", "edited")
DECISIONS = ("approved", "rejected", "edited")
EVALUATION_STATUSES = ("in_flight", "done", "interrupted")

# Result fields with a column of their own; the rest of EvalResult.to_dict() lives in the `result` JSON copy.
_RESULT_SCALARS = ("level_reached", "verdict", "reason", "median_ms", "spread_ms", "seed_median_ms", "speedup",
                   "max_rel_err")
_RESULT_JSON = ("iteration_ms", "per_rank_median_ms", "logs", "provenance")


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


class StoreError(CucoError):
    """The database file cannot be used as it is (not SQLite, newer schema, read-only, foreign layout)."""


class NotFound(CucoError):
    """A run, program, proposal or evaluation id that is not in the store."""


# The prototype's unversioned layout. Kept so the 0 -> 1 migration has something real to be tested against.
V0_LAYOUT = """
CREATE TABLE runs (id INTEGER PRIMARY KEY, workload TEXT NOT NULL, config TEXT NOT NULL,
                   created_at REAL NOT NULL);
CREATE TABLE programs (id INTEGER PRIMARY KEY, run_id INTEGER NOT NULL, parent_id INTEGER, code TEXT NOT NULL,
                       source TEXT NOT NULL, created_at REAL NOT NULL);
CREATE TABLE evaluations (id INTEGER PRIMARY KEY, program_id INTEGER NOT NULL, result TEXT,
                          created_at REAL NOT NULL);
"""
_V0_TABLES = ("runs", "programs", "evaluations")

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


def _tables(conn: sqlite3.Connection) -> set[str]:
    rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")
    return {r[0] for r in rows}


def _loads_lenient(text: str | None, default: Any) -> Any:
    """Legacy JSON that does not parse is kept, wrapped, rather than lost."""
    if text is None:
        return default
    try:
        return json.loads(text)
    except ValueError:
        return {"_raw": text}


def _migrate_0_to_1(conn: sqlite3.Connection) -> None:
    legacy = _tables(conn) & set(_V0_TABLES)
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
            cfg = _loads_lenient(config, {})
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
                _write_result(conn, eid, dict(res, provenance=prov, badge=badge), created)
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


def _provenance_columns(prov: Mapping[str, Any]) -> dict[str, Any]:
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


def _write_result(conn: sqlite3.Connection, evaluation_id: int, result: Mapping[str, Any], now: float) -> None:
    prov = result.get("provenance") or {}
    if not isinstance(prov, Mapping):
        raise BadInput(f"evaluation {evaluation_id}: result['provenance'] must be a dict, got {type(prov).__name__}")
    cols: dict[str, Any] = {k: result.get(k) for k in _RESULT_SCALARS}
    cols.update({k: (None if result.get(k) is None else json.dumps(result.get(k))) for k in _RESULT_JSON})
    cols["flagged"] = int(bool(result.get("flagged", False)))
    cols.update(_provenance_columns(prov))
    cols["result"] = json.dumps(dict(result))
    cols["status"] = "done"
    cols["finished_at"] = now
    if result.get("badge") is not None:
        cols["badge"] = result["badge"]
    sets = ", ".join(f"{k} = ?" for k in cols)
    conn.execute(f"UPDATE evaluations SET {sets} WHERE id = ?", (*cols.values(), evaluation_id))


def _check(value: Any, allowed: Sequence[str], what: str) -> None:
    if value not in allowed:
        raise BadInput(f"{what} {value!r} is not one of {', '.join(allowed)}")


def _json(value: Any, what: str) -> str:
    try:
        return json.dumps(value, sort_keys=True)
    except (TypeError, ValueError) as e:
        raise BadInput(f"{what} must be JSON-serialisable (plain dicts, lists, str, numbers): {e}") from None


_SQLITE_MAGIC = b"SQLite format 3\x00"


def _file_version(conn: sqlite3.Connection, path: str) -> int:
    """The schema version of the file behind ``conn``; 0 for an empty file or the v0 layout."""
    tables = _tables(conn)
    if "schema_version" in tables:
        row = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
        return int(row[0] or 0)
    if tables and not tables & set(_V0_TABLES):
        raise StoreError(f"store {path} holds tables {sorted(tables)} but none of a cuco store; "
                         "point --db at a new file or a cuco database")
    return 0


def _newer(path: str, version: int) -> StoreError:
    return StoreError(f"store {path} has schema v{version}, newer than this cuco_kit (v{SCHEMA_VERSION}); "
                      "upgrade cuco_kit to open it")


def _read_version(path: Path, *, immutable: bool, pages: bool) -> int:
    # immutable=1 reads the main file alone and creates nothing (mode=ro on a WAL file would leave -wal and -shm
    # files behind); it is only right while no connection has the file open, i.e. while it has no -wal file.
    uri = path.resolve().as_uri() + ("?mode=ro&immutable=1" if immutable else "?mode=ro")
    conn = sqlite3.connect(uri, uri=True, timeout=30.0)
    try:
        version = _file_version(conn, str(path))
        if version > SCHEMA_VERSION:
            raise _newer(str(path), version)
        if pages:
            problems = [str(r[0]) for r in conn.execute("PRAGMA quick_check")]
            if problems != ["ok"]:
                raise StoreError(f"store {path} is damaged (SQLite's check: {problems[0]}"
                                 f"{f' and {len(problems) - 1} more' if len(problems) > 1 else ''}); restore it "
                                 "from a copy, or point --db at a new file")
        return version
    finally:
        conn.close()


def _inspect(path: Path, *, pages: bool) -> None:
    """Refuse an existing file this code must not open -- not SQLite, a foreign layout, a newer schema, damaged
    pages (``pages``: PRAGMA quick_check) -- before anything touches it: a refused file keeps its bytes and mtime,
    and no -wal or -shm file is left next to it."""
    try:
        with path.open("rb") as f:
            head = f.read(len(_SQLITE_MAGIC))
    except OSError as e:
        raise StoreError(f"store {path} cannot be read ({e.strerror}); point --db at a readable file") from None
    if not head:
        return  # an empty file is a new store
    if head != _SQLITE_MAGIC:
        raise StoreError(f"store {path} cannot be opened as SQLite (it is not a SQLite file); "
                         "is it a cuco database?")
    wal = Path(f"{os.path.realpath(path)}-wal")  # SQLite keeps it beside the file a symlink leads to
    try:
        try:
            _read_version(path, immutable=not wal.exists(), pages=pages)
        except sqlite3.DatabaseError:
            if not wal.exists():
                raise
            # A writer opened it while the main file was read alone: read it again, through its WAL.
            _read_version(path, immutable=False, pages=pages)
    except sqlite3.DatabaseError as e:
        raise StoreError(f"store {path} cannot be opened as SQLite ({e}); if it is a damaged cuco database, "
                         "restore it from a copy, or point --db at a new file") from None


def _switch_to_wal(conn: sqlite3.Connection, *, wait_s: float = 30.0) -> None:
    """Put the file in WAL mode. SQLite answers "database is locked" at once, without its busy handler, when
    another connection is switching the same fresh file at that moment; so wait for it here, as a busy
    timeout would."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def owner_lock_path(path: str | Path) -> Path:
    """The owner lock of the database at ``path``: ``<real path>.lock``, the same file for every path that leads
    to the database (symlinks resolved; through another mount of its folder it is the same folder)."""
    return Path(f"{os.path.realpath(path)}.lock")


def _refuse_hard_links(path: Path) -> None:
    """StoreError unless ``path`` is the file's only name: SQLite keeps a journal beside each name, so writers
    through two names of one file write two journals and corrupt it."""
    try:
        links = os.stat(path).st_nlink
    except OSError as e:
        raise StoreError(f"store {path} cannot be read ({e.strerror}); point --db at a readable file") from None
    if links > 1:
        raise StoreError(f"store {path} is one of {links} names (hard links) of one file; SQLite keeps a journal "
                         "beside each name, so writing through two names corrupts it: keep one name (remove the "
                         "other links, or copy the file) and open that")


def _same_file(fd: int, path: Path) -> bool:
    """Whether ``fd`` is the file at ``path`` now (not one removed since it was opened)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return (own.st_dev, own.st_ino) == (st.st_dev, st.st_ino)


def _owner_of(lock: Path, path: str) -> str:
    """The one-line refusal naming the process that owns ``path`` (from its lock file)."""
    try:
        info = json.loads(lock.read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError):
        info = {}
    pid, host, what = info.get("pid", "unknown"), info.get("host", "unknown"), info.get("what", "search")
    who = (f"another {what} in this process (pid {pid})" if pid == os.getpid() and host == socket.gethostname()
           else f"pid {pid} on host {host}, running a {what}")
    since = info.get("since")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since)) if isinstance(since, (int, float)) else "?"
    owner_path = info.get("path")
    via = (f" (opened as {owner_path})" if isinstance(owner_path, str) and owner_path != os.path.abspath(path)
           else "")
    return (f"store {path} is in use{via} by {who} since {when}; one search at a time per database: wait for it to "
            "end or stop it, or look at it read-only (Store(path, readonly=True), or a notebook dashboard)")


class Store:
    """The run database. ``Store(":memory:")`` gives a private in-memory store (tests, smoke runs)."""

    def __init__(self, path: str | Path, *, readonly: bool = False) -> None:
        self.path = str(path)
        self.readonly = readonly
        self._lock = threading.RLock()
        self._depth = 0  # open transactions (transaction() and the write methods' own nest into one)
        self._owner_fd: int | None = None  # the lock file, while this Store owns the database
        memory = self.path == ":memory:"
        if readonly and memory:
            raise BadInput("a read-only store needs a file: ':memory:' would always be empty")
        if not memory:
            p = Path(self.path)
            if readonly and not p.exists():
                raise StoreError(f"store {self.path} does not exist; nothing to open read-only")
            if not readonly and not p.parent.exists():
                raise BadInput(f"folder {p.parent} for store {self.path} does not exist; create it first")
            if p.is_file():
                if not readonly:
                    _refuse_hard_links(p)
                # Before any connection: switching a refused file to WAL would already have changed it.
                _inspect(p, pages=not readonly)
        try:
            if readonly:
                uri = Path(self.path).resolve().as_uri() + "?mode=ro"
                self._conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False,
                                             timeout=30.0)
            else:
                self._conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False,
                                             timeout=30.0)
            self._conn.row_factory = sqlite3.Row
            self._conn.execute("PRAGMA foreign_keys = ON")
            if not readonly:
                # WAL: readers in other threads/processes never block on the writer. NORMAL sync in WAL keeps
                # every commit across a killed process (what resume needs); only power loss can drop the tail.
                _switch_to_wal(self._conn)
                self._conn.execute("PRAGMA synchronous = NORMAL")
            self._open_schema()
        except sqlite3.DatabaseError as e:
            conn = getattr(self, "_conn", None)
            if conn is not None:
                conn.close()
            raise StoreError(f"store {self.path} cannot be opened as SQLite ({e}); is it a cuco database?") from None
        except BaseException:
            conn = getattr(self, "_conn", None)
            if conn is not None:
                conn.close()
            raise

    # ---- schema -------------------------------------------------------------------------------------------

    def _open_schema(self) -> None:
        version = _file_version(self._conn, self.path)
        if version > SCHEMA_VERSION:
            raise _newer(self.path, version)
        if version == SCHEMA_VERSION:
            return
        if self.readonly:
            raise StoreError(f"store {self.path} has schema v{version} and needs migrating to v{SCHEMA_VERSION}; "
                             "open it once without readonly=True")
        while True:
            # IMMEDIATE takes the write lock first, so two processes opening a fresh file migrate it once.
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                version = _file_version(self._conn, self.path)
                if version >= SCHEMA_VERSION:
                    self._conn.execute("COMMIT")
                    return
                MIGRATIONS[version](self._conn)
                if "schema_version" not in _tables(self._conn):
                    self._conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL, "
                                       "applied_at REAL NOT NULL)")
                self._conn.execute("INSERT INTO schema_version (version, applied_at) VALUES (?, ?)",
                                   (version + 1, time.time()))
                self._conn.execute("COMMIT")
            except sqlite3.DatabaseError as e:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise StoreError(f"store {self.path}: migrating schema v{version} to v{version + 1} failed ({e}); "
                                 "the file was left unchanged") from None
            except BaseException:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise

    def schema_version(self) -> int:
        with self._lock:
            return _file_version(self._conn, self.path)

    def journal_mode(self) -> str:
        with self._lock:
            return str(self._conn.execute("PRAGMA journal_mode").fetchone()[0])

    # ---- plumbing -----------------------------------------------------------------------------------------

    def close(self) -> None:
        with self._lock:
            self.release_owner()
            self._conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _failed(self, e: sqlite3.DatabaseError) -> Exception:
        """What a failed statement means for the user, as one line; a ProgrammingError (a mistake in this code, or
        a closed Store) stays what it is."""
        if isinstance(e, sqlite3.ProgrammingError):
            return e
        if isinstance(e, sqlite3.IntegrityError):
            return BadInput(f"store {self.path}: {e} (an id that does not exist?)")
        return StoreError(f"store {self.path} cannot be used ({e}); if the file is damaged, restore it from a copy, "
                          "or point --db at a new file")

    def _rows(self, sql: str, args: Sequence[Any] = ()) -> list[sqlite3.Row]:
        with self._lock:
            try:
                return self._conn.execute(sql, args).fetchall()
            except sqlite3.DatabaseError as e:
                raise self._failed(e) from None

    def _write(self, sql: str, args: Sequence[Any] = ()) -> int:
        """One statement, committed at once (autocommit; inside :meth:`transaction`, part of it). Returns
        lastrowid."""
        if self.readonly:
            raise StoreError(f"store {self.path} was opened read-only; open it with readonly=False to write")
        with self._lock:
            try:
                return int(self._conn.execute(sql, args).lastrowid or 0)
            except sqlite3.DatabaseError as e:
                raise self._failed(e) from None

    def _tx(self) -> _Tx:
        if self.readonly:
            raise StoreError(f"store {self.path} was opened read-only; open it with readonly=False to write")
        return _Tx(self)

    def transaction(self) -> _Tx:
        """``with store.transaction():`` -- the write calls inside commit together: after a kill, all of them are
        in the file or none is. Other threads' calls wait until it ends."""
        return self._tx()

    # ---- ownership ----------------------------------------------------------------------------------------

    def acquire_owner(self, what: str = "search") -> None:
        """Make this Store the database's owner -- the one search driving runs in it -- until
        :meth:`release_owner` (or ``close()``). The lock is an OS file lock (flock) on ``<real path>.lock``
        (:func:`owner_lock_path`: one lock whatever path led to the file), so the
        kernel drops it when the owning process dies, even by kill -9; the file names the owner (pid, host,
        since). Raises :class:`StoreError` naming the owner when another process, or another Store of this one,
        holds it. Read-only Stores never need it."""
        if self.readonly:
            raise StoreError(f"store {self.path} was opened read-only; open it with readonly=False to write")
        with self._lock:
            if self._owner_fd is not None:
                raise StoreError(f"store {self.path} is already owned through this Store (another search on it is "
                                 "running); stop that one first")
            if self.path == ":memory:":
                self._owner_fd = -1  # private to this Store: nobody else can write it
                return
            _refuse_hard_links(Path(self.path))  # a link made since this Store opened the file
            lock = self._lock_path()
            while True:
                try:
                    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
                except OSError as e:
                    raise StoreError(f"store {self.path}: cannot create its lock file {lock} ({e.strerror}); the "
                                     "folder must be writable") from None
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    if _same_file(fd, lock):
                        info = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time(),
                                "what": what, "path": os.path.abspath(self.path)}
                        os.ftruncate(fd, 0)
                        os.pwrite(fd, json.dumps(info).encode("utf-8"), 0)
                        break
                    os.close(fd)  # the owner before us removed it as we opened it: lock the one there now
                except BlockingIOError:
                    os.close(fd)
                    raise StoreError(_owner_of(lock, self.path)) from None
                except OSError as e:
                    os.close(fd)
                    raise StoreError(f"store {self.path}: cannot lock {lock} ({e.strerror})") from None
            self._owner_fd = fd

    def release_owner(self) -> None:
        """Stop owning the database (nothing happens if this Store does not own it)."""
        with self._lock:
            fd, self._owner_fd = self._owner_fd, None
            if fd is None or fd < 0:
                return
            # Removed while still locked (an opener checks it locked the file that is there), then unlocked.
            with contextlib.suppress(OSError):
                os.unlink(self._lock_path())
            os.close(fd)

    def _lock_path(self) -> Path:
        return owner_lock_path(self.path)

    def _one(self, table: str, row_id: int, what: str) -> sqlite3.Row:
        rows = self._rows(f"SELECT * FROM {table} WHERE id = ?", (row_id,))
        if not rows:
            raise NotFound(f"no {what} {row_id} in store {self.path}")
        return rows[0]

    # ---- runs ---------------------------------------------------------------------------------------------

    def create_run(self, *, workload: str, config: dict[str, Any], seed: int = 0, badge: str = "real") -> int:
        _check(badge, BADGES, "badge")
        now = time.time()
        return self._write("INSERT INTO runs (workload, config, seed, badge, state, created_at, updated_at) "
                           "VALUES (?, ?, ?, ?, 'running', ?, ?)",
                           (workload, _json(config, "run config"), int(seed), badge, now, now))

    @staticmethod
    def _run_dict(r: sqlite3.Row) -> RunRow:
        d = dict(r)
        d["config"] = json.loads(d["config"])
        return cast(RunRow, d)

    def run(self, run_id: int) -> RunRow:
        return self._run_dict(self._one("runs", run_id, "run"))

    def runs(self) -> list[RunRow]:
        return [self._run_dict(r) for r in self._rows("SELECT * FROM runs ORDER BY id")]

    def set_run_state(self, run_id: int, state: str) -> None:
        _check(state, RUN_STATES, "run state")
        self._one("runs", run_id, "run")
        self._write("UPDATE runs SET state = ?, updated_at = ? WHERE id = ?", (state, time.time(), run_id))

    # ---- programs -----------------------------------------------------------------------------------------

    def add_program(self, *, run_id: int, code: str, parent_id: int | None, source: str, name: str = "",
                    rationale: str = "", tags: Sequence[str] = (), knobs: Mapping[str, str] | None = None,
                    cell: str | None = None, island: int = 0, generation: int = 0,
                    second_parent_id: int | None = None) -> int:
        _check(source, PROGRAM_SOURCES, "program source")
        if isinstance(tags, str):
            raise BadInput(f"tags must be a sequence of strings, not the string {tags!r}")
        return self._write(
            "INSERT INTO programs (run_id, parent_id, second_parent_id, source, name, rationale, code, code_hash, "
            "tags, knobs, cell, island, generation, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (run_id, parent_id, second_parent_id, source, name, rationale, code, code_hash(code),
             _json(list(tags), "tags"), _json(dict(knobs or {}), "knobs"), cell, int(island), int(generation),
             time.time()))

    @staticmethod
    def _program_dict(r: sqlite3.Row) -> ProgramRow:
        d = dict(r)
        d["tags"] = json.loads(d["tags"])
        d["knobs"] = json.loads(d["knobs"])
        return cast(ProgramRow, d)

    def program(self, program_id: int) -> ProgramRow:
        return self._program_dict(self._one("programs", program_id, "program"))

    def programs(self, run_id: int) -> list[ProgramRow]:
        return [self._program_dict(r) for r in self._rows("SELECT * FROM programs WHERE run_id = ? ORDER BY id",
                                                          (run_id,))]

    def find_program_by_hash(self, run_id: int, code_hash: str) -> ProgramRow | None:
        rows = self._rows("SELECT * FROM programs WHERE run_id = ? AND code_hash = ? ORDER BY id LIMIT 1",
                          (run_id, code_hash))
        return self._program_dict(rows[0]) if rows else None

    # ---- proposals and decisions --------------------------------------------------------------------------

    def add_proposal(self, *, run_id: int, parent_id: int | None, source: str, name: str, rationale: str,
                     diff: str, code: str, tags: Sequence[str] = (), second_parent_id: int | None = None) -> int:
        _check(source, PROGRAM_SOURCES, "proposal source")
        if isinstance(tags, str):
            raise BadInput(f"tags must be a sequence of strings, not the string {tags!r}")
        return self._write(
            "INSERT INTO proposals (run_id, parent_id, second_parent_id, source, name, rationale, diff, code, tags, "
            "status, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 'pending', ?)",
            (run_id, parent_id, second_parent_id, source, name, rationale, diff, code, _json(list(tags), "tags"),
             time.time()))

    def decide(self, proposal_id: int, decision: str, *, by: str = "auto", note: str = "",
               code: str | None = None, program_id: int | None = None) -> None:
        """Record a decision on a pending proposal. 'edited' means approved with the human's ``code``, which
        replaces the proposal's code (the proposed code stays in ``original_code``). A proposal is decided once;
        link the program evaluated for it later with :meth:`link_program` if it did not exist yet."""
        _check(decision, DECISIONS, "decision")
        if decision == "edited" and code is None:
            raise BadInput(f"proposal {proposal_id}: an 'edited' decision needs the edited code (code=...)")
        if decision != "edited" and code is not None:
            raise BadInput(f"proposal {proposal_id}: code=... is only for an 'edited' decision, not {decision!r}")
        with self._tx() as conn:
            row = conn.execute("SELECT status FROM proposals WHERE id = ?", (proposal_id,)).fetchone()
            if row is None:
                raise NotFound(f"no proposal {proposal_id} in store {self.path}")
            if row["status"] != "pending":
                raise BadInput(f"proposal {proposal_id} was already decided ({row['status']}); it is decided once")
            now = time.time()
            if code is not None:
                conn.execute("UPDATE proposals SET original_code = code, code = ? WHERE id = ?", (code, proposal_id))
            conn.execute("UPDATE proposals SET status = ?, decided_by = ?, decided_at = ?, note = ?, "
                         "program_id = COALESCE(?, program_id) WHERE id = ?",
                         (decision, by, now, note, program_id, proposal_id))
            conn.execute("INSERT INTO decisions (proposal_id, decision, decided_by, note, created_at) "
                         "VALUES (?, ?, ?, ?, ?)", (proposal_id, decision, by, note, now))

    def link_program(self, proposal_id: int, program_id: int) -> None:
        """Point an approved/edited proposal at the program created for it."""
        self._one("proposals", proposal_id, "proposal")
        self._write("UPDATE proposals SET program_id = ? WHERE id = ?", (program_id, proposal_id))

    def decisions(self, proposal_id: int) -> list[DecisionRow]:
        rows = self._rows("SELECT * FROM decisions WHERE proposal_id = ? ORDER BY id", (proposal_id,))
        return [cast(DecisionRow, dict(r)) for r in rows]

    @staticmethod
    def _proposal_dict(r: sqlite3.Row) -> ProposalRow:
        d = dict(r)
        d["tags"] = json.loads(d["tags"])
        return cast(ProposalRow, d)

    def proposal(self, proposal_id: int) -> ProposalRow:
        return self._proposal_dict(self._one("proposals", proposal_id, "proposal"))

    def proposals(self, run_id: int, status: str | None = None) -> list[ProposalRow]:
        if status is None:
            rows = self._rows("SELECT * FROM proposals WHERE run_id = ? ORDER BY id", (run_id,))
        else:
            _check(status, PROPOSAL_STATUSES, "proposal status")
            rows = self._rows("SELECT * FROM proposals WHERE run_id = ? AND status = ? ORDER BY id",
                              (run_id, status))
        return [self._proposal_dict(r) for r in rows]

    # ---- evaluations --------------------------------------------------------------------------------------

    def start_evaluation(self, program_id: int, *, world_size: int, backend: str, badge: str,
                         request: dict[str, Any]) -> int:
        _check(badge, BADGES, "badge")
        run_id = self._one("programs", program_id, "program")["run_id"]
        return self._write(
            "INSERT INTO evaluations (program_id, run_id, status, world_size, backend, badge, request, started_at) "
            "VALUES (?, ?, 'in_flight', ?, ?, ?, ?, ?)",
            (program_id, run_id, int(world_size), backend, badge, _json(request, "evaluation request"),
             time.time()))

    def finish_evaluation(self, evaluation_id: int, result: dict[str, Any]) -> None:
        """Store ``EvalResult.to_dict()`` and mark the evaluation done. Only an in-flight evaluation finishes: a
        late result for one marked interrupted (its re-run is another evaluation) is refused."""
        for k in ("level_reached", "verdict"):
            if k not in result:
                raise BadInput(f"evaluation {evaluation_id}: result has no {k!r}; pass EvalResult.to_dict()")
        if result.get("badge") is not None:
            _check(result["badge"], BADGES, "result badge")
        _json(result, "evaluation result")
        with self._tx() as conn:
            row = conn.execute("SELECT status FROM evaluations WHERE id = ?", (evaluation_id,)).fetchone()
            if row is None:
                raise NotFound(f"no evaluation {evaluation_id} in store {self.path}")
            if row["status"] != "in_flight":
                raise BadInput(f"evaluation {evaluation_id} is {row['status']}, not in_flight; start a new one")
            _write_result(conn, evaluation_id, result, time.time())

    def mark_interrupted(self, run_id: int) -> list[int]:
        """Mark the run's in-flight evaluations interrupted (after a kill) and return their ids to re-run."""
        with self._tx() as conn:
            ids = [r[0] for r in conn.execute(
                "SELECT id FROM evaluations WHERE run_id = ? AND status = 'in_flight' ORDER BY id", (run_id,))]
            conn.execute("UPDATE evaluations SET status = 'interrupted', finished_at = ? "
                         "WHERE run_id = ? AND status = 'in_flight'", (time.time(), run_id))
        return ids

    @staticmethod
    def _evaluation_dict(r: sqlite3.Row) -> EvaluationRow:
        d = dict(r)
        d["request"] = json.loads(d["request"])
        for k in _RESULT_JSON:
            d[k] = None if d[k] is None else json.loads(d[k])
        d["result"] = None if d["result"] is None else json.loads(d["result"])
        d["flagged"] = bool(d["flagged"])
        d["mps"] = None if d["mps"] is None else bool(d["mps"])
        return cast(EvaluationRow, d)

    def evaluation(self, evaluation_id: int) -> EvaluationRow:
        return self._evaluation_dict(self._one("evaluations", evaluation_id, "evaluation"))

    def evaluations(self, run_id: int | None = None, program_id: int | None = None) -> list[EvaluationRow]:
        where, args = [], []
        if run_id is not None:
            where.append("run_id = ?")
            args.append(run_id)
        if program_id is not None:
            where.append("program_id = ?")
            args.append(program_id)
        sql = "SELECT * FROM evaluations" + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY id"
        return [self._evaluation_dict(r) for r in self._rows(sql, args)]

    def evaluation_summaries(self, run_id: int) -> list[dict[str, Any]]:
        """The run's evaluations without their result JSON (which carries timelines): id, program_id, status,
        world_size, badge, verdict, level_reached, started_at, finished_at and provenance (decoded), in id order.
        For views that refresh often and need only these."""
        rows = self._rows("SELECT id, program_id, status, world_size, badge, verdict, level_reached, started_at, "
                          "finished_at, provenance FROM evaluations WHERE run_id = ? ORDER BY id", (run_id,))
        return [{**dict(r), "provenance": _loads_lenient(r["provenance"], {})} for r in rows]

    def best(self, run_id: int, *, include_flagged: bool = False) -> BestRow | None:
        """The finished, passing evaluation with the lowest median_ms (ties: the earlier one), or None. Flagged
        results (implausible speed-ups) do not count until a human has looked, unless ``include_flagged``.
        Returns the evaluation's dict plus ``program`` (the program's dict) and, for convenience, ``code`` and
        ``name`` of that program."""
        sql = ("SELECT * FROM evaluations WHERE run_id = ? AND status = 'done' AND verdict = 'pass' "
               "AND median_ms IS NOT NULL" + ("" if include_flagged else " AND flagged = 0") +
               " ORDER BY median_ms, id LIMIT 1")
        rows = self._rows(sql, (run_id,))
        if not rows:
            return None
        ev = self._evaluation_dict(rows[0])
        prog = self.program(ev["program_id"])
        return cast(BestRow, {**ev, "program": prog, "code": prog["code"], "name": prog["name"]})

    # ---- LLM ledger ---------------------------------------------------------------------------------------

    def add_llm_call(self, *, run_id: int | None, model: str, purpose: str, prompt_tokens: int | None,
                     completion_tokens: int | None, latency_s: float, dollars: float | None, ok: bool,
                     error: str | None = "", request_hash: str = "") -> int:
        # A refused or failed call has no token counts: stored as 0, the ok/error columns say what happened.
        return self._write(
            "INSERT INTO llm_calls (run_id, model, purpose, prompt_tokens, completion_tokens, latency_s, dollars, "
            "ok, error, request_hash, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (run_id, model, purpose, int(prompt_tokens or 0), int(completion_tokens or 0), float(latency_s),
             None if dollars is None else float(dollars), int(bool(ok)), error or "", request_hash, time.time()))

    def llm_calls(self, run_id: int | None = None) -> list[LLMCallRow]:
        if run_id is None:
            rows = self._rows("SELECT * FROM llm_calls ORDER BY id")
        else:
            rows = self._rows("SELECT * FROM llm_calls WHERE run_id = ? ORDER BY id", (run_id,))
        return [cast(LLMCallRow, {**dict(r), "ok": bool(r["ok"])}) for r in rows]

    def llm_dollars(self, run_id: int | None = None) -> float:
        """Dollars spent (calls of unknown price count as 0). ``run_id=None``: over every call in the file."""
        if run_id is None:
            rows = self._rows("SELECT TOTAL(dollars) FROM llm_calls")
        else:
            rows = self._rows("SELECT TOTAL(dollars) FROM llm_calls WHERE run_id = ?", (run_id,))
        return float(rows[0][0])

    # ---- per-run key/value --------------------------------------------------------------------------------

    def put_meta(self, run_id: int, key: str, value: Any) -> None:
        self._write("INSERT INTO meta (run_id, key, value, updated_at) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT(run_id, key) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at",
                    (run_id, key, _json(value, f"meta value {key!r}"), time.time()))

    def get_meta(self, run_id: int, key: str, default: Any = None) -> Any:
        rows = self._rows("SELECT value FROM meta WHERE run_id = ? AND key = ?", (run_id, key))
        return json.loads(rows[0][0]) if rows else default

    def meta_keys(self, run_id: int) -> list[str]:
        return [r[0] for r in self._rows("SELECT key FROM meta WHERE run_id = ? ORDER BY key", (run_id,))]


class _Tx:
    """A multi-statement write as one committed transaction, under the store's lock. Nested ones join the
    outermost, which commits (or rolls back) them all."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def __enter__(self) -> sqlite3.Connection:
        st = self._store
        st._lock.acquire()
        if st._depth == 0:
            try:
                st._conn.execute("BEGIN IMMEDIATE")
            except sqlite3.DatabaseError as e:
                st._lock.release()
                raise st._failed(e) from None
            except BaseException:
                st._lock.release()
                raise
        st._depth += 1
        return st._conn

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: object) -> None:
        st = self._store
        st._depth -= 1
        try:
            if st._depth == 0:
                if exc_type is None:
                    try:
                        st._conn.execute("COMMIT")
                    except sqlite3.DatabaseError as e:
                        if st._conn.in_transaction:
                            st._conn.execute("ROLLBACK")
                        raise st._failed(e) from None
                elif st._conn.in_transaction:
                    st._conn.execute("ROLLBACK")
            if isinstance(exc, sqlite3.DatabaseError):
                raise st._failed(exc) from None
        finally:
            st._lock.release()
