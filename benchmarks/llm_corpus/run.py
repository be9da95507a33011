"""The LLM answer corpus through the search's proposal path: which share becomes an evaluable candidate.

Each case of tests/data/llm_corpus/cases.json (hand-written answers in the shapes real models give, LABELLED
fixtures) is one search of one generation and one proposal on the MoE sample, with the answers served in order
by the fake OpenAI-compatible server (real HTTP, the real openai client). "Evaluable" means a program made from
the answer passed L0 (the static check against the parent) and L1 (a real nvcc build); nothing is run, so no GPU
is needed. Every case's outcome is read back from the run's database (programs, proposals, decisions, ledger).

    python benchmarks/llm_corpus/run.py --label after                  # this checkout
    git archive main cuco_kit | tar -x -C /tmp/main_kit && \
      PYTHONPATH=/tmp/main_kit python benchmarks/llm_corpus/run.py --label before --code main   # main's code path

Each call merges its label into results.json; --table rewrites RESULTS.md from it.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import cuco_kit
from cuco_kit.evaluate.api import EvalRequest, EvalResult
from cuco_kit.evaluate.build import build, for_workload
from cuco_kit.llm.fake_server import FakeOpenAIServer, answer, truncated
from cuco_kit.llm.openai_client import OpenAICompatibleClient
from cuco_kit.search.budget import BudgetConfig
from cuco_kit.search.config import SearchConfig
from cuco_kit.search.engine import SearchEngine
from cuco_kit.search.llm_source import LLMSource
from cuco_kit.source.static_check import check_candidate
from cuco_kit.store import Store

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "data" / "llm_corpus"
HERE = Path(__file__).resolve().parent


class BuildCheckEvaluator:
    """L0 and a real L1 build, nothing run: "pass" at L1 means the candidate is evaluable."""

    badge = "unmeasured"

    def __init__(self, cache_dir: Path) -> None:
        self.cache_dir = cache_dir

    def evaluate(self, request: EvalRequest, progress: object = None) -> EvalResult:
        rep = check_candidate(request.candidate_code, request.parent_code)
        if not rep.ok:
            return EvalResult("L0", "fail", reason="; ".join(rep.reasons)[:500], badge="unmeasured")
        b = build(request.candidate_code, request.backend, for_workload(None, request.workload_dir), self.cache_dir)
        if not b.ok:
            errors = [ln for ln in b.log.splitlines() if "error" in ln][:5]
            return EvalResult("L1", "fail", reason="build failed: " + " | ".join(errors)[:400], badge="unmeasured",
                              logs={"build": "\n".join(errors)})
        return EvalResult("L1", "pass", reason="built (not run)", badge="unmeasured")


def matches(outcome: str, expected: str) -> bool:
    """Whether a case's outcome is its documented one ("rejected: <reason part>" matches on the reason)."""
    if expected.startswith("rejected"):
        return outcome.startswith("rejected") and expected.split(":", 1)[-1].strip() in outcome
    return outcome == expected


def run_case(case: dict, tmp: Path, evaluator: Any) -> dict:
    texts = [(CORPUS / f).read_text(encoding="utf-8") for f in case["answers"]]
    cut = set(case.get("truncated", []))
    script = [(truncated if i in cut else answer)(f"{case['name']}-{i + 1}", t) for i, t in enumerate(texts)]
    store = Store(tmp / f"{case['name']}.db")
    cfg = SearchConfig(world_size=2, backend="symm", proposals_per_generation=1,
                       budget=BudgetConfig(generations=1, llm_dollars=10.0))
    cfg.phases.mode = "fixed"
    cfg.diagnosis.enabled = False  # the corpus measures what a mutation answer becomes; diagnosis is another call
    for s in (cfg.phases.explore, cfg.phases.exploit):
        s.mix = {case["kind"]: 1.0}
    with FakeOpenAIServer(script) as srv:
        source = LLMSource(OpenAICompatibleClient(srv.config()))
        engine = SearchEngine(ROOT / "sample_kernels" / "moe_dispatch_combine", store, evaluator, [source], cfg)
        engine.run()
        served = len(srv.chat_requests())
    rid = engine.run_id
    programs = [p for p in store.programs(rid) if p["source"].startswith("llm")]
    evs = {e["program_id"]: e for e in store.evaluations(run_id=rid)}
    results = [(p, (evs.get(p["id"]) or {}).get("result") or {}) for p in programs]
    passed = [p for p, r in results if r.get("verdict") == "pass"]
    calls = store.llm_calls(rid)
    rows = [{"purpose": c["purpose"], "ok": bool(c["ok"]), "error": (c["error"] or "")[:160]} for c in calls]
    if passed:
        outcome = "evaluated" if len(calls) == 1 else "repaired then evaluated"
    else:
        why = [r.get("reason", "") for _, r in results if r]
        why += [d["note"] for d in store.proposals(rid) if d["status"] == "rejected" and d["note"]]
        why += list(getattr(source, "errors", []))
        why += [c["error"] for c in calls if c["error"]]
        outcome = "rejected: " + ("; ".join(w for w in why if w)[:300] or "no proposal")
    store.close()
    return {"name": case["name"], "kind": case["kind"], "shape": case["shape"], "expected": case["expected"],
            "outcome": outcome, "as_documented": matches(outcome, case["expected"]), "evaluable": bool(passed),
            "answers_served": served, "ledger": rows}


