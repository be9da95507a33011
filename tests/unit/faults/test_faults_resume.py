"""Kill -9 at chosen and at random moments, resume until the budget is spent: the run ends with exactly the
programs (code, generation, island, parents, source), proposals and best result of an uninterrupted run with the
same seed.

The search runs in a child process with the SIMULATED evaluator (deterministic). The child is forked from this
process (no second start-up of Python), stops itself just before the n-th call of a store write method -- the
moments between which a killed run's file can differ -- and this process kills it with SIGKILL there. Kill points
are named (very early, between the seed and the baseline, with proposals pending, with evaluations in flight) or
drawn from a seeded RNG, so a failure reproduces.
"""
from __future__ import annotations

import json
import os
import random
import signal
import socket
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cuco_kit.cli import main
from cuco_kit.evaluate.simulated import SimulatedEvaluator
from cuco_kit.search.budget import BudgetConfig
from cuco_kit.search.config import SearchConfig
from cuco_kit.search.design_space import DesignSpaceSource
from cuco_kit.search.engine import SearchEngine
from cuco_kit.search.islands import IslandConfig
from cuco_kit.search.synthetic import write_synthetic_workload
from cuco_kit.store import Store, code_hash

GENERATIONS = 4
WRITES = ("create_run", "set_run_state", "add_program", "add_proposal", "decide", "link_program",
          "start_evaluation", "finish_evaluation", "mark_interrupted", "put_meta")

Pause = tuple[str, int]  # (store method or "any", n): stop before the n-th such call of the child


def _engine(wl: Path, store: Store) -> SearchEngine:
    # 10 evaluations are started before the last round: an evaluation budget of 11 lets it run only when the
    # interrupted evaluations a kill leaves behind are not counted (their re-runs are).
    cfg = SearchConfig(seed=7, proposals_per_generation=3, islands=IslandConfig(islands=2, migration_interval=2),
                       budget=BudgetConfig(generations=GENERATIONS, evaluations=11))
    return SearchEngine(wl, store, SimulatedEvaluator(seed=4), [DesignSpaceSource()], cfg)


def _pause_before(pause: Pause, tell: int) -> None:
    """In the child: wrap the store's write methods so that the chosen call writes one byte to ``tell`` and
    waits to be killed instead of running."""
    method, n = pause
    calls = {"n": 0}

    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if method in ("any", name):
                calls["n"] += 1
                if calls["n"] == n:
                    os.write(tell, b"P")
                    time.sleep(60)
            return fn(*args, **kwargs)
        return wrapper

    for name in WRITES:
        setattr(Store, name, wrap(name, getattr(Store, name)))


