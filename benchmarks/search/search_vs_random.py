"""Offline design-space search against uniform random sampling at an equal evaluation budget (no LLM).

  python benchmarks/search/search_vs_random.py                          # CPU: the SIMULATED evaluator
  PYTHONPATH=. python3 benchmarks/search/search_vs_random.py --evaluator gpu --out "$OUT"    # one GPU, ~4 min

A landscape is a workload at a world size and backend (--landscapes WORKLOAD:WORLD:BACKEND,...; default the
attention kernel at world size 1 under nccl, where only its compute knobs matter, and MoE and GEMM + AllGather at 4
ranks under symm). For each landscape and each of --seeds search seeds, two runs of the search engine from the
workload's baseline at the small preset: one whose every slot is
the design-space source (Optuna over the knob block, range knobs as IntDistributions), one whose every slot is
uniform random points of the same knob space (RandomKnobSource). Both get --budget candidate evaluations; when
the wall cap (--budget-s, GPU only by default) stops runs early, every run of a landscape is cut to the smallest
count any of them reached, so the budgets stay equal (a run stopped before its first candidate is left out and
listed). Per run: the best speed-up over the seed among its first N candidates.
Per method: mean best, its 95% bootstrap interval (cuco_kit.evaluate.stats.mean_ci), and a two-sided
Mann-Whitney U test of search's bests against random's: scipy.stats.mannwhitneyu when scipy is installed, else
the exact permutation distribution of U computed here with numpy (the JSON and the table say which).

Runs go through a thread pool (--parallel-runs): the GPU evaluator serialises evaluations, and each thread builds
its next candidate before it queues, so nvcc keeps the cores busy while the GPU measures. Writes
search_vs_random.json and SEARCH_VS_RANDOM.md to --dest (default: benchmarks/search/ with the GPU, a temp dir
with the simulated evaluator) and copies them under --out; prints the table last. Exit code 0 when every run
evaluated at least one candidate.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import hashlib
import itertools
import json
import math
import os
import shutil
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

try:  # the rank test: scipy's when installed, else the exact one below
    from scipy.stats import mannwhitneyu
except ImportError:
    mannwhitneyu = None

# Run by path, not installed: the repository root (the kit) goes first on sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from cuco_kit.evaluate.device import MULTICAST_OFF

os.environ.update(MULTICAST_OFF)  # every child inherits multicast off (the launcher sets them too)

from cuco_kit.evaluate.api import EvalRequest, EvalResult, Progress
from cuco_kit.evaluate.device import detect_gpu
from cuco_kit.evaluate.gpu_evaluator import EvaluatorConfig, GpuEvaluator
from cuco_kit.evaluate.simulated import SimulatedEvaluator
from cuco_kit.evaluate.stats import mean_ci
from cuco_kit.events import EventBus
from cuco_kit.search.budget import BudgetConfig
from cuco_kit.search.config import SearchConfig
from cuco_kit.search.design_space import DesignSpaceSource, RandomKnobSource
from cuco_kit.search.engine import SearchEngine
from cuco_kit.source import markers
from cuco_kit.store import Store
from cuco_kit.workload import load_workload

ROOT = Path(__file__).resolve().parents[2]
DEST = ROOT / "benchmarks" / "search"
METHODS = ("search", "random")
LANDSCAPES = "attention_cp:1:nccl,moe_dispatch_combine:4:symm,gemm_allgather:4:symm"
WALL_CAP_REASON = "not evaluated: the benchmark's wall cap was reached"
# Optuna 5 deprecates constraints_func (still honoured); once per ask it would drown the log.
warnings.filterwarnings("ignore", category=FutureWarning, message=".*constraints_func.*")


# ------------------------------------------------------------------------------------------------ statistics

def mann_whitney_exact(a: list[float], b: list[float]) -> float:
    """Two-sided p-value of the Mann-Whitney U test from the exact permutation distribution of U (every split
    of the pooled values into groups of len(a) and len(b)); ties take average ranks. Fine up to ~20 values."""
    pooled = np.asarray(a + b, dtype=float)
    order = pooled.argsort(kind="mergesort")
    ranks = np.empty(len(pooled))
    ranks[order] = np.arange(1, len(pooled) + 1)
    for v in np.unique(pooled):  # average ranks over ties
        tie = pooled == v
        ranks[tie] = ranks[tie].mean()
    n1, n2 = len(a), len(b)
    centre = n1 * n2 / 2.0

    def u_of(idx: tuple[int, ...]) -> float:
        return float(ranks[list(idx)].sum()) - n1 * (n1 + 1) / 2.0

    observed = abs(u_of(tuple(range(n1))) - centre)
    splits = [abs(u_of(c) - centre) for c in itertools.combinations(range(n1 + n2), n1)]
    return sum(1 for d in splits if d >= observed - 1e-9) / len(splits)


def rank_test(a: list[float], b: list[float]) -> dict[str, Any]:
    """{"p": two-sided p-value, "method": which test}: scipy's Mann-Whitney U when installed, else the exact
    permutation test above."""
    if len(a) < 2 or len(b) < 2:
        return {"p": None, "method": "too few runs for a rank test"}
    if mannwhitneyu is None:
        return {"p": mann_whitney_exact(a, b),
                "method": "Mann-Whitney U, exact permutation distribution (numpy; scipy not installed)"}
    return {"p": float(mannwhitneyu(a, b, alternative="two-sided").pvalue),
            "method": "Mann-Whitney U, two-sided (scipy.stats.mannwhitneyu)"}


# ------------------------------------------------------------------------------------------------ runs

class PrebuildingEvaluator:
    """Builds a request's library in the calling thread before the wrapped evaluator (which serialises
    evaluations) takes it, so parallel runs overlap their nvcc builds with each other's measurements. Runs that
    need the same source (every run starts from the baseline) build it once: the others wait for that build.
    Past `deadline` (time.monotonic()) a request is answered "unavailable" without building or measuring, and
    the runs leave such answers out: the wall cap holds however many runs were queued for the GPU."""

    def __init__(self, inner: Any, deadline: float) -> None:
        self.inner = inner
        self.deadline = deadline
        self.badge = getattr(inner, "badge", "real")
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def evaluate(self, request: EvalRequest, progress: Progress | None = None) -> EvalResult:
        if time.monotonic() > self.deadline:
            return EvalResult("L0", "unavailable", reason=WALL_CAP_REASON, badge=self.badge)
        if hasattr(self.inner, "prebuild"):
            key = hashlib.sha256(f"{request.backend}\0{request.candidate_code}".encode()).hexdigest()
            with self._guard:
                lock = self._locks.setdefault(key, threading.Lock())
            with lock:
                try:
                    self.inner.prebuild(request)
                except Exception as exc:  # noqa: BLE001 - evaluate() builds again and reports a failure properly
                    print(f"  prebuild of {request.label or 'a candidate'} failed: {exc}", flush=True)
        if time.monotonic() > self.deadline:
            return EvalResult("L0", "unavailable", reason=WALL_CAP_REASON, badge=self.badge)
        return self.inner.evaluate(request, progress)


def parse_landscapes(spec: str) -> list[tuple[str, int, str]]:
    """'WORKLOAD:WORLD:BACKEND,...' -> [(workload, world, backend)]; a bad entry is a one-line SystemExit."""
    out = []
    for item in (x.strip() for x in spec.split(",") if x.strip()):
        parts = item.split(":")
        if len(parts) != 3 or not parts[1].isdigit() or parts[2] not in ("nccl", "symm") or \
                not (ROOT / "sample_kernels" / parts[0]).is_dir():
            raise SystemExit(f"--landscapes: {item!r} is not WORKLOAD:WORLD:BACKEND (a sample_kernels/ folder, a "
                             "world size, nccl or symm), e.g. gemm_allgather:4:symm")
        out.append((parts[0], int(parts[1]), parts[2]))
    return out


def landscape_name(workload: str, world: int, backend: str) -> str:
    return f"{workload} {backend}-{world}"


def one_run(landscape: tuple[str, int, str], method: str, seed: int, evaluator: Any, args: argparse.Namespace,
            deadline: float, store_dir: Path) -> dict[str, Any]:
    """One search run into its own store; its candidates' results in evaluation order."""
    workload, world, backend = landscape
    wl = load_workload(ROOT / "sample_kernels" / workload)
    store_path = store_dir / f"{workload}-{backend}{world}-{method}-seed{seed}.sqlite"
    for suffix in ("", "-wal", "-shm"):
        Path(str(store_path) + suffix).unlink(missing_ok=True)
    cfg = SearchConfig(world_size=world, backend=backend, params=dict(wl.size_presets[args.preset]),
                       iters=args.iters, seed=seed, proposals_per_generation=args.per_generation,
                       budget=BudgetConfig(generations=100000, wall_s=None if math.isinf(deadline) else
                                           max(1.0, deadline - time.monotonic()),
                                           evaluations=args.budget + 2))  # + the seed and the baseline
    cfg.phases.explore.mix = {"design_space": 1.0}
    cfg.phases.exploit.mix = {"design_space": 1.0}
    source = DesignSpaceSource() if method == "search" else RandomKnobSource()
    t0 = time.monotonic()
    with Store(store_path) as store:
        engine = SearchEngine(str(ROOT / "sample_kernels" / workload), store, evaluator, [source], cfg, EventBus(),
                              resume=False)
        error = None
        try:
            engine.run()
        except Exception as exc:  # noqa: BLE001 - recorded; the other runs still get their turn
            error = f"{type(exc).__name__}: {exc}"
        progs = {p["id"]: p for p in store.programs(engine.run_id)} if engine.run_id is not None else {}
        rows, gpu = [], None
        for e in store.evaluations(run_id=engine.run_id) if engine.run_id is not None else []:
            p: Any = progs.get(e["program_id"], {})
            r = e.get("result") or {}
            gpu = gpu or (r.get("provenance") or {}).get("gpu")
            if e["status"] != "done" or p.get("source") in ("seed", "baseline") or r.get("reason") == WALL_CAP_REASON:
                continue
            ok = r.get("verdict") == "pass" and not r.get("flagged")
            rows.append({"knobs": p.get("knobs"), "verdict": r.get("verdict"), "level": r.get("level_reached"),
                         "speedup": r.get("speedup") if ok else None, "speedup_ci": r.get("speedup_ci"),
                         "median_ms": r.get("median_ms") if ok else None})
    return {"landscape": landscape_name(*landscape), "workload": workload, "world": world, "backend": backend,
            "method": method, "seed": seed, "error": error, "gpu": gpu,
            "wall_s": round(time.monotonic() - t0, 1), "candidates": rows}


