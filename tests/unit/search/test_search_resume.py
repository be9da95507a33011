"""Kill -9 and resume: the search runs in a subprocess on a file database, is SIGKILLed mid-evaluation, and a
resumed run repeats no committed evaluation, re-runs the one in flight (marked), and ends with the same
programs as an uninterrupted run with the same seed."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from cuco_kit.evaluate.simulated import SimulatedEvaluator
from cuco_kit.search.budget import BudgetConfig
from cuco_kit.search.config import SearchConfig
from cuco_kit.search.design_space import DesignSpaceSource
from cuco_kit.search.engine import SearchEngine
from cuco_kit.search.synthetic import write_synthetic_workload
from cuco_kit.store import Store, StoreError

ROOT = Path(__file__).resolve().parents[3]
GENERATIONS = 4

CHILD = textwrap.dedent(f"""
    import sys
    from cuco_kit.evaluate.simulated import SimulatedEvaluator
    from cuco_kit.search.budget import BudgetConfig
    from cuco_kit.search.config import SearchConfig
    from cuco_kit.search.design_space import DesignSpaceSource
    from cuco_kit.search.engine import SearchEngine
    from cuco_kit.store import Store
    cfg = SearchConfig(seed=21, proposals_per_generation=3, budget=BudgetConfig(generations={GENERATIONS}))
    SearchEngine(sys.argv[1], Store(sys.argv[2]), SimulatedEvaluator(seed=4, delay_s=0.25),
                 [DesignSpaceSource()], cfg).run()
""")


def _config() -> SearchConfig:
    return SearchConfig(seed=21, proposals_per_generation=3, budget=BudgetConfig(generations=GENERATIONS))


def test_kill_9_then_resume_repeats_nothing_and_reruns_the_in_flight(tmp_path: Path) -> None:
    wl = write_synthetic_workload(tmp_path / "wl")
    db = tmp_path / "run.db"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(wl), str(db)], cwd=ROOT, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            time.sleep(0.05)
            if not db.exists():
                continue
            try:
                with Store(db, readonly=True) as ro:
                    runs = ro.runs()
                    evs = ro.evaluations(run_id=runs[0]["id"]) if runs else []
            except StoreError:
                continue  # the child is still creating the schema
            done = [e for e in evs if e["status"] == "done"]
            if len(done) >= 5 and any(e["status"] == "in_flight" for e in evs):
                break
        else:
            raise AssertionError("the child search never got 5 evaluations in: "
                                 + (child.stdout.read().decode() if child.poll() is not None else "still running"))
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == -signal.SIGKILL

    with Store(db, readonly=True) as ro:
        before = ro.evaluations(run_id=1)
    committed = {e["id"]: e for e in before if e["status"] == "done"}
    in_flight = [e for e in before if e["status"] == "in_flight"]
    assert len(in_flight) == 1
    lost = in_flight[0]

    store = Store(db)
    eng = SearchEngine(wl, store, SimulatedEvaluator(seed=4), [DesignSpaceSource()], _config())
    summary = eng.run()
    assert summary.state == "finished" and summary.run_id == 1 and summary.generations == GENERATIONS
    after = store.evaluations(run_id=1)
    # committed rows untouched, and none of their programs evaluated again
    for e in after:
        if e["id"] in committed:
            assert e["status"] == "done" and e["median_ms"] == committed[e["id"]]["median_ms"]
    done_programs = [e["program_id"] for e in after if e["status"] == "done"]
    assert len(done_programs) == len(set(done_programs)), "a program was evaluated twice"
    # the in-flight one was marked and re-run, and the re-run says so
    assert store.evaluation(lost["id"])["status"] == "interrupted"
    rerun = [e for e in after if e["program_id"] == lost["program_id"] and e["status"] == "done"]
    assert len(rerun) == 1 and rerun[0]["request"]["rerun_of"] == [lost["id"]]
    assert summary.reruns == 1
    assert store.get_meta(1, "reruns")[0]["interrupted"] == [lost["id"]]
    # every program evaluated exactly once in the end
    assert sorted(done_programs) == [p["id"] for p in store.programs(1)]

    # same seed, no kill: the same programs in the same order
    ref = Store(":memory:")
    ref_eng = SearchEngine(wl, ref, SimulatedEvaluator(seed=4), [DesignSpaceSource()], _config())
    ref_eng.run()
    seq = [(p["code_hash"], p["parent_id"], p["generation"]) for p in store.programs(1)]
    ref_seq = [(p["code_hash"], p["parent_id"], p["generation"]) for p in ref.programs(ref_eng.run_id)]
    assert seq == ref_seq
