"""The run database: round trips, WAL, migrations, refusal of newer files, threads, resume, best, ledger."""
from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path

import pytest

from cuco_kit.errors import BadInput, CucoError
from cuco_kit.store import SCHEMA_VERSION, V0_LAYOUT, NotFound, Store, StoreError, code_hash


def _result(verdict: str = "pass", median: float | None = 1.5, **over: object) -> dict:
    """A dict shaped like EvalResult.to_dict(), built here so the test does not depend on the evaluator."""
    d = {"level_reached": "L3" if verdict == "pass" else "L2", "verdict": verdict, "reason": "",
         "median_ms": median, "spread_ms": 0.1, "iteration_ms": [1.4, 1.5, 1.6],
         "per_rank_median_ms": [1.45, 1.5], "seed_median_ms": 3.0,
         "speedup": None if median is None else 3.0 / median, "max_rel_err": 1e-4, "flagged": False,
         "badge": "real", "logs": {"build": "ok", "rank0": "r0 tail", "rank1": "r1 tail"},
         "provenance": {"gpu": "NVIDIA H200", "driver": "580.65", "cuda": "13.0", "nccl": "2.28.9", "mps": True,
                        "git": "abc1234", "world": 2}}
    d.update(over)
    return d


@pytest.fixture
def db(tmp_path: Path) -> Store:
    s = Store(tmp_path / "run.sqlite")
    yield s
    s.close()


def test_wal_mode_and_version_on_a_new_file(tmp_path: Path) -> None:
    path = tmp_path / "new.sqlite"
    with Store(path) as s:
        assert s.journal_mode() == "wal"
        assert s.schema_version() == SCHEMA_VERSION
    # WAL is a property of the file: a plain sqlite3 connection sees it too.
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("SELECT MAX(version) FROM schema_version").fetchone()[0] == SCHEMA_VERSION
    conn.close()


def test_memory_store_works() -> None:
    with Store(":memory:") as s:
        rid = s.create_run(workload="w", config={})
        assert s.run(rid)["workload"] == "w"


def test_runs_round_trip(db: Store) -> None:
    cfg = {"generations": 5, "islands": [1, 2], "nested": {"a": None}}
    rid = db.create_run(workload="gemm_allgather", config=cfg, seed=7, badge="simulated")
    r = db.run(rid)
    assert (r["workload"], r["config"], r["seed"], r["badge"], r["state"]) == \
        ("gemm_allgather", cfg, 7, "simulated", "running")
    assert r["created_at"] > 0
    db.set_run_state(rid, "paused")
    assert db.run(rid)["state"] == "paused"
    rid2 = db.create_run(workload="moe", config={})
    assert [x["id"] for x in db.runs()] == [rid, rid2]
    with pytest.raises(BadInput, match="run state"):
        db.set_run_state(rid, "exploded")
    with pytest.raises(BadInput, match="badge"):
        db.create_run(workload="w", config={}, badge="fake")
    with pytest.raises(NotFound, match="no run 999"):
        db.run(999)
    with pytest.raises(BadInput, match="JSON"):
        db.create_run(workload="w", config={"x": object()})


