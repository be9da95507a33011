"""The user's road on a real GPU (H200), on the all-reduce + RMS norm test program (cuco_kit/importer/examples/):
import -> the seed's L2 at 1 rank against a wrong and then the approved reference -> the fast path with scripted
FIXTURE answers and a person's decisions (reject with a note, approve), Stage B's L2 at 1 and 2 ranks under
`symm` -> a short search started from the result, with every step stored and the fast-path stages in its
lineage. The LLM is an in-process scripted client, so the `openai` package is not needed."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cuco_kit.evaluate.api import EvalRequest
from cuco_kit.evaluate.device import gpu_present
from cuco_kit.fastpath import FastPath, FastPathConfig, FastPathResult
from cuco_kit.importer.session import ImportSession
from cuco_kit.llm import Completion, fixtures
from cuco_kit.search.budget import BudgetConfig
from cuco_kit.search.config import SearchConfig
from cuco_kit.search.design_space import DesignSpaceSource
from cuco_kit.search.engine import SearchEngine
from cuco_kit.search.start_point import start_from
from cuco_kit.store import Store
from cuco_kit.workload import load_workload

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = ROOT / "cuco_kit" / "importer" / "examples" / "allreduce_norm.cu"

pytestmark = pytest.mark.skipif(not gpu_present(), reason="needs an NVIDIA GPU (nvidia-smi)")


@dataclass
class ScriptedLLM:
    """LLMClient test double: answers each prompt with the first unused FIXTURE whose key is in it."""

    script: list[tuple[str, str]]
    prompts: list[str] = field(default_factory=list)

    def complete(self, messages, *, purpose, temperature=None, max_tokens=None) -> Completion:
        text = messages[-1]["content"]
        self.prompts.append(text)
        for i, (key, answer) in enumerate(self.script):
            if key in text:
                del self.script[i]
                return Completion(answer, "fixture-scripted", 1, 1, 0.0, "stop", fixture=True)
        return Completion("FIXTURE: no scripted answer", "fixture-scripted", 1, 1, 0.0, "stop", fixture=True)


def cuda(name: str) -> str:
    return f"FIXTURE\n```cuda\n{fixtures.load(name)}```\n"


def seed_l2(evaluator, d: Path) -> str:
    wl = load_workload(d)
    res = evaluator.evaluate(EvalRequest(
        candidate_code=(d / "seed_nccl.cu").read_text(), workload_dir=str(d), params=dict(wl.size_presets["small"]),
        world_size=1, backend="nccl", iters=3, trials=2, measure_seed=False, label="imported seed"))
    return f"{res.verdict}: {res.reason}"


@pytest.mark.timeout(600)
def test_import_fast_path_and_search_from_the_result(evaluator, tmp_path) -> None:
    d = tmp_path / "allreduce_norm"
    session = ImportSession(PROGRAM, d)
    session.write()
    session.accept_reference(fixtures.load("own_norm_reference_wrong.txt"))
    assert seed_l2(evaluator, d).startswith("fail"), "a reference without gamma must disagree with the seed"
    session.accept_reference(fixtures.load("own_norm_reference.txt"))
    gate = seed_l2(evaluator, d)
    assert gate.startswith("pass"), gate

    llm = ScriptedLLM([("# Stage A", cuda("own_norm_stage_a.cu")), ("# Stage A", cuda("own_norm_stage_a.cu")),
                       ("# Stage B", cuda("own_norm_stage_b_lsa.cu")), ("# Annotate", cuda("own_norm_annotated.cu"))])
    db = tmp_path / "road.sqlite"
    with Store(db) as store:
        fp = FastPath((d / "seed_nccl.cu").read_text(), d, llm, evaluator, store,
                      FastPathConfig(gpu=True, manual=True, max_attempts=2, judge=False, l2_iters=3, l2_trials=2),
                      seed_name="seed_nccl.cu")
        out = fp.run()
        assert out.status == "pending"
        out = fp.reject("keep the harness stream for the step")
        while not isinstance(out, FastPathResult):
            out = fp.approve()
        assert out.ok, out.message
        assert "keep the harness stream" in llm.prompts[1]
        b = out.outcomes["B"].attempts[-1]
        assert [(r.provenance.get("world_size"), r.provenance.get("backend"), r.verdict)
                for r in b.eval_result or []] == [(1, "symm", "pass"), (2, "symm", "pass")], b.reason
        result = d / "fastpath_result.cu"
        result.write_text(out.code)

        start = start_from(result, store)
        assert [s.stage for s in start.lineage] == ["seed", "A", "B"]
        cfg = SearchConfig(world_size=2, backend="symm", params=dict(load_workload(d).size_presets["small"]),
                           iters=5, proposals_per_generation=1, budget=BudgetConfig(generations=1))
        engine = SearchEngine(d, store, evaluator, [DesignSpaceSource()], cfg, start=start)
        summary = engine.run()
        progs = store.programs(summary.run_id)
        evs = store.evaluations(run_id=summary.run_id)
    stages = [p for p in progs if "lineage" in p["tags"]]
    assert [p["name"] for p in stages] == ["fast path: seed", "fast path: A", "fast path: B"]
    baseline = next(p for p in progs if p["source"] == "baseline")
    assert baseline["code"] == out.code and baseline["parent_id"] == stages[-1]["id"]
    verdicts = {e["program_id"]: e["verdict"] for e in evs if e["status"] == "done"}
    reasons = {e["program_id"]: f"{e['verdict']}: {e['reason']}" for e in evs if e["status"] == "done"}
    assert verdicts[baseline["id"]] == "pass", reasons
    assert any(p["parent_id"] == baseline["id"] and p["id"] in verdicts for p in progs), "no child was evaluated"
    assert verdicts[stages[-1]["id"]] == "pass"  # Stage B's L2, copied into the search's lineage
