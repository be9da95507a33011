"""Race amplification on the GPU, in one command (tests/gpu/test_race_amplification_gpu.py asserts on it).

Every race class of the adversarial set (tests/data/adversarial/EXPECTED.json, the entries with a `race`: the four
that signal through the runtime's helpers and the ones written with raw atomics) is evaluated at 2 `symm` ranks at
its workload's preset (`small`: the all-gather's N_PER_RANK = 2^20, gemm_allgather's M = N = K = 1024), one
evaluation per request seed; rejected = verdict fail. The perturbations (rank/perturb.py, race_size.py) are the
evaluator's knobs: the stress build (`stress`), the late rank's start delay (`jitter_us`), the interference kernel
(`interference`) and the race-check size (`race_size`). In this order, until --budget-s is spent (what did not run
is listed under "skipped"):

  1. detection, every perturbation on (the evaluator's defaults): every race class, seeds 0 .. --seeds-1; in the
     same warm worlds the honest samples at 2 ranks (below), and the cost: --cost-samples' device_lsa.cu at 2 ranks
     with every perturbation off, each alone and all on (--cost-seeds seeds each), their L2 time (load, set-up and
     trials as the slowest rank saw it, plus the race-check size's command) and evaluation time;
  2. no false alarms, everything on: every sample's device_lsa.cu and seed_copy.cu at 1 (nccl), 2 and 4 (symm)
     ranks (--honest-worlds), and at 1 rank every race class (a race needs two ranks: one rank must pass);
     --variants adds every sample's covering set of knob variants at 2 and 4 ranks (budget minutes for it);
  3. each perturbation alone on the race classes of --alone-classes (default: the raw ones), --alone-seeds seeds
     each: what each catches by itself.
Worlds end when their block does (at most one workload's ranks at a time, plus its race-check size's): the run
shares an MPS server with other tests in the gpu tier. Writes <out>/race_amplification.json (default
benchmarks/harness/) and prints the tables. Exit code 0 when every race class was caught in at least MIN_CAUGHT of
its seeds with everything on, every honest run passed, and nothing was skipped.
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
from cuco_kit.workload import load_workload, sample_workloads

ROOT = Path(__file__).resolve().parents[2]
ADV = ROOT / "tests" / "data" / "adversarial"
SAMPLES = ROOT / "sample_kernels"
HONEST = ("device_lsa.cu", "seed_copy.cu")  # each sample's baseline and symm seed (the folder's file names)


def honest_set(root: Path = ROOT) -> list[tuple[str, str]]:
    """(workload, file) of every honest source the run checks: each sample folder's HONEST files, so a new sample
    is in the run with no list to edit."""
    return [(d.name, f) for d in sample_workloads(root) for f in HONEST]


WORKLOADS = tuple(dict.fromkeys(w for w, _ in honest_set()))
WORLD_BACKEND = {1: "nccl", 2: "symm", 4: "symm"}
PRESET = "small"
MIN_CAUGHT = 19 / 20
# The evaluator's perturbation knobs: each one's "off" value; "on" is EvaluatorConfig's default.
OFF: dict[str, Any] = {"stress": False, "jitter_us": 0.0, "interference": False, "race_size": False}
ON: dict[str, Any] = {k: getattr(EvaluatorConfig(), k) for k in OFF}
NAMES = {"stress": "stress build", "jitter_us": "start delay", "interference": "interference",
         "race_size": "race-check size"}
CONFIGS: dict[str, dict[str, Any]] = {"all": ON, **{NAMES[k]: {**OFF, k: ON[k]} for k in OFF}, "none": OFF}


def race_classes() -> dict[str, dict[str, Any]]:
    """EXPECTED.json's race entries, each with its workload folder and preset."""
    expected = json.loads((ADV / "EXPECTED.json").read_text())
    return {name: {"race": e["race"], "raw": bool(e.get("raw")), "preset": e.get("preset", PRESET),
                   "workload": ROOT / e.get("workload", "sample_kernels/allgather")}
            for name, e in expected.items() if not name.startswith("_") and e.get("race")}


class Run:
    """One evaluator, a budget, and what did not fit."""

    def __init__(self, budget_s: float) -> None:
        self.ev = GpuEvaluator(EvaluatorConfig(recycle_every=1000))  # no world restarts between the seeds
        self.deadline = time.monotonic() + budget_s
        self.skipped: list[str] = []

    def evaluate(self, label: str, code: str, wl: Path, world: int, seed: int, config: str,
                 preset: str = PRESET) -> dict[str, Any] | None:
        """One evaluation under CONFIGS[config], as a row; None (and listed as skipped) once the budget is spent."""
        if time.monotonic() > self.deadline:
            self.skipped.append(f"{label} [{config}]")
            return None
        for k, v in CONFIGS[config].items():
            setattr(self.ev.cfg, k, v)
        res = self.ev.evaluate(EvalRequest(candidate_code=code, workload_dir=str(wl), world_size=world, seed=seed,
                                           params=load_workload(wl).size_presets[preset], iters=1, warmup=0,
                                           backend=WORLD_BACKEND[world], measure_seed=False, label=label))
        return row(label, world, seed, config, res)

    def close_worlds(self) -> None:
        """End every warm world (the next block starts its own)."""
        self.ev.pool.close()


