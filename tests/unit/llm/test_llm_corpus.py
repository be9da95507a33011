"""The LLM answer corpus (tests/data/llm_corpus, labelled fixtures) through a one-proposal search on the MoE sample:
every case that needs no compiler ends as documented (evaluated, repaired then evaluated, or rejected with its
reason), with its ledger rows. The case that needs nvcc runs in the compile tier (tests/compile/test_llm_corpus.py);
benchmarks/llm_corpus/run.py makes the before/after figure."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from cuco_kit.evaluate.api import EvalRequest, EvalResult
from cuco_kit.source.static_check import check_candidate

ROOT = Path(__file__).resolve().parents[3]
CASES = json.loads((ROOT / "tests" / "data" / "llm_corpus" / "cases.json").read_text())["cases"]
NEEDS_NVCC = {"hallucinated_nccl"}


def corpus_runner():
    spec = importlib.util.spec_from_file_location("llm_corpus_run", ROOT / "benchmarks" / "llm_corpus" / "run.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class StaticCheckEvaluator:
    """L0 only (no compiler): "pass" means the candidate passed the static check against its parent."""

    badge = "unmeasured"

    def evaluate(self, request: EvalRequest, progress: object = None) -> EvalResult:
        rep = check_candidate(request.candidate_code, request.parent_code)
        return EvalResult("L0", "pass" if rep.ok else "fail", reason="; ".join(rep.reasons), badge="unmeasured")


@pytest.mark.parametrize("case", [c for c in CASES if c["name"] not in NEEDS_NVCC], ids=lambda c: c["name"])
def test_corpus_case_ends_as_documented(case: dict, tmp_path: Path) -> None:
    r = corpus_runner().run_case(case, tmp_path, StaticCheckEvaluator())
    assert r["as_documented"], (r["outcome"], case["expected"])
    assert r["ledger"] and r["answers_served"] == len(r["ledger"]) - sum(
        not row["ok"] and row["error"].startswith("refused") for row in r["ledger"])
    if r["outcome"] == "repaired then evaluated":  # every retry is its own ledger row, named by its purpose
        assert any(p in row["purpose"] for row in r["ledger"][1:] for p in (".repair.", ".resample.", ".continue"))
