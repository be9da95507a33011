"""On a GPU machine: evaluations per GPU-hour and where each evaluation's time goes, for gemm_allgather at 4096,
every part in one run (so every comparison is made on the same machine at the same time).

  set -a; . cuco_kit/evaluate/multicast_off.env; set +a
  PYTHONPATH=. python3 benchmarks/executors/gpu_slots.py --out "$OUT" [--budget-s 420] [--parts ...]

Parts (each a fresh store; every search draws the same uniform random knob points, seed 0):
  symm4_cold   offline search through the slot executor at 4 `symm` ranks, EMPTY build cache: every build runs
               on the CPU pool during the search (one per candidate: the stress build, timed with pauses off)
               and its time counts;
  symm4        the same search again on the cache the cold part filled (warm builds; a fresh evaluator);
  nccl1        the same search at 1 `nccl` rank, its builds made ahead of the part (warm, untimed);
  single4      the single evaluator (one GpuEvaluator, no engine, no executor) over every knob point at 4
               `symm` ranks, warm builds: what the protocol itself costs;
  single4_strict  the same with the strict protocol (the seed measured before every candidate, every timed
               iteration run, no reference cache): what the fast protocol saves, measured beside it.
Per part: candidates (passed), wall, evaluations per GPU-hour over the whole part and in steady state (from the
first candidate's end to the last one's: the world's start and the seed's first measurement are paid once per
search, not per candidate), mean evaluation seconds, and the mean of every phase (provenance["phases"]).
Writes gpu_slots.json and gpu_slots.md (and phases.md) into --out; copy them to benchmarks/executors/.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from cuco_kit.evaluate.device import MULTICAST_OFF, detect_gpu, git_revision

os.environ.update(MULTICAST_OFF)  # every child inherits multicast off (the launcher sets them too)

from cuco_kit.evaluate.api import EvalRequest
from cuco_kit.evaluate.gpu_evaluator import EvaluatorConfig, GpuEvaluator, prebuild
from cuco_kit.evaluate.spec import EvaluatorSpec
from cuco_kit.events import EventBus
from cuco_kit.search.budget import BudgetConfig
from cuco_kit.search.config import SearchConfig
from cuco_kit.search.design_space import RandomKnobSource
from cuco_kit.search.engine import SearchEngine
from cuco_kit.search.slots import build_workers_default, local_executor
from cuco_kit.source import knob_rules, markers
from cuco_kit.store import Store
from cuco_kit.workload import load_workload

ROOT = Path(__file__).resolve().parents[2]
os.chdir(ROOT)  # the stores name the workload by its repository path
warnings.filterwarnings("ignore", category=FutureWarning, message=".*constraints_func.*")
WL_REL = "sample_kernels/gemm_allgather"
ITERS = 10
PARTS = {"symm4_cold": (4, "symm"), "symm4": (4, "symm"), "nccl1": (1, "nccl"), "single4": (4, "symm"),
         "single4_strict": (4, "symm")}
STRICT = {"seed_every": 1, "seed_beside_claims": False, "stop_rel_ci": None, "reference_cache_bytes": 0}


def knob_points() -> list[str]:
    """Every valid point of the baseline's knob block (the single evaluator's candidates), the default's first."""
    wl = load_workload(WL_REL)
    code = (Path(WL_REL) / str(wl.baseline)).read_text()
    rules = knob_rules.rules(code)
    return [markers.set_knobs(code, kv) for kv in markers.knob_space(code) if knob_rules.is_valid(rules, kv)]


def per_hour(n: int, seconds: float, gpus: int) -> int:
    return round(3600.0 * n / seconds / gpus) if seconds > 0 and n else 0


def phase_means(provs: list[dict[str, Any]]) -> dict[str, float]:
    keys = sorted({k for p in provs for k in (p.get("phases") or {})})
    return {k: round(statistics.fmean((p.get("phases") or {}).get(k, 0.0) for p in provs), 4) for k in keys}


def summary(part: str, world: int, backend: str, gpus: list[str], provs: list[dict[str, Any]],
            verdicts: list[str], ends: list[float], wall: float, **extra: Any) -> dict[str, Any]:
    secs = [p["eval_seconds"] for p in provs if p.get("eval_seconds") is not None]
    steady = per_hour(len(ends) - 1, ends[-1] - ends[0], len(gpus)) if len(ends) > 2 else 0
    cached = [bool(p.get("build_cached")) for p in provs if "build_cached" in p]
    reused = sum(str(p.get("seed_measured", "")).startswith("reused") for p in provs)
    return {"part": part, "world": world, "backend": backend, "gpus": gpus, "candidates": len(verdicts),
            "passed": verdicts.count("pass"), "wall_s": round(wall, 2),
            "candidates_per_gpu_hour": per_hour(len(verdicts), wall, len(gpus)),
            "steady_candidates_per_gpu_hour": steady,
            "mean_eval_s": round(statistics.fmean(secs), 3) if secs else None,
            "build_cache_hit_rate": round(sum(cached) / len(cached), 3) if cached else None,
            "seed_reused": reused, "phases": phase_means(provs),
            "gpu": next((p.get("gpu") for p in provs if p.get("gpu")), None), "badge": "real", **extra}