def test_programs_round_trip_and_lineage(db: Store) -> None:
    rid = db.create_run(workload="w", config={})
    seed = db.add_program(run_id=rid, code="__global__ void k(){}", parent_id=None, source="seed", name="seed")
    child = db.add_program(run_id=rid, code="__global__ void k2(){}", parent_id=seed, source="llm_diff",
                           name="split", rationale="overlap the put", tags=("overlap", "lsa"),
                           knobs={"CHUNK": "4", "ISSUER": "warp"}, cell="nccl/split/block", island=2,
                           generation=3, second_parent_id=seed)
    p = db.program(child)
    assert p["parent_id"] == seed and p["second_parent_id"] == seed
    assert p["tags"] == ["overlap", "lsa"] and p["knobs"] == {"CHUNK": "4", "ISSUER": "warp"}
    assert (p["cell"], p["island"], p["generation"], p["source"]) == ("nccl/split/block", 2, 3, "llm_diff")
    assert p["code_hash"] == code_hash("__global__ void k2(){}") and len(p["code_hash"]) == 64
    assert [x["id"] for x in db.programs(rid)] == [seed, child]
    assert db.find_program_by_hash(rid, code_hash("__global__ void k(){}"))["id"] == seed
    assert db.find_program_by_hash(rid, code_hash("nope")) is None
    other = db.create_run(workload="w", config={})
    assert db.find_program_by_hash(other, p["code_hash"]) is None
    assert db.programs(other) == []
    with pytest.raises(BadInput, match="program source"):
        db.add_program(run_id=rid, code="x", parent_id=None, source="magic")
    with pytest.raises(BadInput):  # a parent that does not exist
        db.add_program(run_id=rid, code="x", parent_id=12345, source="human")
    with pytest.raises(BadInput):  # a run that does not exist
        db.add_program(run_id=999, code="x", parent_id=None, source="human")


def test_proposals_and_decisions(db: Store) -> None:
    rid = db.create_run(workload="w", config={})
    parent = db.add_program(run_id=rid, code="p", parent_id=None, source="seed")
    a = db.add_proposal(run_id=rid, parent_id=parent, source="llm_diff", name="A", rationale="why A",
                        diff="--- a\n+++ b\n", code="codeA", tags=["t1"])
    b = db.add_proposal(run_id=rid, parent_id=parent, source="design_space", name="B", rationale="why B",
                        diff="d", code="codeB")
    c = db.add_proposal(run_id=rid, parent_id=parent, source="llm_crossover", name="C", rationale="why C",
                        diff="d", code="codeC", second_parent_id=parent)
    assert [p["id"] for p in db.proposals(rid, "pending")] == [a, b, c]
    assert db.proposal(a)["tags"] == ["t1"] and db.proposal(c)["second_parent_id"] == parent

    pa = db.add_program(run_id=rid, code="codeA", parent_id=parent, source="llm_diff")
    db.decide(a, "approved", program_id=pa)
    db.decide(b, "rejected", by="alice", note="wrong sync scope")
    db.decide(c, "edited", by="bob", code="codeC-fixed")

    pa_row, pb_row, pc_row = db.proposal(a), db.proposal(b), db.proposal(c)
    assert (pa_row["status"], pa_row["decided_by"], pa_row["program_id"]) == ("approved", "auto", pa)
    assert (pb_row["status"], pb_row["decided_by"], pb_row["note"]) == ("rejected", "alice", "wrong sync scope")
    assert (pc_row["status"], pc_row["code"], pc_row["original_code"]) == ("edited", "codeC-fixed", "codeC")
    assert pc_row["decided_at"] >= pc_row["created_at"]
    assert db.proposals(rid, "pending") == []
    assert [p["id"] for p in db.proposals(rid, "edited")] == [c]
    assert [p["id"] for p in db.proposals(rid)] == [a, b, c]
    assert [d["decision"] for d in db.decisions(b)] == ["rejected"]

    pc = db.add_program(run_id=rid, code="codeC-fixed", parent_id=parent, source="human")
    db.link_program(c, pc)
    assert db.proposal(c)["program_id"] == pc

    with pytest.raises(BadInput, match="already decided"):
        db.decide(a, "rejected")
    with pytest.raises(BadInput, match="edited code"):
        db.decide(db.add_proposal(run_id=rid, parent_id=None, source="human", name="n", rationale="r",
                                  diff="", code="c"), "edited")
    with pytest.raises(BadInput, match="decision"):
        db.decide(a, "maybe")
    with pytest.raises(NotFound):
        db.decide(999, "approved")
    with pytest.raises(BadInput, match="proposal status"):
        db.proposals(rid, "weird")


