"""The database file itself: what is inspected before a connection may change it (SQLite or not, its schema
version, hard links), the switch to WAL, and the owner's lock file."""
from __future__ import annotations

import json
import os
import socket
import sqlite3
import time
from pathlib import Path

from cuco_kit.store.errors import StoreError
from cuco_kit.store.schema import SCHEMA_VERSION, V0_TABLES, table_names

_SQLITE_MAGIC = b"SQLite format 3\x00"


def file_version(conn: sqlite3.Connection, path: str) -> int:
    """The schema version of the file behind ``conn``; 0 for an empty file or the v0 layout."""
    tables = table_names(conn)
    if "schema_version" in tables:
        row = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
        return int(row[0] or 0)
    if tables and not tables & set(V0_TABLES):
        raise StoreError(f"store {path} holds tables {sorted(tables)} but none of a cuco store; "
                         "point --db at a new file or a cuco database")
    return 0


def newer_error(path: str, version: int) -> StoreError:
    return StoreError(f"store {path} has schema v{version}, newer than this cuco_kit (v{SCHEMA_VERSION}); "
                      "upgrade cuco_kit to open it")


def _read_version(path: Path, *, immutable: bool, pages: bool) -> int:
    # immutable=1 reads the main file alone and creates nothing (mode=ro on a WAL file would leave -wal and -shm
    # files behind); it is only right while no connection has the file open, i.e. while it has no -wal file.
    uri = path.resolve().as_uri() + ("?mode=ro&immutable=1" if immutable else "?mode=ro")
    conn = sqlite3.connect(uri, uri=True, timeout=30.0)
    try:
        version = file_version(conn, str(path))
        if version > SCHEMA_VERSION:
            raise newer_error(str(path), version)
        if pages:
            problems = [str(r[0]) for r in conn.execute("PRAGMA quick_check")]
            if problems != ["ok"]:
                raise StoreError(f"store {path} is damaged (SQLite's check: {problems[0]}"
                                 f"{f' and {len(problems) - 1} more' if len(problems) > 1 else ''}); restore it "
                                 "from a copy, or point --db at a new file")
        return version
    finally:
        conn.close()


def inspect_file(path: Path, *, pages: bool) -> None:
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


def switch_to_wal(conn: sqlite3.Connection, *, wait_s: float = 30.0) -> None:
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


def refuse_hard_links(path: Path) -> None:
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


def same_file(fd: int, path: Path) -> bool:
    """Whether ``fd`` is the file at ``path`` now (not one removed since it was opened)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return (own.st_dev, own.st_ino) == (st.st_dev, st.st_ino)


def owner_of(lock: Path, path: str) -> str:
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