def run_search(part: str, gpus: list[str], args: argparse.Namespace, cache: Path, wall_cap: float) -> dict[str, Any]:
    world, backend = PARTS[part]
    wl = load_workload(WL_REL)
    spec = EvaluatorSpec("gpu", {"recycle_every": 1000, "cache_dir": str(cache)})
    ex = local_executor(spec, gpus, world, backend, build_workers=args.build_workers)
    # a generation twice the build pool: the pool builds the rest of a generation while the GPU evaluates its start
    cfg = SearchConfig(world_size=world, backend=backend, params=dict(wl.size_presets[args.preset]), iters=ITERS,
                       seed=0, proposals_per_generation=max(4, 2 * ex.slots, 2 * args.build_workers),
                       budget=BudgetConfig(generations=100000, wall_s=wall_cap, evaluations=args.candidates + 1))
    cfg.phases.explore.mix = {"design_space": 1.0}
    cfg.phases.exploit.mix = {"design_space": 1.0}
    events = EventBus()
    ends: list[float] = []

    def finished(e: Any) -> None:
        if e.kind == "evaluation_finished":
            ends.append(time.monotonic())
            print(f"  [{part}] eval {e.data['evaluation_id']}: {e.data['verdict']} at {e.data['level_reached']} "
                  f"{e.data['median_ms']} ms", flush=True)

    events.subscribe(finished)
    db = Path(tempfile.mkdtemp(prefix="cuco-gpu-slots-")) / f"{part}.sqlite"
    t0 = time.monotonic()
    with Store(db) as st:
        s = SearchEngine(WL_REL, st, ex, [RandomKnobSource()], cfg, events, executor=ex).run()
        evs = st.evaluations(run_id=s.run_id)
        programs = {p["id"]: p for p in st.programs(s.run_id)}
    wall = time.monotonic() - t0
    ex.shutdown()  # ends the slots' evaluators (their worlds and MPS clients) before the next part
    cands = [e for e in evs if programs[e["program_id"]]["source"] != "seed" and e["status"] == "done"]
    provs = [(e.get("result") or {}).get("provenance") or {} for e in cands]
    return summary(part, world, backend, gpus, provs, [e["verdict"] for e in cands], ends[1:], wall,
                   slots=ex.slots, state=s.state, best_speedup=s.best_speedup, prebuilds=s.prebuilds,
                   build_workers=args.build_workers)


def run_single(part: str, gpus: list[str], args: argparse.Namespace, cache: Path, wall_cap: float) -> dict[str, Any]:
    world, backend = PARTS[part]
    params = dict(load_workload(WL_REL).size_presets[args.preset])
    options = {**(STRICT if part.endswith("_strict") else {}), "recycle_every": 1000}
    ev = GpuEvaluator(EvaluatorConfig(cache_dir=cache, **options))  # type: ignore[arg-type]
    points = knob_points()[: args.candidates]
    provs, verdicts, ends = [], [], []
    t0 = time.monotonic()
    try:
        for i, code in enumerate(points):
            if time.monotonic() - t0 > wall_cap:
                break
            r = ev.evaluate(EvalRequest(code, WL_REL, params=params, world_size=world, backend=backend,
                                        iters=ITERS, label=f"point {i}"))
            provs.append(r.provenance)
            verdicts.append(r.verdict)
            ends.append(time.monotonic())
            print(f"  [{part}] point {i}: {r.verdict} {r.median_ms} ms x{r.speedup} "
                  f"({r.provenance.get('eval_seconds')} s)", flush=True)
    finally:
        ev.close()
    return summary(part, world, backend, gpus[:1], provs, verdicts, ends, time.monotonic() - t0,
                   protocol="strict" if part.endswith("_strict") else "fast")


def warm(cache: Path, world: int, backend: str, args: argparse.Namespace) -> float:
    """Build every knob point ahead (untimed) for a warm part; returns the seconds it took."""
    t0 = time.monotonic()
    params = dict(load_workload(WL_REL).size_presets[args.preset])
    cfg = EvaluatorConfig(cache_dir=cache)
    with ThreadPoolExecutor(args.build_workers) as pool:
        list(pool.map(lambda code: prebuild(cfg, EvalRequest(code, WL_REL, params=params, world_size=world,
                                                             backend=backend), stress=world > 1),
                      knob_points()))
    return round(time.monotonic() - t0, 1)