def row(label: str, world: int, seed: int, config: str, res: EvalResult) -> dict[str, Any]:
    prov = res.provenance
    race = prov.get("race_size") or {}
    return {"label": label, "world": world, "seed": seed, "config": config, "verdict": res.verdict,
            "level": res.level_reached, "reason": res.reason[:300],
            "caught_at": ("race-check size" if res.reason.startswith("at the race-check size") else
                          "requested size") if res.verdict == "fail" else None,
            "l2_seconds": prov.get("l2_seconds"), "race_size": race or None,
            "l2_total_seconds": (prov["l2_seconds"] + race.get("seconds", 0.0)) if prov.get("l2_seconds") else None,
            "eval_seconds": prov.get("eval_seconds"), "stress_applied": bool(prov.get("l2_stress")),
            "notes": prov.get("notes", [])}


def prebuild(run: Run, races: dict[str, dict[str, Any]], worlds: list[int]) -> float:
    """Every build the run needs, timed and stress alike, in parallel before any GPU work."""
    reqs = [EvalRequest(candidate_code=(ADV / f).read_text(), workload_dir=str(c["workload"]), world_size=w,
                        backend=WORLD_BACKEND[w]) for f, c in races.items() for w in (1, 2)]
    for name in WORKLOADS:
        for f in HONEST:
            for world in sorted({min(w, 2) for w in worlds}):  # world 4 shares world 2's builds
                reqs.append(EvalRequest(candidate_code=(SAMPLES / name / f).read_text(),
                                        workload_dir=str(SAMPLES / name), world_size=world,
                                        backend=WORLD_BACKEND[world]))
    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=12) as pool:
        list(pool.map(run.ev.prebuild, reqs))
    return time.monotonic() - t0


def caught(rows: list[dict[str, Any]], **key: Any) -> dict[str, Any]:
    return {**key, "caught": sum(r["verdict"] == "fail" for r in rows), "evaluated": len(rows),
            "caught_at_race_size": sum(r["caught_at"] == "race-check size" for r in rows), "rows": rows}


def race_block(run: Run, wl: str, races: dict[str, dict[str, Any]], seeds: int, honest_w2: bool,
               cost_seeds: int, cost: bool) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    """One race workload at 2 ranks, everything on: its race classes' detection, its honest samples, and the cost
    of each perturbation on its device_lsa.cu (all in the same warm worlds)."""
    det: dict[str, Any] = {}
    wl_dir = SAMPLES / wl
    for f, c in races.items():
        if c["workload"] != wl_dir:
            continue
        code = (ADV / f).read_text()
        rows = [r for s in range(seeds) if (r := run.evaluate(f"{f} seed {s}", code, wl_dir, 2, s, "all",
                                                               c["preset"])) is not None]
        det[f"{f}|all"] = caught(rows, file=f, workload=wl, race=c["race"], raw=c["raw"], config="all")
        print(f"race_amplification: {f} everything on: rejected {det[f'{f}|all']['caught']}/{len(rows)}", flush=True)
    honest = honest_rows(run, wl, [2], close=False) if honest_w2 else []
    costs = []
    if cost:
        code = (wl_dir / "device_lsa.cu").read_text()
        for config in CONFIGS:
            for s in range(cost_seeds):
                if (r := run.evaluate(f"{wl}/device_lsa.cu cost seed {s}", code, wl_dir, 2, s, config)) is not None:
                    costs.append({**r, "workload": wl})
    run.close_worlds()
    return det, honest, costs


