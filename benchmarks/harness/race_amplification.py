"""Race amplification on the GPU, in one command (tests/gpu/test_race_amplification_gpu.py asserts on it):

  1. detection: every signalling-race adversarial candidate (tests/data/adversarial: flag_before_stores,
     omits_wait, wrong_unit_flag, barrier_missing_member) at 2 `symm` ranks, the all-gather's small preset, one
     evaluation per request seed (0 .. --seeds-1), with the stress build (the default) and, for the two the
     claim is about (flag_before_stores, omits_wait), without it for comparison; rejected = verdict fail;
  2. no false alarms: every sample's device_lsa.cu and its copy seed at 1 (nccl), 2 and 4 (symm) ranks
     (--honest-worlds), small preset, must pass; at 2 and 4 ranks each is evaluated with and without the stress
     build, and the L2 time (load, set-up and trials, as the slowest rank saw it) of both is the stress build's
     cost, next to its compile time. --variants adds every sample's covering set of knob variants
     (benchmarks/common.py) at 2 and 4 ranks under the stress build (two builds each: budget minutes for it).
Writes <out>/race_amplification.json (default benchmarks/harness/) and prints a table. Stops starting evaluations
when --budget-s is spent (what did not run is listed under "skipped"). Exit code 0 when every claim held. A
workload's worlds end when its evaluations do (they are never used again), so the run keeps at most one
workload's ranks on the GPU: it shares an MPS server with other tests in the gpu tier.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

# Run by path, not installed: the repository root (the kit) and benchmarks/ (common) go first on sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import covering_variants, short

from cuco_kit.evaluate.api import EvalRequest, EvalResult
from cuco_kit.evaluate.device import detect_gpu, git_revision
from cuco_kit.evaluate.gpu_evaluator import EvaluatorConfig, GpuEvaluator
from cuco_kit.workload import load_workload

ROOT = Path(__file__).resolve().parents[2]
ADV = ROOT / "tests" / "data" / "adversarial"
ALLGATHER = ROOT / "sample_kernels" / "allgather"
RACES = ("flag_before_stores.cu", "omits_wait.cu", "wrong_unit_flag.cu", "barrier_missing_member.cu")
REQUIRED = ("flag_before_stores.cu", "omits_wait.cu")  # each rejected in at least MIN_CAUGHT of the seeds
MIN_CAUGHT = 19 / 20
WORKLOADS = ("allgather", "attention_cp", "gemm_allgather", "kv_transfer", "moe_dispatch_combine")
HONEST = ("device_lsa.cu", "seed_copy.cu")
WORLD_BACKEND = {1: "nccl", 2: "symm", 4: "symm"}
PRESET = "small"


class Run:
    """One evaluator, a budget, and the rows so far."""

    def __init__(self, budget_s: float) -> None:
        self.ev = GpuEvaluator(EvaluatorConfig(recycle_every=1000))  # no world restarts between the seeds
        self.deadline = time.monotonic() + budget_s
        self.skipped: list[str] = []

    def evaluate(self, label: str, code: str, wl: Path, world: int, seed: int, stress: bool) -> EvalResult | None:
        if time.monotonic() > self.deadline:
            self.skipped.append(label)
            return None
        self.ev.cfg.stress = stress
        params = load_workload(wl).size_presets[PRESET]
        return self.ev.evaluate(EvalRequest(candidate_code=code, workload_dir=str(wl), params=params,
                                            world_size=world, backend=WORLD_BACKEND[world], seed=seed, iters=3,
                                            warmup=1, measure_seed=False, label=label))


def prebuild(run: Run, worlds: list[int]) -> float:
    """Every build the run needs, timed and stress alike, in parallel before any GPU work."""
    reqs = [EvalRequest(candidate_code=(ADV / f).read_text(), workload_dir=str(ALLGATHER), world_size=2,
                        backend="symm") for f in RACES]
    for name in WORKLOADS:
        for f in HONEST:
            for world in sorted({min(w, 2) for w in worlds}):  # world 4 shares world 2's builds
                reqs.append(EvalRequest(candidate_code=(ROOT / "sample_kernels" / name / f).read_text(),
                                        workload_dir=str(ROOT / "sample_kernels" / name), world_size=world,
                                        backend=WORLD_BACKEND[world]))
    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=12) as pool:
        list(pool.map(run.ev.prebuild, reqs))
    return time.monotonic() - t0


def detection(run: Run, seeds: int, plain_seeds: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in RACES:
        code = (ADV / f).read_text()
        for stress in ((True, False) if f in REQUIRED else (True,)):
            rows = []
            for seed in range(seeds if stress else plain_seeds):
                res = run.evaluate(f"{f} seed {seed} stress={stress}", code, ALLGATHER, 2, seed, stress)
                if res is not None:
                    rows.append({"seed": seed, "verdict": res.verdict, "level": res.level_reached,
                                 "reason": res.reason[:300], "l2_seconds": res.provenance.get("l2_seconds")})
            caught = sum(r["verdict"] == "fail" for r in rows)
            out[f"{f}|{'stress' if stress else 'plain'}"] = {"file": f, "stress": stress, "caught": caught,
                                                             "evaluated": len(rows), "rows": rows}
            print(f"race_amplification: {f} stress={stress}: rejected {caught}/{len(rows)}", flush=True)
    return out


def knob_variants(name: str) -> list[tuple[str, str]]:
    """(label, source) of a sample's covering knob variants other than its default."""
    code = (ROOT / "sample_kernels" / name / "device_lsa.cu").read_text()
    return [(f"device_lsa.cu[{short(kv)}]", src) for kv, src in covering_variants(code)[1:]]


