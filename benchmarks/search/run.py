"""Offline search on GEMM + AllGather on one GPU machine, in one command.

  PYTHONPATH=. python3 benchmarks/search/run.py --out DIR [--budget-s 420] [--preset 4096] [--candidates 30]
  PYTHONPATH=. python3 benchmarks/search/run.py --dry-run      # CPU: SIMULATED evaluator, files in a temp dir

1. Builds every design of device_lsa.cu (72 = placement x sync x issuer x chunks; range knobs at their
   defaults) for each backend used, plus the seeds, on a thread pool sharing the evaluator's build cache:
   count, seconds, cache hits.
2. Warms the rank workers of each world (seed + baseline, not recorded) and measures the per-evaluation time.
3. Real offline searches with the GpuEvaluator, each into its own store recordings/<name>.sqlite:
   (a) 4 ranks under symm (+ MPS): for each of 3 seeds the design-space search (Optuna over the knob block) and
       RANDOM sampling of the same knob space (RandomKnobSource) at the same evaluation budget, interleaved;
   (b) world size 1 under nccl: one seed of the design-space search.
   Before the searches (within --configs-budget-s), record_configs.py records every sample's benchmark
   configurations for the programs the notebooks offer (<sample>-configs.sqlite) and a search with failures at
   L0, L1 and L2 (gemm_allgather-symm2-failures.sqlite), so the replay answers what the widgets offer.
4. Reports best-vs-seed ratio, evaluations per GPU-hour, build cache hit rate, per-method per-seed best ms and
   which placements won; search vs random is compared on the first N candidates of each (N = the smaller
   count), so the budgets are equal even when a run was stopped early.
Writes the raw JSON to --out, results.json + RESULTS.md to benchmarks/search/ and the stores to recordings/, each
listed in recordings/MANIFEST.json (a temp tree of the same layout with --dry-run), and the same files as one
tarball under --out (a remote runner may copy back only --out); prints
the table last. Exit code 0 only when every check held (every planned run done, >= --candidates evaluated
candidates each, >= 2 placements evaluated each, the stores load through the replay evaluator and
workbench.recorded_runs finds them).
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import datetime as dt
import json
import os
import sqlite3
import statistics
import sys
import tarfile
import tempfile
import threading
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Run by path, not installed: the repository root (the kit) and benchmarks/ (console) go first on sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cuco_kit.evaluate.device import MULTICAST_OFF

os.environ.update(MULTICAST_OFF)  # every child inherits multicast off (the launcher sets them too)

from common import ratio_cell, short
from console import progress, say
from record_configs import record_configs, record_failures

from cuco_kit.evaluate import build as build_mod
from cuco_kit.evaluate.api import EvalRequest
from cuco_kit.evaluate.device import detect_gpu
from cuco_kit.evaluate.gpu_evaluator import EvaluatorConfig, GpuEvaluator
from cuco_kit.evaluate.manifest import MANIFEST, record
from cuco_kit.evaluate.pool import live_worker_pids
from cuco_kit.evaluate.replay import ReplayEvaluator
from cuco_kit.evaluate.simulated import SimulatedEvaluator
from cuco_kit.events import EventBus
from cuco_kit.search.budget import BudgetConfig
from cuco_kit.search.config import SearchConfig
from cuco_kit.search.design_space import DesignSpaceSource, RandomKnobSource
from cuco_kit.search.engine import SearchEngine
from cuco_kit.search.population import ProgramView
from cuco_kit.source import knob_rules, markers
from cuco_kit.store import Store
from cuco_kit.workbench import recorded_runs
from cuco_kit.workload import load_workload

ROOT = Path(__file__).resolve().parents[2]
os.chdir(ROOT)  # stores record the workload as a repo-relative path, not this machine's
# Optuna 5 deprecates constraints_func (still honoured); once per ask it would drown the log.
warnings.filterwarnings("ignore", category=FutureWarning, message=".*constraints_func.*")

WL_REL = "sample_kernels/gemm_allgather"
DEST_REL = Path("benchmarks") / "search"
# The stores are what the notebooks replay: they go to recordings/, each listed in its MANIFEST.json.
STORES_REL = Path("recordings")
RESERVE_S = 25.0  # kept back at the end: closing the workers and MPS, compaction, replay check, report
PASS_LOG_CHARS = 800  # log tails kept for passing evaluations in the committed stores (failures keep theirs)


# ------------------------------------------------------------------------------------------------ plan

def knob_variants(code: str) -> list[tuple[dict[str, str], str]]:
    """Every combination of the knob block's written-set knobs (the designs) that keeps the knob rules, range
    knobs at their defaults, as (values, code): what is worth building ahead; other tunings build on demand."""
    names = [k.name for k in markers.knobs(code) if k.range is None]
    rules, defaults = knob_rules.rules(code), {k.name: k.value for k in markers.knobs(code)}
    return [(values, markers.set_knobs(code, values)) for values in markers.knob_space(code, names)
            if knob_rules.is_valid(rules, {**defaults, **values})]


def _shown(path: Path) -> str:
    """A store's path as the record keeps it: relative to the repository when inside it (no machine paths)."""
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


SHOWN = ("kPlacement", "kSync", "kIssuer", "kChunks")  # a variant's label in the tables


def placement(knobs: dict[str, str] | None) -> str | None:
    v = (knobs or {}).get("kPlacement")
    return v.split("::")[-1] if v else None


# ------------------------------------------------------------------------------------------------ builds

