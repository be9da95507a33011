"""Compile tier: the whole LLM answer corpus with a real nvcc build (L1) behind the static check, as
benchmarks/llm_corpus/run.py measures it: every case ends as documented, the hallucinated NCCL name included (its
build fails, the compiler's errors go back to the model once, and the repair builds)."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.llm.test_llm_corpus import CASES, corpus_runner


@pytest.mark.parametrize("case", [c for c in CASES if c["name"] == "hallucinated_nccl"], ids=lambda c: c["name"])
def test_build_repair_case_ends_as_documented(case: dict, tmp_path: Path) -> None:
    run = corpus_runner()
    r = run.run_case(case, tmp_path, run.BuildCheckEvaluator(tmp_path / "builds"))
    assert r["as_documented"], (r["outcome"], case["expected"])
    assert [row["purpose"] for row in r["ledger"]] == ["search.mutate.diff", "search.mutate.diff.repair.build"]
