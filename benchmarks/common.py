"""What every sample benchmark shares: the covering set of knob variants, one evaluator with a time budget, the
environment block, reference timings of torch in a child process, and the tables.

Each benchmarks/<sample>/run.py says WHAT to run (presets, worlds, the compute-alone reference); this module says
HOW, so the samples' numbers come from one protocol: the harness's (median over timed iterations of the slowest
rank, cold L2, fresh inputs, the seed re-measured in the same run). Under `symm` all ranks share one GPU (one L2,
one clock, MPS): ratios there say nothing about NVLink, and the tables say so.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import datetime as dt
import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from console import progress, say

# The sample scripts run by path, not installed: the repository root (the kit) goes first on sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cuco_kit.evaluate.api import EvalRequest
from cuco_kit.evaluate.device import MULTICAST_OFF, detect_gpu
from cuco_kit.evaluate.gpu_evaluator import EvaluatorConfig, GpuEvaluator
from cuco_kit.evaluate.stats import FLUSH_BYTES, ratio_label
from cuco_kit.source import knob_rules, markers
from cuco_kit.workload import load_workload

ROOT = Path(__file__).resolve().parents[1]
L2_TRIALS = 4  # fresh-input trials per L2 check
WORLD_BACKEND = {1: "nccl", 2: "symm", 4: "symm"}  # one GPU: NCCL at world size 1, shared-GPU ranks beyond
# cuBLAS's kernels on Hopper: nvjet_* (cuBLAS 12.8+), sm90_xmma_gemm_*, cutlass_*; torch's matmul uses the same
GEMM_KERNEL = re.compile(r"gemm|nvjet|xmma|cutlass", re.IGNORECASE)


def is_number(token: str) -> bool:
    return re.fullmatch(r"-?\d+", token.strip()) is not None


def covering_variants(code: str) -> list[tuple[dict[str, str], str]]:
    """Every combination of the enum knobs; the integer knobs of written sets cycle (each with its own phase) so
    every value of every such knob is built and run at least once. Range knobs (tuning: thread counts, loads in
    flight, SM shares) stay at their defaults: a sample table compares designs, tuning them is the search's job.
    A combination that breaks a knob rule is left out. Returns (knob values, source) pairs, the default's values
    first."""
    rules = knob_rules.rules(code)
    defaults = {k.name: k.value for k in markers.knobs(code)}
    ks = [k for k in markers.knobs(code) if k.range is None]
    enums = [k for k in ks if not all(is_number(v) for v in k.allowed)]
    ints = [k for k in ks if k not in enums]
    combos = [tuple(kv.values()) for kv in markers.knob_space(code, [k.name for k in enums])]
    default = tuple(k.value for k in enums)
    if default in combos:
        combos.remove(default)
        combos.insert(0, default)
    n = max([len(combos)] + [len(k.allowed) for k in ints])
    out, seen = [], set()
    for i in range(n):
        kv = dict(zip((k.name for k in enums), combos[i % len(combos)]))
        for m, k in enumerate(ints):
            kv[k.name] = k.value if i == 0 else k.allowed[(i + m) % len(k.allowed)]
        key = tuple(kv.items())
        if key not in seen and knob_rules.is_valid(rules, {**defaults, **kv}):
            seen.add(key)
            out.append((kv, markers.set_knobs(code, kv)))
    return out


def smoke_variants(code: str) -> list[tuple[dict[str, str], str]]:
    """The default and its opposite (every written-set knob at a value other than its default; range knobs at
    their defaults, as in covering_variants): a first look on a GPU."""
    ks = [k for k in markers.knobs(code) if k.range is None]
    opposite = {k.name: next((v for v in reversed(k.allowed) if v != k.value), k.value) for k in ks}
    return [({k.name: k.value for k in ks}, code), (opposite, markers.set_knobs(code, opposite))]


def short(kv: Mapping[str, str] | None, order: Sequence[str] = ()) -> str:
    """A variant's label: its knob values (only those named in `order`, in that order, when given), `/`-joined,
    enum scopes and the `k` prefix dropped; "-" for none."""
    if not kv:
        return "-"
    keys = [k for k in order if k in kv] if order else list(kv)
    return "/".join(str(kv[k]).split("::")[-1].removeprefix("k") for k in keys)


def base_args(description: str, out_default: Path) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--out", default=os.environ.get("OUT") or str(out_default))
    ap.add_argument("--iters", type=int, default=20, help="timed iterations per benchmark row")
    ap.add_argument("--budget-s", type=float, default=480.0, help="stop starting evaluations after this long")
    ap.add_argument("--worlds", default="1,2,4", help="world sizes (1 = nccl, 2 and 4 = symm on one GPU)")
    ap.add_argument("--smoke", action="store_true", help="seeds + default + opposite variant, L2 only")
    ap.add_argument("--skip-l2", action="store_true")
    ap.add_argument("--skip-bench", action="store_true")
    ap.add_argument("--l2-presets", default=None, help="comma list replacing the script's L2 presets")
    ap.add_argument("--bench-presets", default=None,
                    help="comma list: run only these of the script's benchmark presets (labels)")
    ap.add_argument("--only", default=None, metavar="REGEX",
                    help="run only the seeds and variants whose names match (a re-run of a few after a fix)")
    return ap


class SampleBench:
    """One evaluator, a budget, and the rows of one benchmark run of one sample."""

    def __init__(self, sample: str, args: argparse.Namespace) -> None:
        self.sample = sample
        self.args = args
        self.t_start = time.monotonic()
        self.wl_dir = ROOT / "sample_kernels" / sample
        self.wl = load_workload(self.wl_dir)
        self.baseline = (self.wl_dir / self.wl.baseline).read_text()
        self.seeds = {n: (self.wl_dir / n).read_text() for n in ("seed_nccl.cu", "seed_copy.cu")}
        self.variants = smoke_variants(self.baseline) if args.smoke else covering_variants(self.baseline)
        if args.only:
            keep = re.compile(args.only)
            self.seeds = {n: c for n, c in self.seeds.items() if keep.search(n)}
            self.variants = [(kv, c) for kv, c in self.variants if keep.search(short(kv))]
        self.worlds = [int(w) for w in args.worlds.split(",") if w]
        self.ev = GpuEvaluator(EvaluatorConfig())
        self.rows: list[dict[str, Any]] = []
        self.skipped: list[str] = []
        self.build_s = 0.0
        self.builds: list[bool] = []

    # ------------------------------------------------------------------------------------------- running
    def prebuild(self, extra: Iterable[tuple[str, str]] = ()) -> None:
        """Every source for every backend this run uses, in parallel (nvcc is the slow part of a cold run)."""
        backends = sorted({WORLD_BACKEND[w] for w in self.worlds})
        jobs = [(c, b) for _, c in self.variants for b in backends]
        jobs += [(c, b) for c in self.seeds.values() for b in backends]
        jobs += list(extra)
        t0 = time.monotonic()
        with cf.ThreadPoolExecutor(max_workers=min(16, os.cpu_count() or 4)) as pool:
            built = pool.map(lambda j: self.ev.prebuild(EvalRequest(
                candidate_code=j[0], workload_dir=str(self.wl_dir), backend=j[1])), jobs)
            self.builds = list(progress(built, f"{self.sample} builds", total=len(jobs), unit="build"))
        self.build_s = time.monotonic() - t0
        print(f"[{self.sample}] built {sum(self.builds)}/{len(self.builds)} in {self.build_s:.1f} s", flush=True)

    def run(self, name: str, code: str, world: int, preset: str, phase: str, params: Mapping[str, int] | None = None,
            label: str | None = None, **kw: Any) -> dict[str, Any] | None:
        """Evaluate one source at a preset (with `params` overriding some of its values; `label` names that
        combination in the rows). Past the budget the evaluation is listed as skipped, never run."""
        backend = WORLD_BACKEND[world]
        tag = label or preset
        if time.monotonic() - self.t_start > self.args.budget_s:
            self.skipped.append(f"{phase} {name} {backend}-{world} {tag}")
            return None
        p = {**self.wl.size_presets[preset], **(params or {})}
        req = EvalRequest(candidate_code=code, workload_dir=str(self.wl_dir), params=p, world_size=world,
                          backend=backend, label=name, **kw)
        r = self.ev.evaluate(req)
        row = {"phase": phase, "name": name, "world": world, "backend": backend, "preset": tag, "params": p,
               "verdict": r.verdict, "level": r.level_reached, "reason": r.reason[:300], "median_ms": r.median_ms,
               "spread_ms": r.spread_ms, "seed_ms": r.seed_median_ms, "speedup": r.speedup, "speedup_ci": r.speedup_ci,
               "max_rel_err": r.max_rel_err, "flagged": r.flagged, "iteration_ms": r.iteration_ms,
               "per_rank_median_ms": r.per_rank_median_ms, "provenance": r.provenance}
        if r.timeline:
            row["kernels_us"] = kernel_totals(r.timeline)
        if r.verdict != "pass":
            row["logs"] = {k: v[-1500:] for k, v in r.logs.items()}
        self.rows.append(row)
        ms = f"{r.median_ms:.4f}" if r.median_ms else "-"
        say(f"[{self.sample} {phase}] {name:40s} {backend}-{world} {tag:14s} {r.verdict:5s} {r.level_reached} "
            f"{ms} {r.reason[:160]}")
        return row

    def bench_labels(self, labels: Iterable[str]) -> list[str]:
        """The script's benchmark labels, narrowed to --bench-presets when given (an unknown name is an error)."""
        labels = list(labels)
        if not self.args.bench_presets:
            return labels
        wanted = self.args.bench_presets.split(",")
        unknown = sorted(set(wanted) - set(labels))
        if unknown:
            raise SystemExit(f"--bench-presets: {unknown} not among this script's benchmark presets {labels}")
        return [x for x in labels if x in wanted]

    def sources(self, world: int) -> list[tuple[str, str]]:
        """(name, code) of what runs at `world`: both seeds (under symm the host-NCCL seed runs through
        runtime/symm_nccl/nccl.h), then every variant."""
        return list(self.seeds.items()) + [(short(kv), code) for kv, code in self.variants]

    def l2(self, presets: Iterable[str]) -> None:
        """L2 (several fresh-input trials) of both seeds and every variant at every world size and preset
        (`--l2-presets` replaces the script's list)."""
        jobs = [(name, code, world, preset)
                for preset in (self.args.l2_presets.split(",") if self.args.l2_presets else presets)
                for world in self.worlds for name, code in self.sources(world)]
        for name, code, world, preset in progress(jobs, f"{self.sample} L2"):
            self.run(name, code, world, preset, "L2", iters=3, trials=L2_TRIALS, measure_seed=False)

    def bench(self, preset: str, world: int, params: Mapping[str, int] | None = None, label: str | None = None,
              timeline: bool = False) -> None:
        """Both seeds (the copy seed alone under symm) and every variant, each against the world's seed."""
        for name, code in progress(self.sources(world), f"{self.sample} {label or preset} world {world}"):
            self.run(name, code, world, preset, "bench", params, label, iters=self.args.iters, timeline=timeline)

    # ------------------------------------------------------------------------------------------ finishing
    def finish(self, extra: Mapping[str, Any], table: str) -> int:
        """Write <out>/<sample>.json, print the table and the L2 summary; rc 0 only when every L2 passed."""
        out = Path(self.args.out)
        out.mkdir(parents=True, exist_ok=True)
        result = {"meta": self.meta(), **extra, "rows": self.rows}
        (out / f"{self.sample}.json").write_text(json.dumps(result, indent=1, default=str))
        (out / f"{self.sample}.md").write_text(table)
        print(table)
        l2 = [r for r in self.rows if r["phase"] == "L2"]
        bad = [r for r in l2 if r["verdict"] != "pass"]
        print(f"[{self.sample}] L2: {len(l2) - len(bad)}/{len(l2)} passed; skipped (budget): {len(self.skipped)}")
        return 0 if not bad and not self.skipped else 1

    def close(self) -> None:
        self.ev.close()

    def meta(self) -> dict[str, Any]:
        gpus = detect_gpu()
        prov = next((r["provenance"] for r in self.rows if r["provenance"].get("nccl")), {})
        symm = next((r["provenance"] for r in self.rows if r["backend"] == "symm" and "mps" in r["provenance"]), {})
        return {"sample": self.sample, "date": dt.date.today().isoformat(),
                "gpu": gpus[0]["name"] if gpus else None, "driver": gpus[0].get("driver_version") if gpus else None,
                "nccl": prov.get("nccl"), "torch": prov.get("torch"), "mps": symm.get("mps"),
                "build_seconds": round(self.build_s, 1), "builds": len(self.builds), "builds_ok": sum(self.builds),
                "variants": [kv for kv, _ in self.variants], "skipped": self.skipped,
                "wall_s": round(time.monotonic() - self.t_start, 1)}