def best_of(rows: list[dict[str, Any]]) -> float | None:
    """The best speed-up over the seed among passing candidates (None when none passed)."""
    ups = [r["speedup"] for r in rows if r["speedup"] is not None]
    return max(ups) if ups else None


def summarise(runs: list[dict[str, Any]], landscapes: list[str], seeds: list[int]) -> dict[str, Any]:
    """landscape name -> per method the best per seed, their mean and interval, and the rank test."""
    out: dict[str, Any] = {}
    for wl in landscapes:
        # A run the wall cap stopped before its first candidate says nothing: it is left out (and listed), and
        # the others are cut to the smallest count among those that ran.
        mine = [r for r in runs if r["landscape"] == wl and r["candidates"]]
        dropped = [f"{r['method']} seed {r['seed']}" for r in runs if r["landscape"] == wl and not r["candidates"]]
        n = min((len(r["candidates"]) for r in mine), default=0)
        per: dict[str, Any] = {}
        for method in METHODS:
            bests = []
            for s in seeds:
                run = next((r for r in mine if r["method"] == method and r["seed"] == s), None)
                if run is not None:
                    b = best_of(run["candidates"][:n])
                    bests.append(b if b is not None else 0.0)  # nothing passed: no speed-up found
            per[method] = {"best_speedup_per_seed": bests,
                           "mean_best_speedup": float(np.mean(bests)) if bests else None, "mean_ci": mean_ci(bests)}
        out[wl] = {"candidates_per_run": n, "dropped_runs": dropped, **per,
                   "rank_test": rank_test(per["search"]["best_speedup_per_seed"],
                                          per["random"]["best_speedup_per_seed"])}
    return out