def test_a_failed_decision_changes_nothing(db: Store) -> None:
    rid = db.create_run(workload="w", config={})
    p = db.add_proposal(run_id=rid, parent_id=None, source="human", name="n", rationale="r", diff="", code="c")
    with pytest.raises(BadInput):  # program 4242 does not exist: the whole decision rolls back
        db.decide(p, "edited", code="c2", program_id=4242)
    row = db.proposal(p)
    assert (row["status"], row["code"], row["original_code"]) == ("pending", "c", None)
    assert db.decisions(p) == []
    db.decide(p, "approved")  # and the store is still usable
    assert db.proposal(p)["status"] == "approved"


def test_evaluations_round_trip_with_provenance(db: Store) -> None:
    rid = db.create_run(workload="w", config={})
    prog = db.add_program(run_id=rid, code="c", parent_id=None, source="seed")
    request = {"candidate_code": "c", "world_size": 2, "backend": "nccl", "iters": 20}
    eid = db.start_evaluation(prog, world_size=2, backend="nccl", badge="real", request=request)
    e = db.evaluations(program_id=prog)[0]
    assert (e["id"], e["status"], e["request"], e["run_id"], e["verdict"]) == (eid, "in_flight", request, rid, None)

    res = _result()
    db.finish_evaluation(eid, res)
    e = db.evaluation(eid)
    assert e["status"] == "done" and e["finished_at"] >= e["started_at"]
    for k in ("level_reached", "verdict", "median_ms", "spread_ms", "iteration_ms", "per_rank_median_ms",
              "seed_median_ms", "speedup", "max_rel_err", "logs", "provenance", "badge"):
        assert e[k] == res[k], k
    assert e["flagged"] is False and e["result"] == res
    assert (e["gpu"], e["driver"], e["cuda"], e["nccl"], e["mps"], e["git_rev"]) == \
        ("NVIDIA H200", "580.65", "13.0", "2.28.9", True, "abc1234")

    # Provenance columns are queryable in plain SQL, e.g. by a notebook or another tool.
    conn = sqlite3.connect(db.path)
    rows = conn.execute("SELECT id FROM evaluations WHERE gpu = 'NVIDIA H200' AND mps = 1 AND nccl = '2.28.9' "
                        "AND git_rev = 'abc1234' AND badge = 'real'").fetchall()
    conn.close()
    assert rows == [(eid,)]

    with pytest.raises(BadInput, match="not in_flight"):
        db.finish_evaluation(eid, res)
    with pytest.raises(BadInput, match="verdict"):
        db.finish_evaluation(db.start_evaluation(prog, world_size=1, backend="nccl", badge="real", request={}),
                             {"level_reached": "L0"})
    with pytest.raises(NotFound):
        db.start_evaluation(999, world_size=1, backend="nccl", badge="real", request={})


def test_result_badge_and_unknown_fields_are_kept(db: Store) -> None:
    rid = db.create_run(workload="w", config={})
    prog = db.add_program(run_id=rid, code="c", parent_id=None, source="seed")
    eid = db.start_evaluation(prog, world_size=1, backend="symm", badge="real", request={})
    db.finish_evaluation(eid, _result(badge="replayed", provenance={"mps": "off"}, future_field=[1, 2]))
    e = db.evaluation(eid)
    assert e["badge"] == "replayed" and e["mps"] is False and e["gpu"] is None
    assert e["result"]["future_field"] == [1, 2]


def test_failure_logs_are_stored(db: Store) -> None:
    rid = db.create_run(workload="w", config={})
    prog = db.add_program(run_id=rid, code="c", parent_id=None, source="seed")
    eid = db.start_evaluation(prog, world_size=2, backend="nccl", badge="real", request={})
    db.finish_evaluation(eid, _result("fail", None, reason="L2 mismatch on rank 1",
                                      logs={"rank1": "max_rel_err 0.3"}, iteration_ms=None, per_rank_median_ms=None))
    e = db.evaluation(eid)
    assert (e["verdict"], e["reason"], e["logs"], e["median_ms"]) == \
        ("fail", "L2 mismatch on rank 1", {"rank1": "max_rel_err 0.3"}, None)


