"""Recordings that answer what the notebooks offer without a GPU: every sample's benchmark configurations, and a
run with failures to teach from.

  PYTHONPATH=. python3 benchmarks/search/record_configs.py --out DIR [--budget-s 220]   # on the GPU machine
  PYTHONPATH=. python3 benchmarks/search/record_configs.py --dry-run                     # CPU: SIMULATED, temp dir

benchmarks/search/run.py calls `record` before its searches (its --configs-budget-s); run alone, this script
does the same with its own evaluator.

1. Configurations: for every sample with a committed benchmark table (benchmarks/<sample>/results.json), each
   (size preset, world size, backend) its rows measured, the programs the widgets offer (the seeds and the
   baseline, `workload.seeds` + `workload.baseline`) are evaluated into recordings/<sample>-configs.sqlite,
   one run per configuration (its config says preset, world size, backend and sizes). The main sample goes
   first; a configuration whose estimated time no longer fits the budget is skipped and listed.
2. Failures: gemm_allgather-symm2-failures.sqlite, a short design-space search at 2 ranks under symm at the
   small sizes, plus three hand-made candidates that fail at L0 (a byte outside the EVOLVE blocks changed), L1
   (does not compile) and L2 (drops the last vector of every piece: wrong output), for the notebooks that
   teach what failed and why.

Time plan (one H200, from the recordings of 2026-12-02): a warm evaluation takes 0.2-0.6 s at 4096 (iters 10,
the seed re-measured in it), a world starts in about 5 s; so a configuration costs about 5 + 3 x 0.6 s. The
estimate is refined with every configuration measured, and nothing starts that would end past the deadline.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from cuco_kit.evaluate.device import MULTICAST_OFF

os.environ.update(MULTICAST_OFF)  # every child inherits multicast off (the launcher sets them too)

from cuco_kit.evaluate.api import EvalRequest
from cuco_kit.evaluate.gpu_evaluator import EvaluatorConfig, GpuEvaluator
from cuco_kit.evaluate.manifest import record
from cuco_kit.evaluate.simulated import SimulatedEvaluator
from cuco_kit.events import EventBus
from cuco_kit.search.budget import BudgetConfig
from cuco_kit.search.config import SearchConfig
from cuco_kit.search.design_space import DesignSpaceSource
from cuco_kit.search.engine import SearchEngine
from cuco_kit.store import Store
from cuco_kit.workload import load_workload, sample_workloads

ROOT = Path(__file__).resolve().parents[2]
DEST_REL = Path("recordings")  # what the notebooks replay; each store is listed in its MANIFEST.json
MAIN = "gemm_allgather"
FIRST_CONFIG_ESTIMATE_S = 8.0  # world start + 3 evaluations, before anything is measured
SAFETY = 1.3  # a configuration starts only when SAFETY x its estimate fits before the deadline

# The hand-made failures of gemm_allgather's baseline: (name, level it fails at, why, old text, new text).
FAILURES = [
    ("frozen byte changed", "L0", "changes kVecBytes outside every EVOLVE block: the frozen text no longer matches",
     "constexpr int kVecBytes = 16;", "constexpr int kVecBytes = 32;"),
    ("does not compile", "L1", "reads an undeclared name inside the put_kernel block",
     "    uint4 buf[kLoadBatch];", "    uint4 buf[kLoadBatch] = undeclared_prefetch;"),
    ("drops the last vector", "L2", "skips the last 16-byte vector of every piece, so peers miss data",
     "      if (v < v1) dst[v] = buf[k];", "      if (v + 1 < v1) dst[v] = buf[k];"),
]


@dataclass(frozen=True)
class Config:
    sample: str
    preset: str
    world: int
    backend: str

    @property
    def label(self) -> str:
        return f"{self.sample} {self.preset} {self.world}x{self.backend}"


def plan(root: Path = ROOT) -> list[Config]:
    """The configurations the committed benchmark tables measured, main sample first, then by sample, world
    size, backend and preset. A sample's table is its recording (recordings/<sample>-results.json, what the
    notebooks replay) or the one beside its benchmark script."""
    out: set[Config] = set()
    for d in sample_workloads(root):
        sample = d.name
        tables = [root / DEST_REL / f"{sample}-results.json", root / "benchmarks" / sample / "results.json"]
        results = next((t for t in tables if t.is_file()), None)
        if results is None:
            continue
        rows = json.loads(results.read_text(encoding="utf-8")).get("rows") or []
        for r in rows:
            if r.get("preset") and r.get("world") and r.get("backend"):
                out.add(Config(sample, str(r["preset"]), int(r["world"]), str(r["backend"])))
    return sorted(out, key=lambda c: (c.sample != MAIN, c.sample, c.world, c.backend, c.preset))


def programs(sample: str, root: Path = ROOT) -> list[tuple[str, str, str]]:
    """(file, source, code) of what the widgets offer for a sample: every seed and the baseline."""
    wl = load_workload(root / "sample_kernels" / sample)
    files = sorted(set(wl.seeds.values()) | ({wl.baseline} if wl.baseline else set()))
    return [(f, "baseline" if f == wl.baseline else "seed", (wl.directory / f).read_text(encoding="utf-8"))
            for f in files]


def prebuild(evaluator: Any, configs: list[Config], workers: int, deadline: float) -> dict[str, Any]:
    """Build every (sample, backend, program) the configurations need on `workers` threads, ahead of the
    evaluations (serial on-demand builds would cost minutes): count, seconds, failures."""
    jobs = sorted({(c.sample, c.backend) for c in configs})
    reqs = [EvalRequest(candidate_code=code, workload_dir=f"sample_kernels/{s}", backend=b, label=f"{s}/{f}")
            for s, b in jobs for f, _, code in programs(s)]
    t0 = time.monotonic()
    failed: list[str] = []
    build = getattr(evaluator, "prebuild", None)
    if callable(build):
        with cf.ThreadPoolExecutor(max(1, workers)) as pool:
            futs = {pool.submit(build, r): r for r in reqs}
            for fut in cf.as_completed(futs, timeout=max(1.0, deadline - time.monotonic())):
                if fut.result() is False:
                    failed.append(f"{futs[fut].label} ({futs[fut].backend})")
    return {"jobs": len(reqs), "failed": failed, "seconds": round(time.monotonic() - t0, 1)}


def _eval_into(store: Store, run_id: int, program_id: int, req: EvalRequest, evaluator: Any) -> dict[str, Any]:
    ev = store.start_evaluation(program_id, world_size=req.world_size, backend=req.backend,
                                badge=getattr(evaluator, "badge", "real"), request=json.loads(req.to_json()))
    res = evaluator.evaluate(req)
    store.finish_evaluation(ev, res.to_dict())
    return {"verdict": res.verdict, "level": res.level_reached, "median_ms": res.median_ms,
            "reason": res.reason[:200]}


def record_configs(evaluator: Any, dest: Path, deadline: float, *, iters: int = 10, trials: int = 2,
                   configs: list[Config] | None = None) -> dict[str, Any]:
    """Evaluate every planned configuration's programs into dest/<sample>-configs.sqlite until the deadline
    (after building them all in parallel). Returns what ran, what was skipped (the budget), what the workloads
    no longer have, and the seconds each configuration took."""
    todo = configs if configs is not None else plan()
    builds = prebuild(evaluator, todo, min(16, os.cpu_count() or 4), deadline)
    print(f"  prebuilt {builds['jobs']} programs in {builds['seconds']} s; failed: {builds['failed'] or 'none'}",
          flush=True)
    done: list[dict[str, Any]] = []
    skipped: list[str] = []
    gone: list[str] = []
    spent: list[float] = []
    stores: dict[str, Store] = {}
    try:
        for cfg in todo:
            estimate = max(spent) if spent else FIRST_CONFIG_ESTIMATE_S
            if time.monotonic() + SAFETY * estimate > deadline:
                skipped.append(cfg.label)
                continue
            wl_rel = f"sample_kernels/{cfg.sample}"
            wl = load_workload(ROOT / wl_rel)
            params = dict(wl.size_presets.get(cfg.preset, {}))
            if cfg.preset not in wl.size_presets and cfg.preset != "default":
                gone.append(f"{cfg.label} (no such preset in the workload now)")
                continue
            if cfg.sample not in stores:
                stores[cfg.sample] = Store(dest / f"{cfg.sample}-configs.sqlite")
            st = stores[cfg.sample]
            t0 = time.monotonic()
            run_id = st.create_run(workload=cfg.sample, seed=0, badge=getattr(evaluator, "badge", "real"),
                                   config={"recording": "configs", "preset": cfg.preset, "world_size": cfg.world,
                                           "backend": cfg.backend, "params": wl.resolve(params), "iters": iters})
            rows = []
            for fname, source, code in programs(cfg.sample):
                pid = st.add_program(run_id=run_id, code=code, parent_id=None, source=source, name=fname)
                req = EvalRequest(candidate_code=code, workload_dir=wl_rel, params=params, world_size=cfg.world,
                                  backend=cfg.backend, iters=iters, trials=trials,
                                  label=f"{fname} @ {cfg.preset}, {cfg.world} ranks {cfg.backend}")
                rows.append({"program": fname, **_eval_into(st, run_id, pid, req, evaluator)})
            st.set_run_state(run_id, "finished")
            secs = time.monotonic() - t0
            spent.append(secs)
            done.append({"config": cfg.label, "seconds": round(secs, 2), "rows": rows})
            print(f"  recorded {cfg.label}: " + ", ".join(f"{r['program']} {r['verdict']}" for r in rows)
                  + f" ({secs:.1f} s)", flush=True)
    finally:
        for st in stores.values():
            st.close()
    return {"configs": done, "skipped": skipped, "not_in_workload": gone, "builds": builds,
            "stores": sorted(f"{s}-configs.sqlite" for s in stores), "seconds": round(sum(spent), 1)}


def record_failures(evaluator: Any, dest: Path, deadline: float, *, generations: int = 4,
                    iters: int = 10) -> dict[str, Any]:
    """A short search of the main sample with three candidates that fail at L0, L1 and L2."""
    wl_rel = f"sample_kernels/{MAIN}"
    wl = load_workload(ROOT / wl_rel)
    path = dest / f"{MAIN}-symm2-failures.sqlite"
    cfg = SearchConfig(world_size=2, backend="symm", params=dict(wl.size_presets["small"]), iters=iters, seed=0,
                       proposals_per_generation=4, gate="auto",
                       budget=BudgetConfig(generations=generations,
                                           wall_s=max(5.0, deadline - time.monotonic())))
    store = Store(path)
    engine = SearchEngine(ROOT / wl_rel, store, evaluator, [DesignSpaceSource(cfg.design_space)], cfg, EventBus())
    engine.start()
    try:
        while engine.run_id is None and not engine.join(0.1):
            pass
        baseline = next((p for p in store.programs(engine.run_id) if p["source"] == "baseline"), None) \
            if engine.run_id is not None else None
        injected = []
        if baseline is not None:
            for name, level, why, old, new in FAILURES:
                if old not in baseline["code"]:
                    injected.append(f"{name}: text not found in the baseline (skipped)")
                    continue
                engine.submit_human(baseline["id"], code=baseline["code"].replace(old, new, 1),
                                    name=f"{name} (expected to fail at {level})", rationale=why)
                injected.append(name)
        engine.join(max(1.0, deadline - time.monotonic()))
    finally:
        engine.stop()
        engine.join(60)
    evs = store.evaluations(run_id=engine.run_id) if engine.run_id is not None else []
    by_level: dict[str, int] = {}
    for e in evs:
        if e["verdict"] in ("fail", "error"):
            by_level[str(e["level_reached"])] = by_level.get(str(e["level_reached"]), 0) + 1
    store.close()
    return {"store": path.name, "state": engine.state, "evaluations": len(evs), "failures_by_level": by_level,
            "injected": injected}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT"), help="folder for the JSON summary")
    ap.add_argument("--budget-s", type=float, default=220.0)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--dry-run", action="store_true", help="SIMULATED evaluator; files go to a temp dir")
    args = ap.parse_args(argv)
    deadline = time.monotonic() + args.budget_s
    dest = Path(tempfile.mkdtemp(prefix="cuco-configs-dry-")) if args.dry_run else ROOT / DEST_REL
    if args.dry_run:
        evaluator: Any = SimulatedEvaluator(seed=0)
    else:
        evaluator = GpuEvaluator(EvaluatorConfig(start_timeout_s=120.0))
    try:
        configs = record_configs(evaluator, dest, deadline - 30.0, iters=args.iters)
        failures = record_failures(evaluator, dest, deadline, iters=args.iters)
    finally:
        close = getattr(evaluator, "close", None)
        if callable(close):
            close()
    for name in [*configs["stores"], *([failures["store"]] if failures.get("store") else [])]:
        if (dest / name).is_file():
            record(dest, name, "search", written_by="benchmarks/search/record_configs.py")
    summary = {"configs": configs, "failures": failures, "dest": str(dest), "dry_run": args.dry_run}
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "record_configs.json").write_text(json.dumps(summary, indent=1, default=str))
    print(json.dumps({k: v for k, v in summary.items() if k != "configs"} | {
        "recorded": len(configs["configs"]), "skipped": configs["skipped"],
        "not_in_workload": configs["not_in_workload"]}, indent=1, default=str))
    return 0 if not configs["skipped"] and failures["failures_by_level"] else 1


if __name__ == "__main__":
    sys.exit(main())