def prebuild_all(jobs: list[tuple[str, str, str]], build_one: Callable[[str, str], tuple[bool, bool]],
                 workers: int, deadline: float) -> dict[str, Any]:
    """Build (label, code, backend) jobs on a thread pool; jobs not started by ``deadline`` are skipped (the
    evaluator builds on demand anyway)."""
    t0 = time.monotonic()
    results: list[dict[str, Any]] = []
    lock = threading.Lock()

    def one(job: tuple[str, str, str]) -> None:
        label, code, backend = job
        if time.monotonic() > deadline:
            row = {"label": label, "backend": backend, "skipped": True}
        else:
            s = time.monotonic()
            try:
                ok, cached = build_one(code, backend)
                row = {"label": label, "backend": backend, "ok": ok, "cached": cached,
                       "seconds": round(time.monotonic() - s, 2)}
            except Exception as exc:  # noqa: BLE001 - recorded; the evaluation builds again and reports it
                row = {"label": label, "backend": backend, "ok": False, "cached": False,
                       "error": f"{type(exc).__name__}: {exc}"[:300]}
        with lock:
            results.append(row)

    with cf.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="prebuild") as pool:
        list(progress(pool.map(one, jobs), "builds", total=len(jobs), unit="build"))
    done = [r for r in results if not r.get("skipped")]
    return {"jobs": len(jobs), "built": len(done), "ok": sum(1 for r in done if r["ok"]),
            "cache_hits": sum(1 for r in done if r.get("cached")), "workers": workers,
            "seconds": round(time.monotonic() - t0, 1),
            "skipped": [f"{r['label']} ({r['backend']})" for r in results if r.get("skipped")],
            "failed": [r for r in done if not r["ok"]]}


# ------------------------------------------------------------------------------------------------ search

class BenchEngine(SearchEngine):
    """The engine with the evaluation protocol of this benchmark: SearchConfig carries ``iters`` but not the
    number of L2 verification trials, so requests get ``trials`` here (the stored request says what ran)."""

    trials = 2

    def _request(self, p: ProgramView) -> EvalRequest:
        r = super()._request(p)
        r.trials = self.trials
        return r


def evaluation_rows(store: Store, run_id: int) -> list[dict[str, Any]]:
    """Per finished evaluation, in evaluation order: what the report needs (no code, no logs)."""
    progs = {p["id"]: p for p in store.programs(run_id)}
    out = []
    for e in store.evaluations(run_id=run_id):
        if e["status"] != "done":
            continue
        p = progs[e["program_id"]]
        r = e.get("result") or {}
        prov = r.get("provenance") or {}
        out.append({"evaluation_id": e["id"], "program_id": p["id"], "source": p["source"],
                    "tags": p["tags"], "knobs": p["knobs"], "verdict": r.get("verdict"),
                    "level": r.get("level_reached"), "reason": (r.get("reason") or "")[:200],
                    "median_ms": r.get("median_ms") if r.get("verdict") == "pass" else None,
                    "seed_median_ms": r.get("seed_median_ms"), "speedup": r.get("speedup"),
                    "speedup_ci": r.get("speedup_ci"),
                    "flagged": bool(r.get("flagged")), "eval_seconds": prov.get("eval_seconds"),
                    "build_cached": prov.get("build_cached"), "warm_workers": prov.get("warm_workers")})
    return out


