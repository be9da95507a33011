"""The harness's GPU check, in one command (scripts/remote_gpu/gpu_check.sh runs it; tests/gpu/test_harness_gpu.py
asserts on it).

  1. builds the all-gather samples and the adversarial set (L1) all at once, before any GPU work, into the shared
     build cache (--cache-dir: the evaluator's default, so other runs' builds are reused);
  2. evaluates device_lsa.cu at world 1 under nccl and at 2 and 4 ranks under symm, and the seeds;
  3. evaluates every adversarial candidate for the all-gather claimed at any size (tests/data/adversarial,
     EXPECTED.json; --quick: one of each kind of rejection): each must be rejected at its level with its reason and
     never scored (below its min_world the honest outcome is a pass). Entries for another workload or claimed at a
     size preset are race classes: race_amplification.py evaluates them there;
  4. measures per-candidate evaluation time with warm workers against a cold start, and profiles one more
     evaluation at 2 ranks (its kernel timeline) on the warm world;
  5. checks for leaks: no rank process, no MPS daemon we started, GPU memory back where it was. It looks at the
     whole machine: nothing else may use the GPU meanwhile (the gpu tier runs it alone).
Writes JSON to --out and benchmarks/harness/, prints a table last. Exit code 0 only when every check held.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Run by path, not installed: the repository root (the kit) and benchmarks/ (console) go first on sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from console import progress, say

from cuco_kit.evaluate.api import EvalRequest
from cuco_kit.evaluate.build import build_helpers
from cuco_kit.evaluate.device import detect_gpu
from cuco_kit.evaluate.gpu_evaluator import EvaluatorConfig, GpuEvaluator
from cuco_kit.evaluate.mps import mps_daemon_pids, mps_pids_since
from cuco_kit.evaluate.pool import live_worker_pids

ROOT = Path(__file__).resolve().parents[2]
WL = ROOT / "sample_kernels" / "allgather"
ADV = ROOT / "tests" / "data" / "adversarial"
# --quick: one candidate per kind of rejection: wrong output, a forbidden host call (L0), a race only two ranks show,
# a runtime wait nobody satisfies (a verdict naming the flag, the world kept)
QUICK_ADVERSARIAL = ("skips_compute.cu", "writes_file.cu", "drops_peer_stores.cu", "waits_on_unraised_flag.cu")


def gpu_memory_used() -> list[int]:
    """MiB in use on each GPU, as nvidia-smi lists them."""
    return [int(g["memory.used"]) for g in detect_gpu() if g["memory.used"].isdigit()]


def compute_apps() -> list[str]:
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,process_name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout
        return [line.strip() for line in out.splitlines() if line.strip()]
    except (OSError, subprocess.SubprocessError):  # no nvidia-smi, or it hung: nothing to list
        return []


def l0_available() -> bool:
    try:  # the probe is the import itself: a package that is present but broken counts as missing
        import tree_sitter  # noqa: F401, PLC0415 - imported only to see whether it imports
        import tree_sitter_cuda  # noqa: F401, PLC0415 - imported only to see whether it imports
        return True
    except ImportError:
        return False


def run_case(ev: GpuEvaluator, name: str, path: Path, backend: str, world: int, params: dict[str, int],
             expect: dict[str, Any], iters: int, parent: Path | None = None, **request: Any) -> dict[str, Any]:
    req = EvalRequest(candidate_code=path.read_text(), workload_dir=str(WL), params=params, world_size=world,
                      backend=backend, iters=iters, parent_code=parent.read_text() if parent else None, label=name,
                      **request)
    t0 = time.monotonic()
    try:
        res = ev.evaluate(req)
        d = res.to_dict()
    except Exception as exc:  # noqa: BLE001 - misuse or a harness bug: recorded, the run goes on
        d = {"verdict": "error", "level_reached": "?", "reason": f"{type(exc).__name__}: {exc}", "median_ms": None,
             "logs": {}, "provenance": {}}
    d["wall_s"] = round(time.monotonic() - t0, 3)
    ok, why = check(d, expect)
    row = {"case": name, "backend": backend, "world": world, "expect": expect, "ok": ok, "why": why,
           "verdict": d["verdict"], "level": d.get("level_reached"), "reason": (d.get("reason") or "")[:400],
           "median_ms": d.get("median_ms"), "spread_ms": d.get("spread_ms"), "seed_median_ms": d.get("seed_median_ms"),
           "speedup": d.get("speedup"), "flagged": d.get("flagged"), "max_rel_err": d.get("max_rel_err"),
           "wall_s": d["wall_s"], "eval_seconds": d.get("provenance", {}).get("eval_seconds"),
           "warm": d.get("provenance", {}).get("warm_workers"),
           "worker_start_seconds": d.get("provenance", {}).get("worker_start_seconds"),
           "seed_measured": d.get("provenance", {}).get("seed_measured"),
           "speedup_ci": d.get("speedup_ci"), "phases": d.get("provenance", {}).get("phases"),
           "notes": d.get("provenance", {}).get("notes", []), "provenance": d.get("provenance", {})}
    if d.get("timeline"):
        row["timeline"] = {"ranks": sorted({r["rank"] for r in d["timeline"]}),
                           "names": sorted({r["name"] for r in d["timeline"]})}
    if not ok:
        row["logs"] = {k: v[-2500:] for k, v in (d.get("logs") or {}).items()}
    say(f"[{'ok ' if ok else 'BAD'}] {name:28s} {backend}-{world}: {d['verdict']} {d.get('level_reached')} "
        f"{(d.get('reason') or '')[:100]} {'' if ok else '<- ' + why}")
    return row


def check(d: dict[str, Any], expect: dict[str, Any]) -> tuple[bool, str]:
    if expect["verdict"] == "pass":
        if d["verdict"] != "pass":
            return False, f"expected pass, got {d['verdict']}: {d.get('reason')}"
        if not d.get("median_ms") or d["median_ms"] <= 0:
            return False, "passed without a time"
        return True, ""
    # rejection expected: never scored
    if d["verdict"] == "pass" or d.get("median_ms") is not None or d.get("speedup") is not None:
        return False, f"expected rejection ({expect.get('reason')}), but it was scored/passed"
    if d["verdict"] != "fail":
        return False, f"expected verdict fail, got {d['verdict']}: {d.get('reason')}"
    want_level = expect.get("level")
    if want_level == "L0" and not expect.get("l0_available", True):
        return True, "L0 unavailable here (no tree-sitter); rejected later instead"
    if want_level and d.get("level_reached") != want_level:
        return False, f"expected level {want_level}, got {d.get('level_reached')}"
    words = expect.get("reason")
    alternatives = [words] if isinstance(words, str) else list(words or [])
    reason = (d.get("reason") or "").lower()
    if alternatives and not any(w.lower() in reason for w in alternatives):
        return False, f"reason lacks {' or '.join(map(repr, alternatives))}"
    return True, ""


def prebuild(ev: GpuEvaluator, cases: list[tuple[Path, str, int]]) -> float:
    """Every build the run needs (the helper library, each case's timed and stress builds), in parallel."""
    reqs = [EvalRequest(candidate_code=path.read_text(), workload_dir=str(WL), backend=backend, world_size=world)
            for path, backend, world in sorted(set(cases))]
    t0 = time.monotonic()
    with cf.ThreadPoolExecutor(max_workers=min(16, os.cpu_count() or 4)) as pool:
        helpers = pool.submit(build_helpers, ev.cfg.cache_dir, ev.cfg.build)
        list(pool.map(ev.prebuild, reqs))
        helpers.result()
    return time.monotonic() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "benchmarks" / "harness" / "out"))
    ap.add_argument("--n", type=int, default=1 << 22, help="N_PER_RANK (bf16 elements per rank)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--budget-s", type=float, default=480.0, help="stop starting new cases after this long")
    ap.add_argument("--skip-adversarial", action="store_true")
    ap.add_argument("--quick", action="store_true", help=f"adversarial set: only {', '.join(QUICK_ADVERSARIAL)}")
    ap.add_argument("--cache-dir", default=str(EvaluatorConfig().cache_dir), help="build cache (shared by default)")
    args = ap.parse_args(argv)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    gpus = detect_gpu()
    if not gpus:
        print("no GPU (nvidia-smi lists none): nothing to check here")
        return 2
    mem_before = gpu_memory_used()
    mps_before = set(mps_daemon_pids())
    has_l0 = l0_available()
    params = {"N_PER_RANK": args.n}
    cache = Path(args.cache_dir)
    cfg = EvaluatorConfig(cache_dir=cache, scratch_root=Path(tempfile.mkdtemp(prefix="cuco-gpucheck-")))
    rows: list[dict[str, Any]] = []
    skipped: list[str] = []
    ev = GpuEvaluator(cfg)
    n_gpus = len(gpus)
    worlds = [("nccl", 1), ("symm", 2), ("symm", 4)]
    expected = json.loads((ADV / "EXPECTED.json").read_text())
    adversarial = [] if args.skip_adversarial else [
        (fname, exp, backend, world) for fname, exp in expected.items() if not fname.startswith("_")
        if exp.get("workload", "sample_kernels/allgather") == "sample_kernels/allgather" and "preset" not in exp
        for backend, world in (("nccl", 1), ("symm", 2)) if backend in exp.get("backends", ["nccl", "symm"])
        if not args.quick or fname in QUICK_ADVERSARIAL]
    builds = [(WL / name, backend, world) for backend, world in worlds
              for name in ("device_lsa.cu", "seed_nccl.cu" if backend == "nccl" else "seed_copy.cu")]
    builds += [(ADV / fname, backend, world) for fname, exp, backend, world in adversarial if exp["level"] != "L0"]
    build_s = prebuild(ev, builds)
    say(f"prebuilt {len(set(builds))} sources (and their stress builds) in {build_s:.1f} s")
    # baseline and seed per world, nccl-2 on two GPUs, 3 warm, 1 profiled, the adversarial set, 1 cold
    bar = progress(desc="gpu check", total=2 * len(worlds) + (n_gpus >= 2) + 4 + len(adversarial) + 1, unit="case")

    def case(*a: Any, **request: Any) -> dict[str, Any]:
        row = run_case(*a, **request)
        bar.update()
        return row

    try:
        # 1-2: the device-initiated baseline and the seeds
        for backend, world in worlds:
            rows.append(case(ev, "device_lsa.cu", WL / "device_lsa.cu", backend, world, params, {"verdict": "pass"},
                             args.iters))
            seed = WL / ("seed_nccl.cu" if backend == "nccl" else "seed_copy.cu")
            rows.append(case(ev, seed.name, seed, backend, world, params, {"verdict": "pass"}, args.iters))
        if n_gpus >= 2:
            rows.append(case(ev, "device_lsa.cu", WL / "device_lsa.cu", "nccl", 2, params, {"verdict": "pass"},
                             args.iters))
        # 4: warm per-candidate time (the build is cached by now)
        warm = [case(ev, "device_lsa.cu (warm)", WL / "device_lsa.cu", "symm", 2, params, {"verdict": "pass"},
                     args.iters) for _ in range(3)]
        rows += warm
        # the kernel timeline of one more evaluation on the warm world (every rank's kernels, the candidate's too)
        rows.append(case(ev, "device_lsa.cu (timeline)", WL / "device_lsa.cu", "symm", 2, params, {"verdict": "pass"},
                         5, None, timeline=True, measure_seed=False))
        # 3: adversarial set
        for fname, exp, backend, world in adversarial:
            if time.monotonic() - t_start > args.budget_s:
                skipped.append(f"{fname} {backend}-{world}")
                bar.update()
                continue
            honest = world < exp.get("min_world", 1)
            e = {"verdict": "pass"} if honest else {"verdict": "fail", "level": exp["level"],
                                                     "reason": exp["reason_contains"], "l0_available": has_l0}
            parent = ROOT / exp["parent"] if exp.get("parent") else None
            rows.append(case(ev, fname, ADV / fname, backend, world, params, e, args.iters, parent))
    finally:
        ev.close()
    # cold start: a fresh evaluator, one candidate
    cold_row = None
    if time.monotonic() - t_start < args.budget_s + 60:
        ev2 = GpuEvaluator(EvaluatorConfig(cache_dir=cache, scratch_root=Path(tempfile.mkdtemp(prefix="cuco-cold-"))))
        try:
            cold_row = case(ev2, "device_lsa.cu (cold)", WL / "device_lsa.cu", "symm", 2, params, {"verdict": "pass"},
                            args.iters)
            rows.append(cold_row)
        finally:
            ev2.close()
    else:
        skipped.append("cold start measurement")
    bar.close()
    # 5: leaks
    time.sleep(2.0)
    leaks = {"rank_processes": live_worker_pids(), "mps_daemons_we_left": mps_pids_since(mps_before),
             "compute_apps": compute_apps(), "gpu_memory_before_mib": mem_before,
             "gpu_memory_after_mib": gpu_memory_used()}
    mem_ok = all(a - b <= 256 for a, b in zip(leaks["gpu_memory_after_mib"], mem_before))
    leak_ok = not leaks["rank_processes"] and not leaks["mps_daemons_we_left"] and mem_ok
    warm_s = [r["eval_seconds"] for r in warm if r.get("eval_seconds") is not None and r.get("warm")]
    overhead = {"warm_eval_seconds": warm_s, "cold_eval_seconds": cold_row and cold_row.get("eval_seconds"),
                "cold_worker_start_seconds": cold_row and cold_row.get("worker_start_seconds"),
                "note": "per-candidate evaluation; the seed measured in the same world and reused (seed_cache.py); "
                        "builds cached"}
    summary = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "gpus": gpus,
               "l0_available": has_l0, "params": params, "iters": args.iters, "quick": args.quick,
               "prebuild_seconds": round(build_s, 1), "rows": rows, "skipped": skipped,
               "overhead": overhead, "leaks": leaks, "leak_ok": leak_ok,
               "all_ok": all(r["ok"] for r in rows) and leak_ok and not skipped,
               "seconds": round(time.monotonic() - t_start, 1)}
    text = json.dumps(summary, indent=1, default=str)
    (out_dir / "harness_gpu_check.json").write_text(text)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    try:
        (ROOT / "benchmarks" / "harness" / f"results-{stamp}.json").write_text(text)
    except OSError:
        pass
    print("\n| case | backend-world | verdict | level | median ms | seed ms | speed-up | eval s | check |")
    print("|---|---|---|---|---|---|---|---|---|")

    def f(v: float | None, p: int = 4) -> str:
        return "-" if v is None else f"{v:.{p}f}"

    for r in rows:
        print(f"| {r['case']} | {r['backend']}-{r['world']} | {r['verdict']} | {r['level']} | {f(r['median_ms'])} | "
              f"{f(r['seed_median_ms'])} | {f(r['speedup'], 2)} | {f(r['eval_seconds'], 2)} | "
              f"{'ok' if r['ok'] else 'BAD: ' + r['why'][:60]} |")
    print(f"\nwarm per-candidate eval s: {warm_s}; cold: {overhead['cold_eval_seconds']} "
          f"(worker start {overhead['cold_worker_start_seconds']} s)")
    print(f"leaks: {'none' if leak_ok else json.dumps(leaks)}; skipped: {skipped or 'nothing'}; L0 here: {has_l0}")
    print(f"ALL OK: {summary['all_ok']}  ({summary['seconds']} s)")
    return 0 if summary["all_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