def test_mark_interrupted_only_touches_in_flight_of_that_run(db: Store) -> None:
    r1 = db.create_run(workload="w", config={})
    r2 = db.create_run(workload="w", config={})
    p1 = db.add_program(run_id=r1, code="a", parent_id=None, source="seed")
    p2 = db.add_program(run_id=r2, code="b", parent_id=None, source="seed")
    done = db.start_evaluation(p1, world_size=1, backend="nccl", badge="real", request={})
    db.finish_evaluation(done, _result())
    fly1 = db.start_evaluation(p1, world_size=1, backend="nccl", badge="real", request={})
    fly2 = db.start_evaluation(p1, world_size=2, backend="nccl", badge="real", request={})
    other = db.start_evaluation(p2, world_size=1, backend="nccl", badge="real", request={})

    assert db.mark_interrupted(r1) == [fly1, fly2]
    status = {e["id"]: e["status"] for e in db.evaluations()}
    assert status == {done: "done", fly1: "interrupted", fly2: "interrupted", other: "in_flight"}
    assert db.mark_interrupted(r1) == []
    with pytest.raises(BadInput, match="interrupted"):  # a late result does not resurrect it
        db.finish_evaluation(fly1, _result())


def test_completed_rows_survive_a_reopen(tmp_path: Path) -> None:
    path = tmp_path / "resume.sqlite"
    s = Store(path)
    rid = s.create_run(workload="w", config={"g": 3})
    prog = s.add_program(run_id=rid, code="c", parent_id=None, source="seed")
    done = s.start_evaluation(prog, world_size=1, backend="nccl", badge="real", request={})
    s.finish_evaluation(done, _result())
    fly = s.start_evaluation(prog, world_size=1, backend="nccl", badge="real", request={})
    # No close(): a second connection, as after a kill, must already see every committed row.
    t = Store(path)
    assert t.run(rid)["config"] == {"g": 3}
    assert t.mark_interrupted(rid) == [fly]
    assert t.evaluation(done)["status"] == "done"
    t.close()
    s.close()


def test_best_picks_lowest_passing_unflagged(db: Store) -> None:
    rid = db.create_run(workload="w", config={})
    assert db.best(rid) is None
    progs = [db.add_program(run_id=rid, code=f"c{i}", parent_id=None, source="seed", name=f"p{i}")
             for i in range(5)]

    def ev(pid: int, res: dict | None) -> int:
        eid = db.start_evaluation(pid, world_size=1, backend="nccl", badge="real", request={})
        if res is not None:
            db.finish_evaluation(eid, res)
        return eid

    ev(progs[0], _result(median=2.0))
    good = ev(progs[1], _result(median=1.2))
    ev(progs[2], _result("fail", median=0.5))  # faster but wrong
    ev(progs[3], _result(median=0.3, flagged=True))  # implausible: a human looks first
    ev(progs[4], None)  # in flight
    b = db.best(rid)
    assert b["id"] == good and b["program_id"] == progs[1] and b["median_ms"] == 1.2
    assert b["program"]["code"] == "c1" and b["code"] == "c1" and b["name"] == "p1"
    assert db.best(rid, include_flagged=True)["program_id"] == progs[3]
    other = db.create_run(workload="w", config={})
    assert db.best(other) is None


def test_llm_ledger_and_dollars(db: Store) -> None:
    r1 = db.create_run(workload="w", config={})
    r2 = db.create_run(workload="w", config={})
    db.add_llm_call(run_id=r1, model="m", purpose="mutate", prompt_tokens=100, completion_tokens=50,
                    latency_s=1.5, dollars=0.25, ok=True, request_hash="h1")
    db.add_llm_call(run_id=r1, model="m", purpose="judge", prompt_tokens=10, completion_tokens=5,
                    latency_s=0.2, dollars=None, ok=False, error="timeout")
    db.add_llm_call(run_id=r2, model="m2", purpose="mutate", prompt_tokens=1, completion_tokens=1,
                    latency_s=0.1, dollars=0.5, ok=True)
    db.add_llm_call(run_id=None, model="m", purpose="fastpath", prompt_tokens=1, completion_tokens=1,
                    latency_s=0.1, dollars=0.125, ok=True)
    assert db.llm_dollars(r1) == pytest.approx(0.25)
    assert db.llm_dollars(r2) == pytest.approx(0.5)
    assert db.llm_dollars() == pytest.approx(0.875)
    assert db.llm_dollars(db.create_run(workload="w", config={})) == 0.0
    calls = db.llm_calls(r1)
    assert [c["purpose"] for c in calls] == ["mutate", "judge"]
    assert calls[0]["ok"] is True and calls[1]["ok"] is False and calls[1]["error"] == "timeout"
    assert calls[0]["request_hash"] == "h1" and calls[1]["dollars"] is None
    assert len(db.llm_calls()) == 4