def table(res: dict[str, Any]) -> str:
    lines = ["# Evaluations per GPU-hour on the GPU machine", "",
             f"{res['date']}, {res['machine']}, git {res['git']}; `benchmarks/executors/gpu_slots.py` (gemm_allgather "
             f"at {res['preset']}, uniform random knob points, {ITERS} timed iterations, {res['build_workers']} build "
             "workers). Steady state: from the first candidate's end to the last one's (the world's start and the "
             "seed's first measurement are paid once per search).", "",
             "| part | protocol | candidates (passed) | wall s | per GPU-hour, whole part | per GPU-hour, steady | "
             "mean eval s | build cache hits | seed reused |", "|---|---|---|---|---|---|---|---|---|"]
    for r in res["parts"]:
        lines.append(f"| {r['part']} | {r.get('protocol', 'fast')} | {r['candidates']} ({r['passed']}) | {r['wall_s']} "
                     f"| {r['candidates_per_gpu_hour']} | **{r['steady_candidates_per_gpu_hour']}** | "
                     f"{r['mean_eval_s']} | {r['build_cache_hit_rate']} | {r['seed_reused']} |")
    return "\n".join(lines) + "\n"


def phase_table(res: dict[str, Any]) -> str:
    parts = res["parts"]
    keys = sorted({k for r in parts for k in r["phases"]}, key=lambda k: (k.startswith("rank."), k))
    lines = ["# Where an evaluation's time goes (mean seconds per candidate)", "",
             f"{res['date']}, {res['machine']}, git {res['git']}. Parent phases: l0 (static check), build_wait (L1, "
             "both builds; ~0 when cached), seed_build, seed (the seed's command, when measured), candidate (the "
             "candidate's command, all ranks). rank.* (inside `candidate` and `seed`, the slowest rank's): "
             "load_setup, stress_load_setup, stress_trials / verify_trials (L2), capture, warmup, device_timing "
             "(held iterations), e2e_timing (end-to-end iterations), reference (the torch reference, inside the "
             "verified steps), teardown, timeline.", "",
             "| phase | " + " | ".join(r["part"] for r in parts) + " |", "|---|" + "---|" * len(parts)]
    for k in keys:
        lines.append(f"| {k} | " + " | ".join(str(r["phases"].get(k, "")) for r in parts) + " |")
    lines.append("| **eval_seconds** | " + " | ".join(str(r["mean_eval_s"]) for r in parts) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or tempfile.mkdtemp(prefix="cuco-gpu-slots-out-"))
    ap.add_argument("--budget-s", type=float, default=420.0)
    ap.add_argument("--parts", default=",".join(PARTS))
    ap.add_argument("--preset", default="4096")
    ap.add_argument("--candidates", type=int, default=72)
    ap.add_argument("--gpus", default=None, help="GPU indices (default: all nvidia-smi lists)")
    ap.add_argument("--build-workers", type=int, default=build_workers_default())
    ap.add_argument("--git", default=git_revision(), help="the revision to name (a copied tree may carry a stale .git)")
    args = ap.parse_args(argv)
    listed = detect_gpu()
    gpus = args.gpus.split(",") if args.gpus else [g["index"] for g in listed]
    if not gpus:
        print("gpu_slots.py: nvidia-smi lists no GPU; run it on a GPU machine", file=sys.stderr)
        return 2
    parts = [p for p in args.parts.split(",") if p]
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        print(f"gpu_slots.py: unknown part(s) {unknown}; choose from {', '.join(PARTS)}", file=sys.stderr)
        return 2
    cache = Path(tempfile.mkdtemp(prefix="cuco-gpu-slots-cache-"))  # empty: the cold part starts cold
    t_end = time.monotonic() + args.budget_s
    runs, warmed = [], {}
    for i, part in enumerate(parts):
        world, backend = PARTS[part]
        if part != "symm4_cold" and (world, backend) not in warmed:
            warmed[(world, backend)] = warm(cache, world, backend, args)
            print(f"{part}: builds made ahead in {warmed[(world, backend)]} s", flush=True)
        cap = (t_end - time.monotonic()) / (len(parts) - i)
        print(f"{part}: up to {cap:.0f} s on GPU(s) {','.join(gpus)}", flush=True)
        run = run_single if part.startswith("single") else run_search
        runs.append(run(part, gpus, args, cache, cap))
        print(json.dumps({k: v for k, v in runs[-1].items() if k != "phases"}), flush=True)
    res = {"date": dt.date.today().isoformat(), "machine": f"{len(listed)} x {listed[0]['name']}" if listed else "?",
           "driver": listed[0].get("driver_version") if listed else None, "git": args.git,
           "preset": args.preset, "build_workers": args.build_workers, "warm_builds_s": {
               f"{w}-{b}": s for (w, b), s in warmed.items()}, "parts": runs}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_slots.json").write_text(json.dumps(res, indent=1, sort_keys=True) + "\n")
    (out / "gpu_slots.md").write_text(table(res))
    (out / "phases.md").write_text(phase_table(res))
    print(table(res))
    print(phase_table(res))
    return 0 if all(r["candidates"] and r["passed"] * 2 >= r["candidates"] for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
