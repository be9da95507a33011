"""Faults at the run database: files the store refuses stay byte for byte as they were (no WAL switch, no -wal or
-shm files left), damaged pages and a --db in a missing folder give one line before anything is evaluated, and
one process owns a database at a time -- the lock goes with the owner, also when it is killed with kill -9."""
from __future__ import annotations

import os
import random
import signal
import socket
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from cuco_kit.cli import main
from cuco_kit.evaluate import gpu_evaluator
from cuco_kit.search.synthetic import write_synthetic_workload
from cuco_kit.store import SCHEMA_VERSION, Store, StoreError, owner_lock_path

ROOT = Path(__file__).resolve().parents[3]


def _snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file in ``folder``: its bytes and mtime (ns)."""
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(folder.iterdir())}


def _future_schema(path: Path, *, wal: bool) -> None:
    with Store(path) as s:
        s.create_run(workload="w", config={})
    conn = sqlite3.connect(path)
    conn.execute("INSERT INTO schema_version VALUES (?, 0)", (SCHEMA_VERSION + 1,))
    if not wal:
        conn.execute("PRAGMA journal_mode = DELETE")
    conn.commit()
    conn.close()


def _foreign(path: Path, *, wal: bool) -> None:
    conn = sqlite3.connect(path)
    if wal:
        conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("CREATE TABLE customers (id INTEGER, name TEXT)")
    conn.executemany("INSERT INTO customers VALUES (?, ?)", [(i, f"c{i}") for i in range(50)])
    conn.commit()
    conn.close()


def _damaged(path: Path) -> None:
    """A cuco store whose last pages (programs' rows) are overwritten with seeded noise; the schema is intact."""
    with Store(path) as s:
        rid = s.create_run(workload="w", config={})
        for i in range(40):
            s.add_program(run_id=rid, code=f"// program {i}\n" + "x" * 900, parent_id=None, source="human")
    data = bytearray(path.read_bytes())
    page = int.from_bytes(data[16:18], "big")
    assert len(data) >= 30 * page
    noise = random.Random(5)
    data[-5 * page:] = bytes(noise.getrandbits(8) for _ in range(5 * page))
    path.write_bytes(bytes(data))


def _junk(path: Path) -> None:
    path.write_bytes(b"this is not a database at all\n" * 100)


REFUSED: dict[str, tuple[Callable[[Path], None], str]] = {
    "future schema": (lambda p: _future_schema(p, wal=False), "newer than"),
    "future schema, WAL": (lambda p: _future_schema(p, wal=True), "newer than"),
    "foreign SQLite": (lambda p: _foreign(p, wal=False), "none of a cuco store"),
    "foreign SQLite, WAL": (lambda p: _foreign(p, wal=True), "none of a cuco store"),
    "not SQLite": (_junk, "not a SQLite file"),
    "damaged pages": (_damaged, "damaged"),
}


@pytest.mark.parametrize("kind", list(REFUSED))
def test_a_refused_file_is_left_untouched(tmp_path: Path, kind: str) -> None:
    make, why = REFUSED[kind]
    folder = tmp_path / "runs"
    folder.mkdir()
    path = folder / "run.db"
    make(path)
    before = _snapshot(folder)
    assert list(before) == ["run.db"]
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))  # an mtime a rewrite could not keep by chance
    before = _snapshot(folder)
    for readonly in (False, True):
        if kind == "damaged pages" and readonly:
            continue  # a viewer does not check every page; a query that reads a bad one says so (below)
        with pytest.raises(StoreError, match=why) as err:
            Store(path, readonly=readonly)
        assert "\n" not in str(err.value)
        assert _snapshot(folder) == before, f"{kind}: the refused file (or its folder) changed"


def test_a_query_on_damaged_pages_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "run.db"
    _damaged(path)
    with Store(path, readonly=True) as ro, pytest.raises(StoreError, match="restore it from a copy") as err:
        ro.programs(1)
    assert "\n" not in str(err.value)


def _search(wl: Path, db: Path) -> list[str]:
    return ["search", str(wl), "--db", str(db), "--evaluator", "simulated", "--generations", "1", "--seed", "3"]