def test_meta_round_trip(db: Store) -> None:
    rid = db.create_run(workload="w", config={})
    assert db.get_meta(rid, "summary", default="none") == "none"
    db.put_meta(rid, "summary", "islands converge")
    db.put_meta(rid, "optuna", {"trials": [{"CHUNK": 4, "value": 1.2}]})
    db.put_meta(rid, "summary", "v2")
    assert db.get_meta(rid, "summary") == "v2"
    assert db.get_meta(rid, "optuna") == {"trials": [{"CHUNK": 4, "value": 1.2}]}
    assert db.meta_keys(rid) == ["optuna", "summary"]
    other = db.create_run(workload="w", config={})
    assert db.get_meta(other, "summary") is None


def test_migrates_an_empty_v0_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.sqlite"
    path.write_bytes(b"")  # an empty file is a valid, empty SQLite database
    with Store(path) as s:
        assert s.schema_version() == SCHEMA_VERSION
        rid = s.create_run(workload="w", config={})
        assert s.run(rid)["state"] == "running"


def test_migrates_the_v0_layout_and_keeps_data(tmp_path: Path) -> None:
    path = tmp_path / "v0.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript(V0_LAYOUT)
    conn.execute("INSERT INTO runs VALUES (1, 'gemm_allgather', ?, 100.0)", (json.dumps({"gens": 4}),))
    conn.execute("INSERT INTO runs VALUES (2, 'moe', 'not json', 101.0)")
    conn.execute("INSERT INTO programs VALUES (1, 1, NULL, 'seed code', 'seed', 100.5)")
    conn.execute("INSERT INTO programs VALUES (2, 1, 1, 'child code', 'llm_diff', 100.6)")
    conn.execute("INSERT INTO evaluations VALUES (1, 2, ?, 100.7)", (json.dumps(_result(median=0.9)),))
    conn.execute("INSERT INTO evaluations VALUES (2, 1, NULL, 100.8)")
    conn.execute("INSERT INTO evaluations VALUES (3, 1, '{truncated', 100.9)")
    conn.commit()
    conn.close()

    with Store(path) as s:
        assert s.schema_version() == SCHEMA_VERSION
        r = s.run(1)
        assert (r["workload"], r["config"], r["state"], r["badge"]) == ("gemm_allgather", {"gens": 4}, "stopped",
                                                                          "real")
        assert s.run(2)["config"] == {"_raw": "not json"}  # kept, not lost
        progs = s.programs(1)
        assert [(p["id"], p["parent_id"], p["code"], p["source"]) for p in progs] == \
            [(1, None, "seed code", "seed"), (2, 1, "child code", "llm_diff")]
        assert s.find_program_by_hash(1, code_hash("child code"))["id"] == 2
        e1, e2, e3 = s.evaluations(run_id=1)
        assert (e1["status"], e1["median_ms"], e1["gpu"], e1["per_rank_median_ms"], e1["world_size"]) == \
            ("done", 0.9, "NVIDIA H200", [1.45, 1.5], 2)
        assert e2["status"] == "interrupted"
        assert (e3["status"], e3["result"]) == ("interrupted", {"_raw": "{truncated"})  # kept, not lost
        assert s.best(1)["program_id"] == 2
        # and the migrated file takes new v1 rows
        new = s.add_program(run_id=1, code="new", parent_id=2, source="human")
        assert new == 3
    conn = sqlite3.connect(path)
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    conn.close()
    assert not any(t.startswith("_v0_") for t in tables)