def honest_rows(run: Run, wl: str, worlds: list[int], races: dict[str, dict[str, Any]] | None = None,
                variants: bool = False, close: bool = True) -> list[dict[str, Any]]:
    """``wl``'s honest samples (and its knob variants with ``variants``) at each world, everything on; at world 1
    also its race classes (``races``), which must pass there. ``close``: end each world's worlds after it."""
    wl_dir = SAMPLES / wl
    extra = knob_variants(wl) if variants else []
    if extra:
        with ThreadPoolExecutor(max_workers=12) as pool:
            list(pool.map(run.ev.prebuild, [EvalRequest(candidate_code=src, workload_dir=str(wl_dir), world_size=2,
                                                        backend="symm") for _, src in extra]))
    rows = []
    for world in worlds:
        cases = [(f, (wl_dir / f).read_text(), PRESET) for f in HONEST] + [(f, src, PRESET) for f, src in extra
                                                                            if world > 1]
        if world == 1:
            cases += [(f, (ADV / f).read_text(), c["preset"]) for f, c in (races or {}).items()
                      if c["workload"] == wl_dir]
        for f, code, preset in cases:
            r = run.evaluate(f"{wl}/{f} W{world}", code, wl_dir, world, 0, "all", preset)
            if r is not None:
                rows.append({**r, "workload": wl, "file": f})
                print(f"race_amplification: {wl}/{f} W{world}: {r['verdict']} {r['reason'][:120]}", flush=True)
        if close:
            run.close_worlds()  # this world (and its race-check size's) is not used again
    return rows


def knob_variants(name: str) -> list[tuple[str, str]]:
    """(label, source) of a sample's covering knob variants other than its default."""
    code = (SAMPLES / name / "device_lsa.cu").read_text()
    return [(f"device_lsa.cu[{short(kv)}]", src) for kv, src in covering_variants(code)[1:]]


def alone(run: Run, races: dict[str, dict[str, Any]], classes: list[str], seeds: int) -> dict[str, Any]:
    """Each perturbation by itself on ``classes``, workload by workload (one world set at a time)."""
    out: dict[str, Any] = {}
    for wl in WORKLOADS:
        picked = [f for f in classes if races[f]["workload"] == SAMPLES / wl]
        for f in picked:
            c = races[f]
            code = (ADV / f).read_text()
            for config in (name for name in CONFIGS if name not in ("all", "none")):
                rows = [r for s in range(seeds) if (r := run.evaluate(f"{f} seed {s}", code, c["workload"], 2, s,
                                                                       config, c["preset"])) is not None]
                out[f"{f}|{config}"] = caught(rows, file=f, workload=wl, race=c["race"], raw=c["raw"], config=config)
        if picked:
            run.close_worlds()
    return out


