"""The ``Store``: every read and write of the run database, each its own committed transaction."""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sqlite3
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from cuco_kit.errors import BadInput
from cuco_kit.store.errors import NotFound, StoreError
from cuco_kit.store.files import (
    file_version,
    inspect_file,
    newer_error,
    owner_lock_path,
    owner_of,
    refuse_hard_links,
    same_file,
    switch_to_wal,
)
from cuco_kit.store.rows import (
    BADGES,
    DECISIONS,
    PROGRAM_SOURCES,
    PROPOSAL_STATUSES,
    RUN_STATES,
    BestRow,
    DecisionRow,
    EvaluationRow,
    LLMCallRow,
    ProgramRow,
    ProposalRow,
    RunRow,
)
from cuco_kit.store.schema import (
    MIGRATIONS,
    RESULT_JSON,
    SCHEMA_VERSION,
    code_hash,
    loads_lenient,
    table_names,
    write_result,
)


def _check(value: Any, allowed: Sequence[str], what: str) -> None:
    if value not in allowed:
        raise BadInput(f"{what} {value!r} is not one of {', '.join(allowed)}")


def _json(value: Any, what: str) -> str:
    try:
        return json.dumps(value, sort_keys=True)
    except (TypeError, ValueError) as e:
        raise BadInput(f"{what} must be JSON-serialisable (plain dicts, lists, str, numbers): {e}") from None


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
                    refuse_hard_links(p)
                # Before any connection: switching a refused file to WAL would already have changed it.
                inspect_file(p, pages=not readonly)
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
                switch_to_wal(self._conn)
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
        version = file_version(self._conn, self.path)
        if version > SCHEMA_VERSION:
            raise newer_error(self.path, version)
        if version == SCHEMA_VERSION:
            return
        if self.readonly:
            raise StoreError(f"store {self.path} has schema v{version} and needs migrating to v{SCHEMA_VERSION}; "
                             "open it once without readonly=True")
        while True:
            # IMMEDIATE takes the write lock first, so two processes opening a fresh file migrate it once.
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                version = file_version(self._conn, self.path)
                if version >= SCHEMA_VERSION:
                    self._conn.execute("COMMIT")
                    return
                MIGRATIONS[version](self._conn)
                if "schema_version" not in table_names(self._conn):
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
            return file_version(self._conn, self.path)

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
            refuse_hard_links(Path(self.path))  # a link made since this Store opened the file
            lock = self._lock_path()
            while True:
                try:
                    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
                except OSError as e:
                    raise StoreError(f"store {self.path}: cannot create its lock file {lock} ({e.strerror}); the "
                                     "folder must be writable") from None
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    if same_file(fd, lock):
                        info = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time(),
                                "what": what, "path": os.path.abspath(self.path)}
                        os.ftruncate(fd, 0)
                        os.pwrite(fd, json.dumps(info).encode("utf-8"), 0)
                        break
                    os.close(fd)  # the owner before us removed it as we opened it: lock the one there now
                except BlockingIOError:
                    os.close(fd)
                    raise StoreError(owner_of(lock, self.path)) from None
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
            write_result(conn, evaluation_id, result, time.time())

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
        for k in RESULT_JSON:
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
        return [{**dict(r), "provenance": loads_lenient(r["provenance"], {})} for r in rows]

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