def test_a_failed_migration_leaves_the_file_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "broken_v0.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript(V0_LAYOUT)
    conn.execute("INSERT INTO programs VALUES (1, 77, NULL, 'orphan', 'seed', 1.0)")  # run 77 does not exist
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match="migrating schema v0 to v1 failed"):
        Store(path)
    conn = sqlite3.connect(path)
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert tables == {"runs", "programs", "evaluations"}
    assert conn.execute("SELECT code FROM programs").fetchall() == [("orphan",)]
    conn.close()


def test_refuses_a_newer_schema(tmp_path: Path) -> None:
    path = tmp_path / "future.sqlite"
    Store(path).close()
    conn = sqlite3.connect(path)
    conn.execute("INSERT INTO schema_version VALUES (?, 0)", (SCHEMA_VERSION + 1,))
    conn.commit()
    conn.close()
    with pytest.raises(CucoError, match=f"schema v{SCHEMA_VERSION + 1}, newer than"):
        Store(path)
    with pytest.raises(CucoError, match="newer than"):
        Store(path, readonly=True)


def test_refuses_foreign_and_non_sqlite_files(tmp_path: Path) -> None:
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"this is not a database at all" * 100)
    with pytest.raises(StoreError, match="cannot be opened as SQLite"):
        Store(junk)
    foreign = tmp_path / "foreign.sqlite"
    conn = sqlite3.connect(foreign)
    conn.execute("CREATE TABLE customers (id INTEGER)")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match="none of a cuco store"):
        Store(foreign)
    with pytest.raises(BadInput, match="does not exist"):
        Store(tmp_path / "no" / "such" / "dir.sqlite")


def test_readonly(tmp_path: Path) -> None:
    path = tmp_path / "ro.sqlite"
    with Store(path) as s:
        rid = s.create_run(workload="w", config={"a": 1})
    with Store(path, readonly=True) as ro:
        assert ro.run(rid)["config"] == {"a": 1}
        with pytest.raises(StoreError, match="read-only"):
            ro.create_run(workload="w", config={})
        with pytest.raises(StoreError, match="read-only"):
            ro.mark_interrupted(rid)
    with pytest.raises(StoreError, match="does not exist"):
        Store(tmp_path / "missing.sqlite", readonly=True)
    v0 = tmp_path / "v0.sqlite"
    sqlite3.connect(v0).executescript(V0_LAYOUT).connection.close()
    with pytest.raises(StoreError, match="needs migrating"):
        Store(v0, readonly=True)