def _fork(target: Callable[[], object], pause: Pause | None) -> tuple[int, bool]:
    """Run ``target`` in a forked child that stops at ``pause``. Returns (pid, True) once it has stopped there,
    or (pid, False) once it has ended without getting there."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 0
        try:
            os.close(r)
            if pause is not None:
                _pause_before(pause, w)
            target()
        except BaseException:  # noqa: BLE001 -- reported on stderr, seen by the parent as the exit status
            traceback.print_exc()
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        return pid, f.read(1) == b"P"  # b"" once the child has exited without pausing


def _kill_9(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


def _ended_well(pid: int) -> bool:
    _, status = os.waitpid(pid, 0)
    return os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def _run_child(wl: Path, db: Path, pause: Pause | None) -> bool:
    """Run the search in a forked child; kill -9 it at ``pause``. True when it was killed there, False when it
    finished the run first."""
    pid, paused = _fork(lambda: _engine(wl, Store(db)).run(), pause)
    if paused:
        _kill_9(pid)
    else:
        assert _ended_well(pid), f"the search child failed (pause {pause})"
    return paused


def _record(store: Store, run_id: int) -> dict[str, Any]:
    """What must not depend on kills: programs, proposals, one finished result per program, the best."""
    programs = [(p["id"], p["code_hash"], p["source"], p["name"], p["generation"], p["island"], p["parent_id"],
                 p["second_parent_id"], p["cell"]) for p in store.programs(run_id)]
    proposals = [(q["id"], code_hash(q["code"]), q["source"], q["parent_id"], q["status"], q["program_id"])
                 for q in store.proposals(run_id)]
    done = [(e["program_id"], e["verdict"], e["median_ms"]) for e in store.evaluations(run_id)
            if e["status"] == "done"]
    best = store.best(run_id)
    state = store.get_meta(run_id, "state")
    return {"programs": programs, "proposals": proposals, "results": sorted(done),
            "best": best and (best["program_id"], best["median_ms"]),
            "state": {k: state[k] for k in ("generation_done", "phase", "migrations", "archive")},
            "run_state": store.run(run_id)["state"], "runs": len(store.runs())}


@pytest.fixture(scope="module")
def wl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic_workload(tmp_path_factory.mktemp("wl") / "synthetic")


@pytest.fixture(scope="module")
def uninterrupted(wl: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    db = tmp_path_factory.mktemp("ref") / "ref.db"
    with Store(db) as st:
        eng = _engine(wl, st)
        eng.run()
        return _record(st, eng.run_id)


def _kill_and_resume(wl: Path, db: Path, pauses: list[Pause], *, at_least: int) -> dict[str, Any]:
    """Kill the search at each pause in turn (each resumed run counts its calls from 0) until one finishes
    first, then resume it to the end."""
    kills = 0
    for p in pauses:
        if not _run_child(wl, db, p):
            break
        kills += 1
    assert kills >= at_least, f"only {kills} kills: the run ended before the kill points"
    assert not _run_child(wl, db, None)
    with Store(db, readonly=True) as st:
        assert len(st.runs()) == 1
        return _record(st, 1)


def test_kills_at_named_moments_resume_to_the_uninterrupted_run(wl: Path, tmp_path: Path,
                                                                  uninterrupted: dict[str, Any]) -> None:
    pauses: list[Pause] = [
        ("create_run", 1),         # very early: the file has a schema and nothing else
        ("add_program", 2),        # between storing the seed and the baseline
        ("add_proposal", 2),       # the first round's proposals half stored
        ("decide", 2),             # proposals pending: one decided, one a program without its decision
        ("finish_evaluation", 2),  # an evaluation in flight
        ("put_meta", 1),           # the end of a round not yet saved
        ("decide", 4),             # pending again, in a later round
    ]
    assert _kill_and_resume(wl, tmp_path / "run.db", pauses, at_least=len(pauses)) == uninterrupted


def test_kills_at_random_moments_resume_to_the_uninterrupted_run(wl: Path, tmp_path: Path,
                                                                   uninterrupted: dict[str, Any]) -> None:
    rng = random.Random(20240611)
    pauses: list[Pause] = [("any", rng.randint(1, 12)) for _ in range(8)]
    assert _kill_and_resume(wl, tmp_path / "run.db", pauses, at_least=8) == uninterrupted


def test_many_kills_at_random_moments(wl: Path, tmp_path: Path, uninterrupted: dict[str, Any]) -> None:
    """The thorough version: kills spread over the whole run, several in a row before it gets anywhere."""
    rng = random.Random(77)
    pauses: list[Pause] = [("any", rng.choice([1, 2, 3, rng.randint(1, 20)])) for _ in range(40)]
    assert _kill_and_resume(wl, tmp_path / "run.db", pauses, at_least=30) == uninterrupted


def _cli(wl: Path, db: Path) -> list[str]:
    return ["search", str(wl), "--db", str(db), "--evaluator", "simulated", "--generations", "3", "--seed", "5",
            "--json"]


def test_a_second_search_is_refused_while_the_owner_lives_and_resumes_after_kill_9(
        wl: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    db = tmp_path / "run.db"
    pid, paused = _fork(lambda: main(_cli(wl, db)), ("finish_evaluation", 3))
    try:
        assert paused
        with Store(db, readonly=True) as ro:  # viewing while the owner runs
            before = [(e["id"], e["status"]) for e in ro.evaluations(1)]
        assert before[-1][1] == "in_flight"
        assert main(_cli(wl, db)) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err, err
        assert f"pid {pid} on host {socket.gethostname()}" in err and "read-only" in err
        with Store(db, readonly=True) as ro:  # the refused search changed nothing
            assert [(e["id"], e["status"]) for e in ro.evaluations(1)] == before
            assert len(ro.runs()) == 1
    finally:
        _kill_9(pid)
    assert main(_cli(wl, db)) == 0  # the lock died with its owner
    resumed = json.loads(capsys.readouterr().out)
    assert resumed["run_id"] == 1 and resumed["state"] == "finished" and resumed["reruns"] == 1
    assert main(_cli(wl, tmp_path / "ref.db")) == 0
    with Store(db, readonly=True) as a, Store(tmp_path / "ref.db", readonly=True) as b:
        got, want = _record(a, 1), _record(b, 1)
    assert got == want


def test_proposals_pending_for_rounds_keep_their_generation_and_island(wl: Path, tmp_path: Path) -> None:
    """A manual gate leaves proposals of several rounds waiting; a resumed run labels each with its own round
    and slot island, not with the round the run stopped in or the parent's island."""
    db = tmp_path / "run.db"
    cfg = SearchConfig(seed=3, proposals_per_generation=3, gate="manual", max_pending=50, idle_poll_s=0.02,
                       budget=BudgetConfig(generations=3), islands=IslandConfig(islands=2, migration_interval=0))
    first = SearchEngine(wl, Store(db), SimulatedEvaluator(seed=4), [DesignSpaceSource()], cfg)
    first.start()
    deadline = time.time() + 30
    while first.generation < 3 and time.time() < deadline:
        time.sleep(0.02)
    labels = dict(first._proposal_info)
    first.stop()
    assert first.join(10) and first.generation == 3
    first.store.close()
    assert {g for g, _ in labels.values()} == {1, 2, 3} and {i for _, i in labels.values()} == {0, 1}
    cfg.gate = "auto"
    second = SearchEngine(wl, Store(db), SimulatedEvaluator(seed=4), [DesignSpaceSource()], cfg)
    second.run()
    for q in second.store.proposals(1):
        if q["status"] == "approved":
            p = second.store.program(q["program_id"])
            assert (p["generation"], p["island"]) == labels[q["id"]], q["name"]
    assert second.generation == 3
    second.store.close()