# ------------------------------------------------------------------------------------------- references
def kernel_totals(timeline: list[dict[str, Any]]) -> dict[str, float]:
    """Summed duration (us) per kernel name over one profiled iteration, all ranks' rows together divided by
    the number of ranks (so a per-rank figure)."""
    ranks = max(1, len({r["rank"] for r in timeline}))
    out: dict[str, float] = {}
    for r in timeline:
        out[r["name"]] = out.get(r["name"], 0.0) + r["dur_us"] / ranks
    return out


def matching_us(row: Mapping[str, Any], pattern: re.Pattern[str]) -> float | None:
    """Summed duration (us) of the kernels of a profiled row whose names match `pattern`; None if none ran."""
    ks = row.get("kernels_us") or {}
    hits = [v for k, v in ks.items() if pattern.search(k)]
    return sum(hits) if hits else None


def torch_child(code: str, *args: Any, timeout_s: float = 300.0) -> dict[str, Any]:
    """Run a reference timing script in a child process (the benchmark process never touches CUDA, the rank
    workers own the GPU) and return the JSON its last line prints, or {"error": ...}."""
    env = dict(os.environ, **MULTICAST_OFF)
    try:
        p = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True,
                           timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout_s:.0f} s"}
    try:
        return json.loads(p.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {"error": (p.stderr or p.stdout)[-600:]}


# Shared by the reference children: events + median, cold L2 before every iteration, fresh inputs through
# `refresh()`, and the profiler's per-iteration kernel time of the kernels whose names match a pattern.
TIMING_PRELUDE = f"""
import json, re, statistics, sys, torch
torch.cuda.set_device(0)
FLUSH = torch.empty({FLUSH_BYTES}, dtype=torch.uint8, device="cuda")  # the harness's L2 flush

def time_it(fn, refresh, iters):
    for _ in range(3):
        refresh(); fn()
    times = []
    for _ in range(iters):
        refresh(); FLUSH.zero_()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)

def kernel_us(fn, refresh, iters, pattern):
    from torch.profiler import ProfilerActivity, profile
    rx = re.compile(pattern, re.IGNORECASE)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            refresh(); FLUSH.zero_(); fn()
        torch.cuda.synchronize()
    tot = 0.0
    for e in prof.events():
        if str(getattr(e, "device_type", "")).endswith("CUDA") and rx.search(e.name) and e.time_range is not None:
            tot += e.time_range.end - e.time_range.start
    return tot / iters
"""


# --------------------------------------------------------------------------------------------------- tables
def header(meta: Mapping[str, Any], title: str) -> list[str]:
    return [f"# {title} on one {meta['gpu']} ({meta['date']})", "",
            f"GPU {meta['gpu']}, driver {meta['driver']}, NCCL {meta['nccl']}, MPS (symm rows) {meta['mps']}, "
            f"torch {meta['torch']}. Times: the harness's median over timed iterations of the slowest rank (ms), "
            "the score the workload picks (device time by default: the step's launches queued behind a hold, "
            "docs/timing.md), cold L2, fresh inputs; the seed re-measured in the same run. symm: all ranks share "
            "ONE GPU (one L2, one clock) - ratios there say nothing about NVLink.", ""]


def l2_table(rows: list[dict[str, Any]]) -> list[str]:
    l2 = [r for r in rows if r["phase"] == "L2"]
    if not l2:
        return []
    lines = [f"## L2 ({L2_TRIALS} fresh-input trials each)", "", "| preset | backend-world | passed | failed |",
             "|---|---|---|---|"]
    for key in sorted({(r["preset"], r["backend"], r["world"]) for r in l2}):
        g = [r for r in l2 if (r["preset"], r["backend"], r["world"]) == key]
        fails = [f"{r['name']}: {r['reason'][:80]}" for r in g if r["verdict"] != "pass"]
        lines.append(f"| {key[0]} | {key[1]}-{key[2]} | {len(g) - len(fails)}/{len(g)} | {'; '.join(fails) or '-'} |")
    return lines + [""]


def ratio_cell(row: Mapping[str, Any]) -> str:
    """A row's speed-up for a table: "1.042 [1.013, 1.071]", with "no measurable difference" when the 95%
    bootstrap interval contains 1.0 (rows written before intervals: the ratio alone)."""
    sp, ci = row.get("speedup"), row.get("speedup_ci")
    if sp is None:
        return "-"
    if not ci:
        return f"{sp:.3f}"
    label = ratio_label(ci)
    return f"{sp:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]" + (f" {label}" if label else "")


def bench_table(rows: list[dict[str, Any]], preset: str, world: int, bound_ms: float | None = None,
                bound_name: str = "") -> list[str]:
    g = [r for r in rows if r["phase"] == "bench" and r["preset"] == preset and r["world"] == world]
    if not g:
        return []
    backend = WORLD_BACKEND[world]
    lines = [f"### {preset}, world size {world} ({backend})" + (
        f": {bound_name} {bound_ms:.4f} ms" if bound_ms else ""), "",
        "| kernel | verdict | median ms | spread ms | seed ms | x seed | " + (
            f"x {bound_name} |" if bound_ms else "|"), "|---|---|---|---|---|---|" + ("---|" if bound_ms else "")]
    for r in sorted(g, key=lambda r: (r["median_ms"] is None, r["median_ms"] or 0)):
        med = r["median_ms"]
        if med:
            lines.append(f"| {r['name']} | {r['verdict']} | {med:.4f} | {r['spread_ms'] or 0:.4f} | "
                         f"{r['seed_ms'] or 0:.4f} | {ratio_cell(r)} |" + (
                             f" {bound_ms / med:.3f} |" if bound_ms else ""))
        else:
            lines.append(f"| {r['name']} | {r['verdict']}: {r['reason'][:60]} | - | - | - | - |" + (
                " - |" if bound_ms else ""))
    ok = [r["median_ms"] for r in g if r["verdict"] == "pass" and r["median_ms"] and ".cu" not in r["name"]]
    if ok:
        lines += ["", f"variants: best {min(ok):.4f} ms, worst {max(ok):.4f} ms (worst/best "
                      f"{max(ok) / min(ok):.2f}x)"]
    return lines + [""]


def median_or_none(xs: Iterable[float | None]) -> float | None:
    v = [x for x in xs if x is not None]
    return statistics.median(v) if v else None