def test_concurrent_reads_during_writes(tmp_path: Path) -> None:
    """One writer thread adds programs and evaluations while two reader threads query the same Store and a
    second Store on the same file (as a CLI in another process would). Readers never see an error, a torn row
    or a count going backwards."""
    s = Store(tmp_path / "threads.sqlite")
    other = Store(tmp_path / "threads.sqlite")
    rid = s.create_run(workload="w", config={})
    n = 150
    stop = threading.Event()
    errors: list[BaseException] = []
    seen: dict[str, int] = {"reads": 0}
    readers_running = threading.Event()

    def writer() -> None:
        try:
            readers_running.wait(timeout=10)  # so the reads really overlap the writes
            parent = None
            for i in range(n):
                parent = s.add_program(run_id=rid, code=f"code {i}", parent_id=parent, source="llm_diff",
                                       knobs={"i": str(i)})
                eid = s.start_evaluation(parent, world_size=1, backend="nccl", badge="simulated", request={"i": i})
                s.finish_evaluation(eid, _result(median=1.0 + (i % 7), badge="simulated"))
        except BaseException as e:  # noqa: BLE001 - collected for the main thread to assert on, failed asserts included
            errors.append(e)
        finally:
            stop.set()

    def reader(store: Store) -> None:
        last = 0
        try:
            while not stop.is_set():
                progs = store.programs(rid)
                assert len(progs) >= last
                last = len(progs)
                for p in progs[-3:]:
                    assert p["code"] == f"code {p['knobs']['i']}"
                for e in store.evaluations(run_id=rid)[-3:]:
                    assert e["status"] in ("in_flight", "done")
                    if e["status"] == "done":
                        assert e["median_ms"] is not None and e["result"]["verdict"] == "pass"
                store.best(rid)
                seen["reads"] += 1
                readers_running.set()
            assert len(store.programs(rid)) == n  # everything committed is visible once the writer is done
        except BaseException as e:  # noqa: BLE001 - collected for the main thread to assert on, failed asserts included
            errors.append(e)

    threads = [threading.Thread(target=writer), threading.Thread(target=reader, args=(s,)),
               threading.Thread(target=reader, args=(other,))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    assert errors == []
    assert seen["reads"] >= 2
    assert len(other.programs(rid)) == n
    assert other.best(rid)["median_ms"] == 1.0
    s.close()
    other.close()


def test_two_stores_opening_a_fresh_file_migrate_once(tmp_path: Path) -> None:
    path = tmp_path / "race.sqlite"
    stores: list[Store] = []
    errors: list[BaseException] = []

    def opener() -> None:
        try:
            stores.append(Store(path))
        except BaseException as e:  # noqa: BLE001 - collected for the main thread to assert on, failed asserts included
            errors.append(e)

    threads = [threading.Thread(target=opener) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == [] and len(stores) == 4
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]
    conn.close()
    for st in stores:
        st.close()


def test_readers_never_see_half_a_decision(tmp_path: Path) -> None:
    """decide() is three statements; a reader in another thread must see all of them or none."""
    import sys

    s = Store(tmp_path / "tx.sqlite")
    rid = s.create_run(workload="w", config={})
    ids = [s.add_proposal(run_id=rid, parent_id=None, source="human", name=str(i), rationale="", diff="",
                          code=f"c{i}") for i in range(300)]
    done = threading.Event()
    bad: list[str] = []

    def writer() -> None:
        for i in ids:
            s.decide(i, "edited", code=f"edited {i}", by="t")
        done.set()

    def reader() -> None:
        while not done.is_set():
            for p in s.proposals(rid):
                if (p["status"] == "pending") != (p["original_code"] is None):
                    bad.append(f"proposal {p['id']}: status {p['status']} but original_code {p['original_code']}")
            rows = s._rows("SELECT p.status, COUNT(d.id) FROM proposals p LEFT JOIN decisions d "
                           "ON d.proposal_id = p.id GROUP BY p.id")
            bad.extend(f"status {st} with {n} decisions" for st, n in rows if (st == "pending") != (n == 0))

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often, so a missing lock shows up
    try:
        threads = [threading.Thread(target=writer), threading.Thread(target=reader),
                   threading.Thread(target=reader)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    finally:
        sys.setswitchinterval(old)
    s.close()
    assert bad == []


def test_a_transaction_commits_all_of_its_writes_or_none(tmp_path: Path) -> None:
    path = tmp_path / "tx.sqlite"
    s = Store(path)
    rid = s.create_run(workload="w", config={})
    with pytest.raises(RuntimeError), s.transaction():
        pid = s.add_proposal(run_id=rid, parent_id=None, source="human", name="p", rationale="", diff="", code="c")
        s.decide(pid, "rejected", by="t")  # its own transaction joins this one
        s.put_meta(rid, "k", 1)
        raise RuntimeError("killed here")
    assert s.proposals(rid) == [] and s.get_meta(rid, "k") is None
    with s.transaction():
        pid = s.add_proposal(run_id=rid, parent_id=None, source="human", name="p", rationale="", diff="", code="c")
        s.decide(pid, "rejected", by="t")
    with Store(path, readonly=True) as ro:
        assert [p["status"] for p in ro.proposals(rid)] == ["rejected"] and len(ro.decisions(pid)) == 1
    s.close()