def best_of(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    ok = [r for r in rows if r["median_ms"] is not None and not r["flagged"]]
    return min(ok, key=lambda r: (r["median_ms"], r["evaluation_id"])) if ok else None


def run_search(name: str, method: str, seed: int, world: int, backend: str, params: dict[str, int],
               evaluator: Any, args: argparse.Namespace, wall_cap: float, store_path: Path) -> dict[str, Any]:
    for suffix in ("", "-wal", "-shm"):
        Path(str(store_path) + suffix).unlink(missing_ok=True)  # a fresh record, never a resumed one
    store = Store(store_path)
    cfg = SearchConfig(world_size=world, backend=backend, params=dict(params), iters=args.iters, seed=seed,
                       proposals_per_generation=args.per_generation,
                       budget=BudgetConfig(generations=100000, wall_s=wall_cap, evaluations=args.candidates + 1))
    # Offline: every slot is a knob move (the design-space source, or uniform random points of the same space).
    cfg.phases.explore.mix = {"design_space": 1.0}
    cfg.phases.exploit.mix = {"design_space": 1.0}
    source = DesignSpaceSource() if method == "search" else RandomKnobSource()
    events = EventBus()
    bar = progress(desc=name)  # the engine may overshoot its evaluation budget by a generation: no total

    def show(ev: Any) -> None:
        if ev.kind != "evaluation_finished":
            return
        bar.update()
        d = ev.data
        try:
            knobs = store.program(d["program_id"])["knobs"]
        except Exception:  # noqa: BLE001 - a log line only
            knobs = {}
        val = (f"{d['median_ms']:.4f} ms {d['speedup']:.3f}x" if d.get("median_ms") is not None
               and d.get("speedup") is not None else (d.get("reason") or "")[:90])
        say(f"  [{name}] eval {d['evaluation_id']:3d} {short(knobs, SHOWN):28s} {d['verdict']:5s} "
            f"{d['level_reached']} [{d['badge']}] {val}")

    events.subscribe(show)
    engine = BenchEngine(WL_REL, store, evaluator, [source], cfg, events, resume=False)
    engine.trials = args.trials
    t0 = time.monotonic()
    error = None
    try:
        summary = engine.run().to_dict()
    except Exception as exc:  # noqa: BLE001 - recorded; the next run still gets its turn
        error = f"{type(exc).__name__}: {exc}"
        summary = engine.summary().to_dict() if engine.run_id is not None else {}
    finally:
        bar.close()
    wall = time.monotonic() - t0
    rows = evaluation_rows(store, engine.run_id) if engine.run_id is not None else []
    cands = [r for r in rows if r["source"] != "seed"]
    seed_rows = [r for r in rows if r["source"] == "seed"]
    base_rows = [r for r in rows if r["source"] == "baseline"]
    best = best_of(cands)
    curve, cur = [], None
    for r in cands:
        if r["median_ms"] is not None and not r["flagged"]:
            cur = r["median_ms"] if cur is None else min(cur, r["median_ms"])
        curve.append(cur)
    res = {"name": name, "method": method, "seed": seed, "world": world, "backend": backend,
           "params": params, "store": _shown(store_path), "run_id": engine.run_id, "wall_cap_s": round(wall_cap, 1),
           "wall_s": round(wall, 2), "error": error, "state": summary.get("state"), "reason": summary.get("reason"),
           "generations": summary.get("generations"), "evaluations": len(rows), "candidates": len(cands),
           "passed": sum(1 for r in cands if r["verdict"] == "pass"),
           "seed_ms": seed_rows[0]["median_ms"] if seed_rows else None,
           "baseline_ms": base_rows[0]["median_ms"] if base_rows else None,
           "best_ms": best and best["median_ms"], "best_knobs": best and best["knobs"],
           "best_speedup": best and best["speedup"], "best_speedup_ci": best and best["speedup_ci"],
           "best_evaluation_id": best and best["evaluation_id"],
           "placements_evaluated": sorted({p for r in cands if (p := placement(r["knobs"]))}),
           "placements_passed": sorted({p for r in cands if r["verdict"] == "pass" and (p := placement(r["knobs"]))}),
           "best_so_far_ms": curve, "prebuilds": summary.get("prebuilds"), "rows": rows}
    # Provenance for the record: what the evaluator said about the machine (first evaluation that has it).
    prov = {}
    for e in store.evaluations(run_id=engine.run_id) if engine.run_id is not None else []:
        p = (e.get("result") or {}).get("provenance") or {}
        if p.get("gpu"):
            prov = {k: p.get(k) for k in ("gpu", "driver", "cuda_driver", "nccl", "torch", "torch_cuda", "mps",
                                          "mps_thread_percentage", "symm_mem_backend", "date", "git", "python")}
            break
    res["provenance"] = prov
    if engine.run_id is not None:
        store.put_meta(engine.run_id, "benchmark", {
            "script": "benchmarks/search/run.py", "method": method, "seed": seed, "preset": args.preset_of[name],
            "params": params, "iters": args.iters, "trials": args.trials, "candidates_budget": args.candidates,
            "sampler": getattr(source, "last_sampler", "uniform random") or "uniform random",
            "provenance": prov, "badge": getattr(evaluator, "badge", "real")})
    store.close()
    return res


# ------------------------------------------------------------------------------------------------ stores

def trim(logs: dict[str, str]) -> dict[str, str]:
    """A passing evaluation's logs, each cut to its last PASS_LOG_CHARS characters."""
    return {k: (v if len(v) <= PASS_LOG_CHARS else "...\n" + v[-PASS_LOG_CHARS:]) for k, v in logs.items()}


def compact(path: Path) -> dict[str, int]:
    """Keep a committed store small: requests lose the candidate and parent code (the program row holds the
    code and its hash, which is what the replay evaluator matches on), passing evaluations keep only short log
    tails (failures keep theirs), the file leaves WAL mode and is vacuumed. Returns sizes before and after."""
    before = path.stat().st_size + sum(Path(str(path) + s).stat().st_size for s in ("-wal",)
                                       if Path(str(path) + s).exists())
    conn = sqlite3.connect(path)
    try:
        hashes = dict(conn.execute("SELECT id, code_hash FROM programs"))
        rows = conn.execute("SELECT id, program_id, request, verdict, logs, result FROM evaluations").fetchall()
        for eid, pid, req, verdict, logs, result in rows:
            r = json.loads(req)
            if "candidate_code" in r:
                r.pop("candidate_code", None)
                r.pop("parent_code", None)
                r["candidate_code_sha256"] = hashes.get(pid)
                r["compacted"] = "code dropped: it is the program's code (programs.code)"
            new_logs, new_result = logs, result
            if verdict == "pass":
                if logs:
                    new_logs = json.dumps(trim(json.loads(logs)))
                if result:
                    d = json.loads(result)
                    d["logs"] = trim(d.get("logs") or {})
                    new_result = json.dumps(d)
            conn.execute("UPDATE evaluations SET request = ?, logs = ?, result = ? WHERE id = ?",
                         (json.dumps(r, sort_keys=True), new_logs, new_result, eid))
        # A decided proposal's code is its program's code (programs.code): kept once. Pending ones (the only
        # proposals anything reads back: the gate on resume) and rejected ones keep theirs.
        blanked = conn.execute(
            "UPDATE proposals SET code = '' WHERE program_id IS NOT NULL AND status != 'pending' AND code = "
            "(SELECT code FROM programs WHERE programs.id = proposals.program_id)").rowcount
        for (run_id,) in conn.execute("SELECT id FROM runs").fetchall():
            conn.execute("INSERT OR REPLACE INTO meta (run_id, key, value, updated_at) VALUES (?, ?, ?, ?)",
                         (run_id, "compacted", json.dumps({
                             "by": "benchmarks/search/run.py",
                             "what": "evaluation requests without candidate/parent code (see programs.code, "
                                     "request.candidate_code_sha256); passing evaluations keep the last "
                                     f"{PASS_LOG_CHARS} characters of each log; decided proposals' code "
                                     "blanked where it equals their program's code",
                             "proposals_blanked": blanked}), time.time()))
        conn.commit()
        conn.execute("PRAGMA journal_mode = DELETE")
        conn.execute("VACUUM")
    finally:
        conn.close()
    return {"bytes_before": before, "bytes_after": path.stat().st_size}


def check_replay(path: Path) -> dict[str, Any]:
    """Every finished real (or, in a dry run, simulated) evaluation of the store is served back by the replay
    evaluator for a request built from the program's code and the stored request's parameters."""
    st = Store(path, readonly=True)
    try:
        badges = {e["badge"] for e in st.evaluations()}
        accept = ("real",) if "real" in badges else tuple(sorted(badges))
        rep = ReplayEvaluator(path, accept_badges=accept)
        hits = misses = 0
        for run in st.runs():
            progs = {p["id"]: p for p in st.programs(run["id"])}
            for e in st.evaluations(run_id=run["id"]):
                if e["status"] != "done":
                    continue
                q = e["request"]
                req = EvalRequest(candidate_code=progs[e["program_id"]]["code"], workload_dir=q["workload_dir"],
                                  params=q.get("params") or {}, world_size=e["world_size"], backend=e["backend"])
                got = rep.evaluate(req)
                if got.verdict == "unavailable" or got.median_ms != e["median_ms"]:
                    misses += 1
                else:
                    hits += 1
        rep.close()
        return {"accepted_badges": list(accept), "served": hits, "missed": misses, "ok": hits > 0 and misses == 0}
    finally:
        st.close()


# ------------------------------------------------------------------------------------------------ report

def compare(runs: list[dict[str, Any]], seeds: list[int]) -> dict[str, Any]:
    """Search vs random at equal evaluation budget: per seed, the best of the first N candidates of each."""
    per_seed = []
    for s in seeds:
        a = next((r for r in runs if r["method"] == "search" and r["seed"] == s and r["world"] == 4), None)
        b = next((r for r in runs if r["method"] == "random" and r["seed"] == s and r["world"] == 4), None)
        if a is None or b is None:
            continue
        ca = [r for r in a["rows"] if r["source"] != "seed"]
        cb = [r for r in b["rows"] if r["source"] != "seed"]
        n = min(len(ca), len(cb))
        ba, bb = best_of(ca[:n]), best_of(cb[:n])
        row = {"seed": s, "equal_budget_candidates": n,
               "search_best_ms": ba and ba["median_ms"], "random_best_ms": bb and bb["median_ms"],
               "search_best_knobs": ba and short(ba["knobs"], SHOWN),
               "random_best_knobs": bb and short(bb["knobs"], SHOWN),
               "search_best_vs_seed": ba and ba["speedup"], "random_best_vs_seed": bb and bb["speedup"],
               "same_point": bool(ba and bb and ba["knobs"] == bb["knobs"])}
        if ba and bb:
            row["random_over_search"] = bb["median_ms"] / ba["median_ms"]
            row["winner"] = ("search" if ba["median_ms"] < bb["median_ms"] else
                             "random" if bb["median_ms"] < ba["median_ms"] else "tie")
        else:
            row["winner"] = "search" if ba else "random" if bb else "none"
        per_seed.append(row)

    def mean(key: str) -> float | None:
        v = [r[key] for r in per_seed if r.get(key) is not None]
        return statistics.fmean(v) if v else None

    return {"per_seed": per_seed, "search_wins": sum(r["winner"] == "search" for r in per_seed),
            "random_wins": sum(r["winner"] == "random" for r in per_seed),
            "mean_search_best_ms": mean("search_best_ms"), "mean_random_best_ms": mean("random_best_ms"),
            "mean_random_over_search": mean("random_over_search"),
            "mean_search_best_vs_seed": mean("search_best_vs_seed"),
            "mean_random_best_vs_seed": mean("random_best_vs_seed"),
            "search_better_on_average": (mean("search_best_ms") or 0) < (mean("random_best_ms") or 0)
            if per_seed else None}


def fmt(v: Any, p: int = 4) -> str:
    return "-" if v is None else f"{v:.{p}f}" if isinstance(v, float) else str(v)


def best_ratio(run: dict[str, Any]) -> str:
    """A run's best x seed with its bootstrap interval and label (runs recorded before intervals: the ratio)."""
    if run.get("best_speedup") is None:
        return "-"
    return ratio_cell({"speedup": run["best_speedup"], "speedup_ci": run.get("best_speedup_ci")})


def make_table(result: dict[str, Any]) -> str:
    m = result["meta"]
    badge = m["badge"]
    title = f"# Offline search on GEMM + AllGather ({m['date']})"
    lines = [title + (" — SIMULATED, not a measurement" if badge == "simulated" else ""),
             "",
             f"GPU {m['gpu']}, driver {m['driver']}, NCCL {m['nccl']}, torch {m['torch']}, evaluator badge "
             f"**{badge}**, git {m['git']}. Times: median over {m['iters']} timed iterations of the slowest rank "
             f"(ms), {m['trials']} fresh-input verification trials, the seed re-measured in every evaluation "
             "(x seed = seed ms / candidate ms in the same evaluation). symm: all ranks share ONE GPU under MPS "
             "(one L2, one clock): ratios there say nothing about NVLink.", "",
             "| run | world | backend | MPS | preset | method | seed | candidates (passed) | best ms | best x seed "
             "| baseline ms | seed ms | best knobs | placements evaluated | wall s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["runs"]:
        lines.append(
            f"| {r['name']} | {r['world']} | {r['backend']} | {fmt(r['provenance'].get('mps'))} | "
            f"{m['presets'][r['name']]} | {r['method']} | {r['seed']} | {r['candidates']} ({r['passed']}) | "
            f"{fmt(r['best_ms'])} | {best_ratio(r)} | {fmt(r['baseline_ms'])} | {fmt(r['seed_ms'])} | "
            f"{short(r['best_knobs'], SHOWN)} | {', '.join(r['placements_evaluated']) or '-'} | "
            f"{fmt(r['wall_s'], 1)} |")
    c = result["comparison"]
    if c["per_seed"]:
        lines += ["", "## Search vs random sampling of the same knob space (4 ranks, symm), equal budget", "",
                  "| seed | candidates each | search best ms | random best ms | random / search | search knobs "
                  "| random knobs | winner |", "|---|---|---|---|---|---|---|---|"]
        for s in c["per_seed"]:
            lines.append(f"| {s['seed']} | {s['equal_budget_candidates']} | {fmt(s['search_best_ms'])} | "
                         f"{fmt(s['random_best_ms'])} | {fmt(s.get('random_over_search'), 3)} | "
                         f"{s['search_best_knobs'] or '-'} | {s['random_best_knobs'] or '-'} | {s['winner']}"
                         f"{' (same point)' if s['same_point'] else ''} |")
        lines.append(f"| mean | | {fmt(c['mean_search_best_ms'])} | {fmt(c['mean_random_best_ms'])} | "
                     f"{fmt(c['mean_random_over_search'], 3)} | | | search {c['search_wins']}, random "
                     f"{c['random_wins']} |")
    t = result["throughput"]
    b = result["builds"]
    lines += ["", f"Evaluations per GPU-hour (search phase, warm workers): **{fmt(t['candidates_per_gpu_hour'], 0)}** "
              f"candidates/h ({t['candidates']} candidates + {t['seed_evaluations']} seed evaluations in "
              f"{fmt(t['search_wall_s'], 1)} s; target >= 300); mean evaluation {fmt(t['mean_eval_seconds'], 2)} s.",
              f"Builds: {b['ok']}/{b['jobs']} variants and seeds in {b['seconds']} s on {b['workers']} threads "
              f"({b['cache_hits']} cache hits); build cache hit rate during the searches "
              f"**{fmt(t['search_build_cache_hit_rate'], 3)}**.",
              f"Placements that won: {', '.join(f'{k}: {v}' for k, v in result['placements_won'].items()) or '-'}."]
    if m["skipped"]:
        lines.append("Skipped (budget or flags): " + "; ".join(m["skipped"]) + ".")
    failed = [c for c in result["checks"] if not c["ok"]]
    lines.append("Checks: " + ("all held." if not failed else "FAILED: " + "; ".join(c["what"] for c in failed)))
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------ main

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT"), help="folder for the raw JSON and the tarball")
    ap.add_argument("--budget-s", type=float, default=420.0, help="stop starting new work after this long")
    ap.add_argument("--preset", default="4096", help="size preset of the 4-rank symm searches (small, 4096, 8192)")
    ap.add_argument("--nccl-preset", default=None, help="size preset of the world-1 nccl search (default --preset)")
    ap.add_argument("--candidates", type=int, default=30, help="evaluated candidates per run (seed not counted)")
    ap.add_argument("--seeds", type=int, default=3, help="seeds of search and of random at 4 ranks")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--trials", type=int, default=2)
    ap.add_argument("--per-generation", type=int, default=4, help="proposals per generation")
    ap.add_argument("--parts", default="symm4,nccl1", help="comma list of symm4, nccl1")
    ap.add_argument("--configs-budget-s", type=float, default=220.0,
                    help="seconds for the benchmark configurations and the failures run (0: skip them)")
    ap.add_argument("--recycle-every", type=int, default=1000,
                    help="eval commands per warm world before it is replaced (the 72 variants are known kernels)")
    ap.add_argument("--cache-dir", default=None, help="build cache (default: the evaluator's)")
    ap.add_argument("--build-workers", type=int, default=min(16, os.cpu_count() or 4))
    ap.add_argument("--no-compact", action="store_true", help="leave full requests and logs in the stores")
    ap.add_argument("--dry-run", action="store_true",
                    help="SIMULATED evaluator, no GPU, no nvcc; every file goes to a temp dir")
    ap.add_argument("--dry-run-builds", type=int, default=0,
                    help="with --dry-run: build this many of the jobs for real with nvcc (plumbing check)")
    args = ap.parse_args(argv)
    t_start = time.monotonic()
    deadline = t_start + args.budget_s
    parts = [p for p in args.parts.split(",") if p]
    if set(parts) - {"symm4", "nccl1"}:
        print(f"--parts {args.parts}: use a comma list of symm4, nccl1", file=sys.stderr)
        return 2

    # Where files go: the repo's benchmarks/search/ for real runs; a temp tree (same layout) for a dry run.
    if args.dry_run:
        tree = Path(tempfile.mkdtemp(prefix="cuco-search-dry-"))
        out = Path(args.out) if args.out else tree / "out"
        if (ROOT / DEST_REL).resolve() in [out.resolve(), *out.resolve().parents]:
            print(f"--dry-run never writes into {DEST_REL}: pick another --out", file=sys.stderr)
            return 2
    else:
        tree = ROOT
        out = Path(args.out) if args.out else ROOT / DEST_REL / "out"
    dest = tree / DEST_REL
    dest.mkdir(parents=True, exist_ok=True)
    stores = tree / STORES_REL
    stores.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)

    wl = load_workload(WL_REL)
    presets = {"symm4": args.preset, "nccl1": args.nccl_preset or args.preset}
    for p in presets.values():
        if p not in wl.size_presets:
            print(f"preset {p!r} unknown; gemm_allgather has {', '.join(wl.size_presets)}", file=sys.stderr)
            return 2
    base = (ROOT / WL_REL / wl.baseline).read_text()
    variants = knob_variants(base)
    backends = sorted({"symm" for p in parts if p == "symm4"} | {"nccl" for p in parts if p == "nccl1"})

    # Evaluator
    if args.dry_run:
        evaluator: Any = SimulatedEvaluator(seed=0)
        cache_dir = Path(tempfile.mkdtemp(prefix="cuco-search-dry-cache-"))
        build_cfg = None
    else:
        if not detect_gpu():
            print("no GPU (nvidia-smi lists none): use --dry-run on a CPU machine")
            return 2
        # A world that has not started in 2 minutes will not (cold starts take seconds): fail it inside the budget.
        ecfg = EvaluatorConfig(recycle_every=args.recycle_every, start_timeout_s=120.0)
        if args.cache_dir:
            ecfg.cache_dir = Path(args.cache_dir)
        evaluator = GpuEvaluator(ecfg)
        cache_dir, build_cfg = ecfg.cache_dir, ecfg.build
    badge = getattr(evaluator, "badge", "real")
    print(f"evaluator: {type(evaluator).__name__} [{badge}]; files -> {dest}, stores -> {stores}; raw JSON -> {out}",
          flush=True)

    skipped: list[str] = []
    runs: list[dict[str, Any]] = []
    warmup: dict[str, Any] = {}
    plan: list[tuple[str, str, int, int, str, str]] = []  # name, method, seed, world, backend, part
    builds: dict[str, Any] = {"jobs": 0, "built": 0, "ok": 0, "cache_hits": 0, "workers": 0, "seconds": 0.0,
                              "skipped": [], "failed": []}
    args.preset_of = {}
    search_wall, history, fatal = 0.0, [], None
    recorded_configs: dict[str, Any] = {"configs": [], "skipped": [], "stores": []}
    recorded_failures: dict[str, Any] = {}
    try:
        # 1. builds
        jobs = [(f"device_lsa {short(v, SHOWN)}", code, b) for b in backends for v, code in variants]
        for b in backends:
            seed_file = wl.seeds[b]
            jobs.append((seed_file, (ROOT / WL_REL / seed_file).read_text(), b))
        real_builds = not args.dry_run or args.dry_run_builds > 0
        if args.dry_run and args.dry_run_builds > 0:
            jobs = jobs[:args.dry_run_builds]

        def build_one(code: str, backend: str) -> tuple[bool, bool]:
            if not real_builds:
                evaluator.prebuild(EvalRequest(candidate_code=code, workload_dir=WL_REL, backend=backend))
                return True, False
            r = build_mod.build(code, backend, build_mod.for_workload(build_cfg, ROOT / WL_REL), cache_dir)
            return bool(r.ok), bool(r.cached)

        print(f"building {len(jobs)} jobs ({len(variants)} variants x {backends} + seeds) on "
              f"{args.build_workers} threads{'' if real_builds else ' (SIMULATED: no nvcc)'} ...", flush=True)
        builds = prebuild_all(jobs, build_one, max(1, args.build_workers), t_start + 0.5 * args.budget_s)
        builds["real_nvcc"] = real_builds
        builds["cache_dir"] = "<cache>" if not args.dry_run else str(cache_dir)
        print(f"built {builds['ok']}/{builds['built']} in {builds['seconds']} s, {builds['cache_hits']} cache hits, "
              f"{len(builds['skipped'])} skipped", flush=True)
        for f in builds["failed"][:5]:
            print(f"  build FAILED: {f}", flush=True)
        if builds["skipped"]:
            skipped.append(f"{len(builds['skipped'])} prebuilds (over half the budget; built on demand)")

        # 2a. the configurations the notebooks offer, and a run with failures (record_configs.py)
        if args.configs_budget_s > 0:
            cfg_deadline = min(deadline - RESERVE_S, time.monotonic() + args.configs_budget_s)
            print(f"recording benchmark configurations ({args.configs_budget_s:g} s) ...", flush=True)
            recorded_configs = record_configs(evaluator, stores, cfg_deadline - 30.0, iters=args.iters,
                                              trials=args.trials)
            recorded_failures = record_failures(evaluator, stores, cfg_deadline, iters=args.iters)
            skipped += [f"config {c} (budget)" for c in recorded_configs["skipped"]]
            print(f"configurations: {len(recorded_configs['configs'])} recorded in {recorded_configs['seconds']} s, "
                  f"{len(recorded_configs['skipped'])} skipped; failures run: {recorded_failures}", flush=True)

        # 2-3. per part (symm4, then nccl1 unless --parts says otherwise): warm the world's rank workers and
        # measure the per-evaluation time (seed + baseline, not recorded), then that part's searches. A part whose
        # warm-up does not pass is not searched (30 copies of the same error would say nothing more).
        for part in parts:
            if part == "symm4":
                for s in range(args.seeds):
                    for method in ("search", "random"):  # interleaved: drift hits both methods alike
                        plan.append((f"gemm_allgather-symm4-{method}-seed{s}", method, s, 4, "symm", part))
            else:
                plan.append(("gemm_allgather-nccl1-search-seed0", "search", 0, 1, "nccl", part))
        args.preset_of = {name: presets[part] for name, _, _, _, _, part in plan}
        done_runs = 0
        for part in parts:
            world, backend = (4, "symm") if part == "symm4" else (1, "nccl")
            params = dict(wl.size_presets[presets[part]])
            part_plan = [x for x in plan if x[5] == part]
            if deadline - time.monotonic() - RESERVE_S < 15:
                skipped += [f"{x[0]} (budget)" for x in part_plan]
                done_runs += len(part_plan)
                continue
            secs, r = [], None
            for i in range(3):  # cold, then warm twice
                t = time.monotonic()
                r = evaluator.evaluate(EvalRequest(candidate_code=base, workload_dir=WL_REL, params=params,
                                                   world_size=world, backend=backend, iters=args.iters,
                                                   trials=args.trials, label=f"warm-up {i}"))
                secs.append(round(time.monotonic() - t, 3))
                if r.verdict != "pass" and i == 0 and "did not start" in r.reason:
                    break  # the world cannot start: do not wait for it twice more
            warmup[part] = {"seconds": secs, "verdict": r.verdict, "level": r.level_reached,
                            "reason": r.reason[:500], "median_ms": r.median_ms, "seed_median_ms": r.seed_median_ms,
                            "log_tails": {k: v[-1500:] for k, v in r.logs.items()} if r.verdict != "pass" else {}}
            print(f"warm-up {part} ({presets[part]}): {r.verdict} at {r.level_reached} {fmt(r.median_ms)} ms, seed "
                  f"{fmt(r.seed_median_ms)} ms; evaluation seconds cold/warm {secs} {r.reason[:300]}", flush=True)
            if r.verdict != "pass":
                skipped += [f"{x[0]} (warm-up {r.verdict}: {r.reason[:120]})" for x in part_plan]
                done_runs += len(part_plan)
                continue
            per_eval = max(secs[1:] or [1.0])
            projected = len(part_plan) * (args.candidates + 3) * per_eval
            left = deadline - time.monotonic() - RESERVE_S
            print(f"{part}: projected {projected:.0f} s for {len(part_plan)} runs at {per_eval:.2f} s per "
                  f"evaluation; {left:.0f} s left in the budget", flush=True)
            if projected > left:
                print(f"WARNING: {part} runs will not all reach {args.candidates} candidates inside --budget-s "
                      f"{args.budget_s:g}: raise --budget-s or use --preset small", flush=True)
            for name, method, seed, world_, backend_, _ in part_plan:
                left = deadline - time.monotonic() - RESERVE_S
                if left < 15:
                    skipped.append(f"{name} (budget)")
                    print(f"SKIPPED {name}: {left:.0f} s left", flush=True)
                    done_runs += 1
                    continue
                # A fair share of what is left for each remaining run (1.5x: early runs may run over a bit).
                cap = min(left, 1.5 * left / (len(plan) - done_runs))
                print(f"run {done_runs + 1}/{len(plan)} {name}: wall cap {cap:.0f} s", flush=True)
                res = run_search(name, method, seed, world_, backend_, params, evaluator, args, cap,
                                 stores / f"{name}.sqlite")
                runs.append(res)
                done_runs += 1
                search_wall += res["wall_s"]
                print(f"  -> {res['candidates']} candidates ({res['passed']} passed) in {res['wall_s']:.1f} s; "
                      f"best {fmt(res['best_ms'])} ms ({short(res['best_knobs'], SHOWN)}), "
                      f"{fmt(res['best_speedup'], 3)}x "
                      f"seed; {res['state']}: {res['reason']}{'; ERROR ' + res['error'] if res['error'] else ''}",
                      flush=True)
    except Exception:  # noqa: BLE001 - reported (and the exit code says so); what ran is still written
        fatal = traceback.format_exc()
        print(f"FATAL: {fatal}", flush=True)
    finally:
        history = list(getattr(evaluator, "history", []))
        close = getattr(evaluator, "close", None)
        if callable(close):
            close()

    time.sleep(0 if args.dry_run else 2.0)
    leftover = live_worker_pids()
    if leftover:
        print(f"LEAK: rank worker processes still alive after close(): {leftover}", flush=True)

    # 4. stores: compaction, replay, recorded_runs
    store_checks = {}
    extra = [*recorded_configs["stores"], *([recorded_failures["store"]] if recorded_failures.get("store") else [])]
    # run stores are relative to the repository when they are in it
    for p in [ROOT / r["store"] for r in runs] + [stores / name for name in extra]:
        if not p.exists():
            continue
        sizes = {} if args.no_compact else compact(p)
        store_checks[p.name] = {**sizes, "bytes": p.stat().st_size, "replay": check_replay(p)}
        if p.parent.resolve() == stores.resolve():
            record(stores, p.name, "search", written_by="benchmarks/search/run.py")
    found = {Path(x).name for x in recorded_runs(stores)}

    # 5. numbers
    all_rows = [row for r in runs for row in r["rows"]]
    cands = [row for row in all_rows if row["source"] != "seed"]
    built = [row for row in all_rows if row["build_cached"] is not None]
    evs = [row["eval_seconds"] for row in all_rows if row["eval_seconds"] is not None]
    throughput = {"candidates": len(cands), "seed_evaluations": len(all_rows) - len(cands),
                  "search_wall_s": round(search_wall, 1),
                  "candidates_per_gpu_hour": len(cands) / (search_wall / 3600.0) if search_wall > 0 else None,
                  "evaluations_per_gpu_hour": len(all_rows) / (search_wall / 3600.0) if search_wall > 0 else None,
                  "mean_eval_seconds": statistics.fmean(evs) if evs else None,
                  "search_build_cache_hit_rate": (sum(1 for row in built if row["build_cached"]) / len(built))
                  if built else None,
                  "warm_evaluations": sum(1 for row in all_rows if row["warm_workers"]),
                  "cold_evaluations": sum(1 for row in all_rows if row["warm_workers"] is False)}
    seeds = list(range(args.seeds))
    comparison = compare(runs, seeds)
    placements_won: dict[str, str] = {}
    for r in runs:
        if r["best_knobs"]:
            placements_won[r["name"]] = f"{placement(r['best_knobs'])} ({short(r['best_knobs'], SHOWN)})"
    prov = next((r["provenance"] for r in runs if r["provenance"].get("gpu") and r["backend"] == "symm"),
                next((r["provenance"] for r in runs if r["provenance"].get("gpu")), {}))
    checks = []
    for name, *_ in plan:
        r = next((x for x in runs if x["name"] == name), None)
        checks.append({"what": f"{name} ran without error", "ok": r is not None and not r["error"]})
        if r is None:
            continue
        checks.append({"what": f"{name}: >= {args.candidates} evaluated candidates ({r['candidates']})",
                       "ok": r["candidates"] >= args.candidates})
        checks.append({"what": f"{name}: >= 2 placements evaluated ({', '.join(r['placements_evaluated'])})",
                       "ok": len(r["placements_evaluated"]) >= 2})
        sc = store_checks.get(f"{name}.sqlite", {})
        checks.append({"what": f"{name}.sqlite served by the replay evaluator ({sc.get('replay')})",
                       "ok": bool(sc.get("replay", {}).get("ok"))})
        checks.append({"what": f"{name}.sqlite found by workbench.recorded_runs",
                       "ok": f"{name}.sqlite" in found})
    for name in extra:
        sc = store_checks.get(name, {})
        checks.append({"what": f"{name} served by the replay evaluator ({sc.get('replay')})",
                       "ok": bool(sc.get("replay", {}).get("ok"))})
    if args.configs_budget_s > 0:
        checks.append({"what": f"failures run fails at L0, L1 and L2 ({recorded_failures.get('failures_by_level')})",
                       "ok": {"L0", "L1", "L2"} <= set(recorded_failures.get("failures_by_level") or {})})
    if fatal:
        checks.append({"what": "the script ran to the end (" + fatal.strip().splitlines()[-1][:200] + ")",
                       "ok": False})
    checks.append({"what": f"no rank worker left after close() ({leftover or 'none'})", "ok": not leftover})
    if builds["failed"]:
        checks.append({"what": f"{len(builds['failed'])} prebuild(s) failed", "ok": False})
    meta = {"date": prov.get("date") or dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "badge": badge, "gpu": prov.get("gpu"), "driver": prov.get("driver"), "nccl": prov.get("nccl"),
            "torch": prov.get("torch"), "mps": prov.get("mps"), "git": prov.get("git"),
            "presets": args.preset_of, "params": {p: wl.size_presets[presets[p]] for p in parts},
            "iters": args.iters, "trials": args.trials, "candidates_budget": args.candidates, "seeds": seeds,
            "per_generation": args.per_generation, "budget_s": args.budget_s, "skipped": skipped,
            "dry_run": args.dry_run, "wall_s": round(time.monotonic() - t_start, 1)}
    result = {"meta": meta, "builds": builds, "warmup": warmup, "throughput": throughput,
              "comparison": comparison, "placements_won": placements_won, "stores": store_checks,
              "recorded_runs_found": sorted(found), "checks": checks, "runs": runs,
              "recorded_configs": recorded_configs, "recorded_failures": recorded_failures,
              "eval_history_len": len(history), "fatal": fatal}
    text = json.dumps(result, indent=1, default=str)
    (out / "search_bench.json").write_text(text)
    summary = {k: v for k, v in result.items() if k != "runs"}
    summary["runs"] = [{k: v for k, v in r.items() if k != "rows"} for r in runs]
    (dest / "results.json").write_text(json.dumps(summary, indent=1, default=str))
    table = make_table(result)
    (dest / "RESULTS.md").write_text(table)
    # One tarball of what belongs in benchmarks/search/ and recordings/ (a remote runner may copy back only a few
    # files of --out).
    tar_path = out / "benchmarks_search.tar.gz"
    with tarfile.open(tar_path, "w:gz") as tar:
        for f in sorted(dest.iterdir()):
            if f.is_file() and (f.suffix == ".md" or f.name == "results.json"):
                tar.add(f, arcname=str(DEST_REL / f.name))
        for f in sorted(stores.iterdir()):
            if f.is_file() and (f.suffix == ".sqlite" or f.name == MANIFEST):
                tar.add(f, arcname=str(STORES_REL / f.name))
    print(f"\nraw JSON {out / 'search_bench.json'}; results.json, RESULTS.md in {dest}; stores and {MANIFEST} in "
          f"{stores}; tarball {tar_path} (extract at the repo root)")
    print(f"wall {meta['wall_s']} s; skipped: {skipped or 'nothing'}")
    print()
    print(table)
    return 0 if all(c["ok"] for c in checks) and not skipped else 1


if __name__ == "__main__":
    sys.exit(main())