def test_cuco_search_on_damaged_pages_is_one_line_and_touches_nothing(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture) -> None:
    wl = write_synthetic_workload(tmp_path / "wl")
    folder = tmp_path / "runs"
    folder.mkdir()
    db = folder / "run.db"
    _damaged(db)
    before = _snapshot(folder)
    assert main(_search(wl, db)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and "damaged" in err, err
    assert _snapshot(folder) == before


def test_db_in_a_missing_folder_is_refused_before_any_evaluation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture) -> None:
    class NoEvaluation:
        def __init__(self, *a: object, **k: object) -> None:
            raise AssertionError("an evaluator was started before --db was checked")

    monkeypatch.setattr(gpu_evaluator, "GpuEvaluator", NoEvaluation)
    wl = write_synthetic_workload(tmp_path / "wl")
    missing = tmp_path / "no" / "such" / "run.db"
    assert main(_search(wl, missing)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not exist" in err
    assert main(["eval", str(wl / "baseline.cu"), "--workload", str(wl), "--db", str(missing)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not exist" in err
    assert not (tmp_path / "no").exists()


HOLDER = textwrap.dedent("""
    import subprocess, sys, time
    from cuco_kit.store import Store
    st = Store(sys.argv[1])
    st.acquire_owner("test holder")
    # A child that outlives the owner (a rank process, say) must not keep the lock: even with close_fds=False
    # the lock's descriptor is not inherited.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], close_fds=False)
    print(child.pid, flush=True)
    time.sleep(120)
""")


def test_one_owner_at_a_time_and_kill_9_frees_it(tmp_path: Path) -> None:
    db = tmp_path / "run.db"
    with Store(db) as s:
        rid = s.create_run(workload="w", config={})
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(db)], cwd=ROOT, stdout=subprocess.PIPE,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    grandchild = 0
    try:
        assert holder.stdout is not None
        grandchild = int(holder.stdout.readline())
        with Store(db) as second:
            with pytest.raises(StoreError) as err:
                second.acquire_owner()
            line = str(err.value)
            assert f"pid {holder.pid} on host {socket.gethostname()}" in line and "read-only" in line
            assert "\n" not in line
            second.put_meta(rid, "note", "a write that is no search")  # only driving a run needs the lock
        with Store(db, readonly=True) as ro:  # a viewer needs no lock
            assert ro.run(rid)["workload"] == "w"
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
        assert holder.returncode == -signal.SIGKILL
        lock = owner_lock_path(db)
        assert str(holder.pid) in lock.read_text()  # left behind by the dead owner, still naming it
        first = Store(db)
        first.acquire_owner()  # the kernel dropped the dead owner's lock, though its child still runs
        os.kill(grandchild, 0)
    finally:
        if holder.poll() is None:
            holder.kill()
        if grandchild:
            os.kill(grandchild, signal.SIGKILL)
    assert str(os.getpid()) in lock.read_text()
    with Store(db) as other, pytest.raises(StoreError, match="another search in this process"):
        other.acquire_owner()
    with pytest.raises(StoreError, match="already owned through this Store"):
        first.acquire_owner()
    first.close()  # closing releases it
    assert not lock.exists()  # removed by the owner that let go
    with Store(db) as again:
        again.acquire_owner()
        again.release_owner()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.db"]


# The first search of the two below: a child process that owns the database and evaluates (0.1 s each) until the
# test tells it to stop, so the second starts while it writes. It says when it owns the file and how it ended.
FIRST_SEARCH = textwrap.dedent("""
    import sys
    from cuco_kit.evaluate.simulated import SimulatedEvaluator
    from cuco_kit.search.budget import BudgetConfig
    from cuco_kit.search.config import SearchConfig
    from cuco_kit.search.design_space import DesignSpaceConfig, DesignSpaceSource
    from cuco_kit.search.engine import SearchEngine
    from cuco_kit.store import Store
    with Store(sys.argv[2]) as st:
        engine = SearchEngine(sys.argv[1], st, SimulatedEvaluator(seed=1, delay_s=0.1),
                              [DesignSpaceSource(DesignSpaceConfig(sampler="random"))],
                              SearchConfig(seed=3, budget=BudgetConfig(generations=1000)))
        engine.start()  # set-up (the owner lock) happens before this returns
        print("OWNER", flush=True)
        sys.stdin.readline()
        engine.stop()
        engine.join()
        print("FINISHED", engine.state, engine.reason, flush=True)
""")


def _done(db: Path) -> int:
    with Store(db, readonly=True) as st:
        return sum(e["status"] == "done" for e in st.evaluations())


def _wait_for_evaluations(db: Path, n: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while _done(db) < n:
        assert time.monotonic() < deadline, f"the first search did not reach {n} evaluations"
        time.sleep(0.05)


@pytest.mark.parametrize("alias", ["symlink", "hard link"])
def test_a_second_search_through_a_link_is_refused_and_the_database_stays_whole(
        tmp_path: Path, alias: str, capsys: pytest.CaptureFixture) -> None:
    """Two searches on one database, the second through another name of the file: refused in one line (naming
    the owner where the lock can say who it is), while the first goes on writing; SQLite's integrity_check is ok
    afterwards and every evaluation of the first's run is done (none interrupted)."""
    wl = write_synthetic_workload(tmp_path / "wl")
    db = tmp_path / "run.db"
    Store(db).close()
    other = tmp_path / "sub" / "other.db"
    other.parent.mkdir()
    if alias == "symlink":
        other.symlink_to(db)
    first = subprocess.Popen([sys.executable, "-c", FIRST_SEARCH, str(wl), str(db)], cwd=ROOT, text=True,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert first.stdout is not None and first.stdin is not None
        assert first.stdout.readline().strip() == "OWNER", first.stderr.read() if first.stderr else ""
        _wait_for_evaluations(db, 3)  # the first is writing
        if alias == "hard link":
            os.link(db, other)
        assert main(_search(wl, other)) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err, err
        if alias == "symlink":
            assert f"pid {first.pid} on host {socket.gethostname()}" in err and f"opened as {db}" in err
        else:
            assert "2 names (hard links)" in err
        _wait_for_evaluations(db, _done(db) + 2)  # and goes on writing after the refusal
        out, errs = first.communicate("stop\n", timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode == 0, errs
    assert "FINISHED stopped stopped by request" in out, out + errs
    if alias == "hard link":
        os.unlink(other)
        assert not Path(f"{other}-wal").exists() and not Path(f"{other}-shm").exists()
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    finally:
        conn.close()
    with Store(db, readonly=True) as st:
        (run,) = st.runs()
        statuses = {e["status"] for e in st.evaluations(run["id"])}
        assert run["state"] == "stopped" and statuses == {"done"} and len(st.evaluations(run["id"])) >= 5
    assert not owner_lock_path(db).exists()


def test_every_path_to_one_file_meets_one_owner_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A relative path, a path with '..' and a symlink lead to one lock file, beside the real file."""
    (tmp_path / "a").mkdir()
    db = tmp_path / "a" / "run.db"
    (tmp_path / "link.db").symlink_to(db)
    monkeypatch.chdir(tmp_path)
    paths = [db, Path("a/run.db"), tmp_path / "a" / ".." / "a" / "run.db", Path("link.db")]
    assert {owner_lock_path(p) for p in paths} == {Path(f"{db.resolve()}.lock")}
    with Store(db) as first:
        first.acquire_owner()
        for p in paths[1:]:
            with Store(p) as second, pytest.raises(StoreError, match="another search in this process"):
                second.acquire_owner()


def test_a_file_with_two_names_is_refused_for_writing_but_may_be_read(tmp_path: Path) -> None:
    db = tmp_path / "run.db"
    with Store(db) as st:
        st.create_run(workload="w", config={})
    os.link(db, tmp_path / "copy.db")
    before = _snapshot(tmp_path)
    for name in ("run.db", "copy.db"):
        with pytest.raises(StoreError, match="one of 2 names") as err:
            Store(tmp_path / name)
        assert "\n" not in str(err.value)
    assert _snapshot(tmp_path) == before  # refused before any connection: no -wal or -shm file
    with Store(tmp_path / "copy.db", readonly=True) as ro:
        assert ro.runs()[0]["workload"] == "w"