def fmt(v: float | None, p: int = 3) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{p}f}"


def make_table(result: dict[str, Any]) -> str:
    meta = result["meta"]
    lines = [f"# Offline search vs random sampling ({meta['badge']})", "",
             f"Landscape = workload, backend and world size (symm: ranks sharing one GPU, no NVLink), preset "
             f"{meta['preset']}, {len(meta['seeds'])} seeds "
             f"per method, budget {meta['budget']} candidates per run ({meta['evaluator']} evaluator"
             + (f", {meta['gpu']}" if meta.get("gpu") else "") + f", {meta['date']}). Best = the best speed-up over "
             "the seed among a run's first N candidates (0 when none passed); interval: 95% bootstrap of the mean.",
             "", "| landscape | space | N | search mean best [95% CI] | random mean best [95% CI] | p | test |",
             "|---|---|---|---|---|---|---|"]
    notes: list[str] = []
    for wl, s in result["summary"].items():
        def cell(m: dict[str, Any]) -> str:
            ci = m["mean_ci"]
            return fmt(m["mean_best_speedup"]) + (f" [{fmt(ci[0])}, {fmt(ci[1])}]" if ci else "")
        rt = s["rank_test"]
        if s["dropped_runs"]:
            notes.append(f"{wl}: left out (stopped by the wall cap before a candidate): {', '.join(s['dropped_runs'])}")
        lines.append(f"| {wl} | {meta['space_size'][wl]:,} | {s['candidates_per_run']} | {cell(s['search'])} | "
                     f"{cell(s['random'])} | {fmt(rt['p'])} | {rt['method']} |")
    lines += ["", "Per seed (best speed-up): " + "; ".join(
        f"{wl} {m}: {', '.join(fmt(v) for v in s[m]['best_speedup_per_seed'])}"
        for wl, s in result["summary"].items() for m in METHODS)] + notes
    if meta["badge"] == "simulated":
        lines += ["", "SIMULATED: every number above comes from a synthetic landscape, not a GPU."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--evaluator", choices=("simulated", "gpu"), default="simulated")
    ap.add_argument("--landscapes", default=LANDSCAPES, help=f"WORKLOAD:WORLD:BACKEND,... (default {LANDSCAPES})")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--budget", type=int, default=10, help="candidate evaluations per run")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="wall cap: no evaluation starts after it (default 180 with a GPU, none without)")
    ap.add_argument("--preset", default="small")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--per-generation", type=int, default=2)
    ap.add_argument("--parallel-runs", type=int, default=0, help="runs at once (0: all with a GPU, 1 without)")
    ap.add_argument("--dest", default=None, help="where the JSON and table go (default: see the module doc)")
    ap.add_argument("--out", default=os.environ.get("OUT"), help="also copy the files here")
    args = ap.parse_args(argv)

    landscapes = parse_landscapes(args.landscapes)
    names = [landscape_name(*ls) for ls in landscapes]
    seeds = list(range(args.seeds))
    gpu = args.evaluator == "gpu"
    if gpu:
        if not detect_gpu():
            print("no GPU (nvidia-smi lists none): run without --evaluator gpu on a CPU machine", file=sys.stderr)
            return 2
        inner: Any = GpuEvaluator(EvaluatorConfig())
    else:
        inner = SimulatedEvaluator(seed=0)
    if args.budget_s is None:
        args.budget_s = 180.0 if gpu else float("inf")
    deadline = time.monotonic() + args.budget_s
    evaluator = PrebuildingEvaluator(inner, deadline)
    dest = Path(args.dest) if args.dest else (DEST if gpu else Path(tempfile.mkdtemp(prefix="cuco-svr-")))
    dest.mkdir(parents=True, exist_ok=True)
    store_dir = Path(tempfile.mkdtemp(prefix="cuco-svr-stores-"))
    parallel = args.parallel_runs or (len(landscapes) * len(seeds) * len(METHODS) if gpu else 1)
    jobs = [(ls, m, s) for s in seeds for ls in landscapes for m in METHODS]  # interleaved: equal turns
    t0 = time.monotonic()
    runs: list[dict[str, Any]] = []
    try:
        with cf.ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="svr") as pool:
            futures = [pool.submit(one_run, wl, m, s, evaluator, args, deadline, store_dir) for wl, m, s in jobs]
            for fut in cf.as_completed(futures):
                r = fut.result()
                runs.append(r)
                print(f"  {r['landscape']} {r['method']} seed {r['seed']}: {len(r['candidates'])} candidates, best "
                      f"{fmt(best_of(r['candidates']))}x in {r['wall_s']} s" + (f" ({r['error']})" if r["error"]
                                                                                 else ""), flush=True)
    finally:
        if hasattr(inner, "close"):
            inner.close()
    runs.sort(key=lambda r: (r["landscape"], r["method"], r["seed"]))
    meta = {"evaluator": args.evaluator, "badge": getattr(inner, "badge", "real"),
            "landscapes": [{"name": landscape_name(*ls), "workload": ls[0], "world": ls[1], "backend": ls[2]}
                           for ls in landscapes], "preset": args.preset, "seeds": seeds, "budget": args.budget,
            "iters": args.iters,
            "wall_s": round(time.monotonic() - t0, 1), "budget_s": None if math.isinf(args.budget_s) else args.budget_s,
            "date": time.strftime("%Y-%m-%d", time.gmtime()), "gpu": next((r["gpu"] for r in runs if r["gpu"]), None),
            "space_size": {landscape_name(*ls): markers.space_size(
                (ROOT / "sample_kernels" / ls[0] / load_workload(ROOT / "sample_kernels" / ls[0]).baseline).read_text())
                for ls in landscapes}}
    result = {"meta": meta, "summary": summarise(runs, names, seeds), "runs": runs}
    (dest / "search_vs_random.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    table = make_table(result)
    (dest / "SEARCH_VS_RANDOM.md").write_text(table)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        for name in ("search_vs_random.json", "SEARCH_VS_RANDOM.md"):
            if Path(args.out).resolve() != dest.resolve():
                shutil.copy(dest / name, Path(args.out) / name)
    shutil.rmtree(store_dir, ignore_errors=True)
    print(f"wrote {dest / 'search_vs_random.json'} and {dest / 'SEARCH_VS_RANDOM.md'}\n")
    print(table)
    return 0 if runs and all(r["candidates"] for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