def cost_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per workload and configuration: median L2 seconds (the requested size), the race-check size's command and
    their sum, and the whole evaluation; plus the race-check size's world start (once per world)."""
    out: dict[str, Any] = {}
    for wl in sorted({r["workload"] for r in rows}):
        out[wl] = {}
        for config in CONFIGS:
            sel = [r for r in rows if r["workload"] == wl and r["config"] == config and r["verdict"] == "pass"]

            def med(xs: list[float | None]) -> float | None:
                vals = [x for x in xs if x is not None]
                return round(statistics.median(vals), 4) if vals else None

            out[wl][config] = {"n": len(sel), "l2_seconds": med([r["l2_seconds"] for r in sel]),
                               "race_size_seconds": med([(r["race_size"] or {}).get("seconds") for r in sel]),
                               "l2_total_seconds": med([r["l2_total_seconds"] for r in sel]),
                               "eval_seconds": med([r["eval_seconds"] for r in sel])}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).parent), help="folder for race_amplification.json")
    ap.add_argument("--seeds", type=int, default=20, help="seeds per race class, everything on")
    ap.add_argument("--budget-s", type=float, default=240.0)
    ap.add_argument("--skip-honest", action="store_true")
    ap.add_argument("--honest-worlds", default="1,2,4", help="world sizes of the honest samples (1 nccl, 2 and 4 symm)")
    ap.add_argument("--variants", action="store_true", help="also every sample's covering set of knob variants")
    ap.add_argument("--cost-samples", default="allgather,gemm_allgather",
                    help="workloads whose device_lsa.cu measures each perturbation's cost (empty: none)")
    ap.add_argument("--cost-seeds", type=int, default=2)
    ap.add_argument("--alone-classes", default="raw", help="race classes measured per perturbation alone: raw, all, "
                                                           "or a comma list of file names")
    ap.add_argument("--alone-seeds", type=int, default=3, help="seeds per class and perturbation alone (0: none)")
    args = ap.parse_args(argv)
    gpus = detect_gpu()
    if not gpus:
        print("race_amplification: no GPU (nvidia-smi lists none)")
        return 2
    worlds = [int(w) for w in args.honest_worlds.split(",") if w]
    if not worlds or any(w not in WORLD_BACKEND for w in worlds):
        print(f"race_amplification: --honest-worlds {args.honest_worlds!r}: use sizes among {sorted(WORLD_BACKEND)}")
        return 2
    races = race_classes()
    alone_classes = (sorted(f for f, c in races.items() if c["raw"]) if args.alone_classes == "raw" else
                     sorted(races) if args.alone_classes == "all" else
                     [f for f in args.alone_classes.split(",") if f])
    unknown = [f for f in alone_classes if f not in races]
    if unknown:
        print(f"race_amplification: --alone-classes names {unknown}, not race classes; use some of {sorted(races)}")
        return 2
    cost_samples = [w for w in args.cost_samples.split(",") if w]
    t0 = time.monotonic()
    run = Run(args.budget_s)
    det: dict[str, Any] = {}
    honest: list[dict[str, Any]] = []
    costs: list[dict[str, Any]] = []
    per_alone: dict[str, Any] = {}
    try:
        build_s = prebuild(run, races, worlds)
        race_workloads = [w for w in WORKLOADS if any(c["workload"] == SAMPLES / w for c in races.values())]
        for wl in race_workloads:  # 1: detection (+ honest at 2 ranks, cost) in each race workload's warm worlds
            d, h, c = race_block(run, wl, races, args.seeds, not args.skip_honest and 2 in worlds, args.cost_seeds,
                                 wl in cost_samples)
            det.update(d)
            honest += h
            costs += c
        if not args.skip_honest:  # 2: the rest of the honest runs
            for wl in WORKLOADS:
                rest = [w for w in worlds if w != 2 or wl not in race_workloads]
                honest += honest_rows(run, wl, rest, races, args.variants)
        if args.alone_seeds > 0:  # 3: each perturbation alone
            per_alone = alone(run, races, alone_classes, args.alone_seeds)
    finally:
        run.ev.close()
    detection_ok = bool(det) and all(d["evaluated"] == args.seeds and d["caught"] >= MIN_CAUGHT * args.seeds
                                     for d in det.values()) and set(races) <= {d["file"] for d in det.values()}
    honest_ok = bool(honest) and all(r["verdict"] == "pass" for r in honest)
    result = {"meta": {"gpu": gpus[0]["name"], "driver": gpus[0].get("driver_version"), "git": git_revision(),
                       "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "seeds": args.seeds,
                       "honest_worlds": worlds, "preset": PRESET, "configs": CONFIGS,
                       "alone_classes": alone_classes, "alone_seeds": args.alone_seeds, "cost_seeds": args.cost_seeds,
                       "prebuild_seconds": round(build_s, 1),
                       "stress": {"max_delay_us": run.ev.cfg.stress_max_delay_us,
                                  "permille": run.ev.cfg.stress_permille},
                       "race_size": {"min_bytes": run.ev.cfg.race_size_min_bytes,
                                     "max_gpu_bytes": run.ev.cfg.race_size_max_gpu_bytes},
                       "wall_s": round(time.monotonic() - t0, 1)},
              "races": {f: {**c, "workload": str(c["workload"].relative_to(ROOT))} for f, c in races.items()},
              "detection": det, "alone": per_alone, "honest": honest,
              "cost": {"rows": costs, "summary": cost_summary(costs)}, "skipped": run.skipped,
              "detection_ok": detection_ok, "honest_ok": honest_ok}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "race_amplification.json").write_text(json.dumps(result, indent=1, default=str))
    print_tables(result)
    return 0 if detection_ok and (honest_ok or args.skip_honest) and not run.skipped else 1


def print_tables(result: dict[str, Any]) -> None:
    alone_configs = [c for c in CONFIGS if c not in ("all", "none")]
    print("| race class | workload | raw | everything on (at the race-check size) | " +
          " | ".join(alone_configs) + " |")
    print("| --- | --- | :---: | ---: |" + " ---: |" * len(alone_configs))
    for d in result["detection"].values():
        cells = []
        for c in alone_configs:
            a = result["alone"].get(f"{d['file']}|{c}")
            cells.append(f"{a['caught']}/{a['evaluated']}" if a else "-")
        print(f"| {d['file']} | {d['workload']} | {'yes' if d['raw'] else 'no'} | {d['caught']}/{d['evaluated']} "
              f"({d['caught_at_race_size']}) | " + " | ".join(cells) + " |")
    rows = result["honest"]
    bad = [f"{r['label']}: {r['reason']}" for r in rows if r["verdict"] != "pass"]
    print(f"honest: {len(rows) - len(bad)}/{len(rows)} passed; " + ("; ".join(bad) if bad else "no false alarms"))
    print("| L2 cost (median s) | " + " | ".join(CONFIGS) + " |")
    print("| --- |" + " ---: |" * len(CONFIGS))
    for wl, per in result["cost"]["summary"].items():
        print(f"| {wl} | " + " | ".join(f"{per[c]['l2_total_seconds']}" for c in CONFIGS) + " |")
    print(f"skipped (budget): {len(result['skipped'])}")


if __name__ == "__main__":
    sys.exit(main())
