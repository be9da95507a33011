"""A search started from a fast-path result (`cuco search DIR --from RESULT.cu`): the result's bytes are the
baseline root (the L0 parent of its children), and the fast path's stages, stored in the same database, are the
lineage's first nodes, drawn but never selected or evaluated again."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from cuco_kit.evaluate.build import BuildResult
from cuco_kit.evaluate.simulated import SimulatedEvaluator
from cuco_kit.fastpath import FastPath, FastPathConfig
from cuco_kit.llm import OpenAICompatibleClient, fixtures
from cuco_kit.llm.fake_server import FakeOpenAIServer, answer
from cuco_kit.search.budget import BudgetConfig
from cuco_kit.search.config import SearchConfig
from cuco_kit.search.design_space import DesignSpaceSource
from cuco_kit.search.engine import SearchEngine
from cuco_kit.search.start_point import start_from
from cuco_kit.store import Store

ROOT = Path(__file__).resolve().parents[3]
WORKLOAD = ROOT / "sample_kernels" / "gemm_allgather"


def no_build(code, backend, cfg=None, cache_dir=None):
    return BuildResult(True, Path("/nonexistent/fake.so"), "TEST DOUBLE: nothing compiled", 0.0, False, "fake")


def fast_path_result(db: Path, out: Path) -> None:
    script = [answer(n, f"FIXTURE\n```cuda\n{fixtures.load(f)}```\n") for n, f in
              (("a", "gemm_stage_a.cu"), ("b", "gemm_stage_b_lsa.cu"), ("annotate", "gemm_annotated.cu"))]
    with FakeOpenAIServer(script) as srv, Store(db) as store:
        client = OpenAICompatibleClient(srv.config(max_retries=0), sleep=lambda s: None)
        res = FastPath((WORKLOAD / "seed_nccl.cu").read_text(), WORKLOAD, client, None, store,
                       FastPathConfig(gpu=False, max_attempts=1), builder=no_build).run()
    assert res.ok, res.message
    out.write_text(res.code)


def test_search_starts_from_the_result_with_the_stages_as_first_nodes(tmp_path):
    db, result = tmp_path / "run.sqlite", tmp_path / "result.cu"
    fast_path_result(db, result)
    with Store(db) as store:
        start = start_from(result, store)
        assert [s.stage for s in start.lineage] == ["seed", "A", "B"]
        cfg = SearchConfig(world_size=2, backend="symm", budget=BudgetConfig(generations=1),
                           proposals_per_generation=2)
        engine = SearchEngine(WORKLOAD, store, SimulatedEvaluator(0), [DesignSpaceSource()], cfg, start=start)
        engine.run()
        progs = store.programs(engine.run_id)
        evaluated = {e["program_id"] for e in store.evaluations(run_id=engine.run_id)
                     if e["request"].get("copied_from") is None}
    stages = [p for p in progs if "lineage" in p["tags"]]
    assert [p["name"] for p in stages] == ["fast path: seed", "fast path: A", "fast path: B"]
    assert [p["generation"] for p in stages] == [-3, -2, -1]
    baseline = next(p for p in progs if p["source"] == "baseline")
    assert baseline["code"] == result.read_text() and baseline["parent_id"] == stages[-1]["id"]
    children = [p for p in progs if p["parent_id"] == baseline["id"]]
    assert children, "the search proposed nothing from the result"
    assert not evaluated & {p["id"] for p in stages}  # drawn, never evaluated again by the search


def test_from_a_file_without_blocks_is_one_line(tmp_path):
    plain = tmp_path / "plain.cu"
    plain.write_text((WORKLOAD / "seed_nccl.cu").read_text())
    proc = subprocess.run([sys.executable, "-m", "cuco_kit", "search", str(WORKLOAD), "--from", str(plain), "--db",
                           str(tmp_path / "x.db"), "--evaluator", "simulated", "--ranks", "2", "--backend", "symm"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "no EVOLVE blocks" in proc.stderr