def honest(run: Run, variants: bool, worlds: list[int]) -> list[dict[str, Any]]:
    rows = []
    for name in WORKLOADS:
        wl = ROOT / "sample_kernels" / name
        extra = knob_variants(name) if variants else []
        if extra:
            with ThreadPoolExecutor(max_workers=12) as pool:
                list(pool.map(run.ev.prebuild, [EvalRequest(candidate_code=src, workload_dir=str(wl), world_size=2,
                                                            backend="symm") for _, src in extra]))
        for world in worlds:
            cases = [(f, (wl / f).read_text()) for f in HONEST] + (extra if world > 1 else [])
            for f, code in cases:
                for stress in ((True, False) if world > 1 and f in HONEST else (True,)):
                    res = run.evaluate(f"{name}/{f} W{world} stress={stress}", code, wl, world, 0, stress)
                    if res is None:
                        continue
                    prov = res.provenance
                    rows.append({"workload": name, "file": f, "world": world, "stress": stress,
                                 "stress_applied": bool(prov.get("l2_stress")), "verdict": res.verdict,
                                 "level": res.level_reached, "reason": res.reason[:300],
                                 "l2_seconds": prov.get("l2_seconds"),
                                 "stress_build_seconds": prov.get("stress_build_seconds"),
                                 "build_seconds": prov.get("build_seconds"), "timing": res.timing,
                                 "notes": prov.get("notes", [])})
                    print(f"race_amplification: {name}/{f} W{world} stress={stress}: {res.verdict} "
                          f"{res.reason[:120]}", flush=True)
        run.ev.pool.close()  # this workload's worlds are not used again: free their ranks and GPU memory
    return rows


def stress_cost(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """L2 seconds with / without the stress build, per (workload, file, world), and their median ratio."""
    pairs = []
    for r in rows:
        if r["stress"] and r["world"] > 1 and r["l2_seconds"]:
            off = next((o for o in rows if not o["stress"] and (o["workload"], o["file"], o["world"]) ==
                        (r["workload"], r["file"], r["world"]) and o["l2_seconds"]), None)
            if off is not None:
                pairs.append({"workload": r["workload"], "file": r["file"], "world": r["world"],
                              "l2_seconds_stress": r["l2_seconds"], "l2_seconds_plain": off["l2_seconds"],
                              "ratio": r["l2_seconds"] / off["l2_seconds"]})
    builds = [r["stress_build_seconds"] for r in rows if r.get("stress_build_seconds") is not None]
    return {"pairs": pairs, "median_l2_ratio": statistics.median(p["ratio"] for p in pairs) if pairs else None,
            "stress_build_seconds": builds}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).parent), help="folder for race_amplification.json")
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--plain-seeds", type=int, default=10, help="seeds of the comparison without the stress build")
    ap.add_argument("--budget-s", type=float, default=210.0)
    ap.add_argument("--skip-honest", action="store_true")
    ap.add_argument("--honest-worlds", default="1,2,4", help="world sizes of the honest samples (1 nccl, 2 and 4 symm)")
    ap.add_argument("--variants", action="store_true", help="also every sample's covering set of knob variants")
    args = ap.parse_args(argv)
    gpus = detect_gpu()
    if not gpus:
        print("race_amplification: no GPU (nvidia-smi lists none)")
        return 2
    worlds = [int(w) for w in args.honest_worlds.split(",") if w]
    if not worlds or any(w not in WORLD_BACKEND for w in worlds):
        print(f"race_amplification: --honest-worlds {args.honest_worlds!r}: use sizes among {sorted(WORLD_BACKEND)}")
        return 2
    t0 = time.monotonic()
    run = Run(args.budget_s)
    try:
        build_s = prebuild(run, worlds)
        det = detection(run, args.seeds, args.plain_seeds)
        rows = [] if args.skip_honest else honest(run, args.variants, worlds)
    finally:
        run.ev.close()
    required_ok = all(det[f"{f}|stress"]["caught"] >= MIN_CAUGHT * args.seeds for f in REQUIRED)
    honest_ok = bool(rows) and all(r["verdict"] == "pass" for r in rows)
    result = {"meta": {"gpu": gpus[0]["name"], "driver": gpus[0].get("driver_version"), "git": git_revision(),
                       "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "seeds": args.seeds,
                       "plain_seeds": args.plain_seeds, "honest_worlds": worlds,
                       "preset": PRESET, "prebuild_seconds": round(build_s, 1),
                       "stress": {"max_delay_us": run.ev.cfg.stress_max_delay_us,
                                  "permille": run.ev.cfg.stress_permille},
                       "wall_s": round(time.monotonic() - t0, 1)},
              "detection": det, "honest": rows, "stress_cost": stress_cost(rows), "skipped": run.skipped,
              "required_ok": required_ok, "honest_ok": honest_ok}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "race_amplification.json").write_text(json.dumps(result, indent=1, default=str))
    print("| candidate | stress build | rejected |\n| --- | :---: | ---: |")
    for d in det.values():
        print(f"| {d['file']} | {'yes' if d['stress'] else 'no'} | {d['caught']}/{d['evaluated']} |")
    bad = [f"{r['workload']}/{r['file']} W{r['world']} stress={r['stress']}: {r['reason']}" for r in rows
           if r["verdict"] != "pass"]
    print(f"honest: {len(rows) - len(bad)}/{len(rows)} passed; " + ("; ".join(bad) if bad else "no false alarms"))
    cost = result["stress_cost"]
    print(f"stress cost: median L2 time ratio {cost['median_l2_ratio']}; stress builds {cost['stress_build_seconds']}")
    print(f"skipped (budget): {len(run.skipped)}")
    return 0 if required_ok and (honest_ok or args.skip_honest) and not run.skipped else 1


if __name__ == "__main__":
    sys.exit(main())