def _git_rev() -> str:
    """HEAD's short hash, with "+changes" when cuco_kit differs from it."""
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "cuco_kit"], cwd=ROOT, capture_output=True,
                               text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return rev + ("+changes" if dirty else "")


def write_table(data: dict) -> str:
    labels = [k for k in ("before", "after") if k in data]
    lines = ["# LLM answer corpus: share that becomes an evaluable candidate", "",
             "Answers are LABELLED FIXTURES (hand-written in the shapes real models give), served by the fake",
             "OpenAI-compatible server; evaluable = passed L0 and a real nvcc build (L1). Produced by",
             "`python benchmarks/llm_corpus/run.py --label after --table` (the `before` figure: the same script",
             "with main's `cuco_kit` first on PYTHONPATH, see the script's docstring).", ""]
    for lab in labels:
        d = data[lab]
        lines.append(f"- **{lab}** ({d['code']}): {d['evaluable']} of {d['cases']} evaluable "
                     f"({100 * d['share']:.0f}%)")
    lines += ["", "| case | shape | " + " | ".join(labels) + " | documented outcome |",
              "| --- | --- | " + " | ".join("---" for _ in labels) + " | --- |"]
    by = {lab: {c["name"]: c for c in data[lab]["results"]} for lab in labels}
    for c in data[labels[-1]]["results"]:
        cells = [by[lab].get(c["name"], {}).get("outcome", "-").replace("|", "/")[:140] for lab in labels]
        lines.append(f"| {c['name']} | {c['shape']} | " + " | ".join(cells) + f" | {c['expected']} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--label", required=True, help="before | after (merged into results.json)")
    ap.add_argument("--only", default="", help="comma list of case names (default: all)")
    ap.add_argument("--table", action="store_true", help="rewrite RESULTS.md from results.json")
    ap.add_argument("--code", default="", help="what code ran (default: this checkout's git revision)")
    args = ap.parse_args()
    cases = json.loads((CORPUS / "cases.json").read_text())["cases"]
    if args.only:
        cases = [c for c in cases if c["name"] in args.only.split(",")]
    t0 = time.monotonic()
    out = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for case in cases:
            r = run_case(case, tmp, BuildCheckEvaluator(tmp / "builds"))
            print(f"{r['name']:<24} {r['outcome'][:110]}", flush=True)
            out.append(r)
    n = sum(r["evaluable"] for r in out)
    path = HERE / "results.json"
    data = json.loads(path.read_text()) if path.is_file() else {}
    inside = Path(cuco_kit.__file__).resolve().is_relative_to(ROOT)
    code = args.code or (f"this checkout, git {_git_rev()}" if inside else "a cuco_kit outside this checkout")
    data[args.label] = {"code": code,
                        "cases": len(out), "evaluable": n, "share": n / max(1, len(out)),
                        "seconds": round(time.monotonic() - t0, 1), "results": out}
    path.write_text(json.dumps(data, indent=2) + "\n")
    print(f"{args.label}: {n} of {len(out)} evaluable ({100 * n / max(1, len(out)):.0f}%)")
    if args.table:
        (HERE / "RESULTS.md").write_text(write_table(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
