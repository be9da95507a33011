"""GEMM + AllGather on one GPU machine, in one call: L2 of every seed and knob value, then the benchmark table.

  PYTHONPATH=. python3 benchmarks/gemm_allgather/run.py --out DIR [--presets 4096,8192] [--budget-s 480]

1. Builds (in parallel) the seeds and a covering set of device_lsa.cu variants: every (placement, sync, issuer)
   combination, chunk count cycling through its values, so every value of every knob is built and run.
2. L2 (the harness's fresh-input verification, several trials) at world size 1 under nccl and at 2 and 4 ranks
   under symm + compat, at the "small" preset, for both seeds and every variant.
3. Benchmark at each preset: world size 1 (nccl): cuBLAS alone, both seeds, the variants; 4 ranks (symm): the copy
   seed and the variants. Times are the harness's: median over timed iterations of the slowest rank, cold L2,
   fresh inputs, seed re-measured in the same run. cuBLAS alone is measured last in a child process (torch.matmul
   on the same per-rank shape, events, cold L2, fresh inputs, median).
Counts first: FLOPs per rank = 2*M*K*N/W; bytes each rank receives = (W-1)*(M/W)*K*2.
Under symm all ranks share one GPU (one L2, one clock, MPS): ratios there say nothing about NVLink.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import datetime as dt
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from cuco_kit import blocks  # noqa: E402
from cuco_kit.evaluate.api import EvalRequest  # noqa: E402
from cuco_kit.evaluate.cascade import EvaluatorConfig, GpuEvaluator, detect_gpu  # noqa: E402
from cuco_kit.workload import load_workload  # noqa: E402

WL_DIR = ROOT / "sample_kernels" / "gemm_allgather"
# The world-1 compute bound under the same harness (same cublasGemmEx call, none of the co-design machinery).
CUBLAS_ALONE = (Path(__file__).parent / "cublas_alone.cu").read_text()

CUBLAS_CHILD = r"""
import json, sys, torch
M, N, K, W, iters = (int(a) for a in sys.argv[1:6])
torch.cuda.set_device(0)
g = torch.Generator(device="cuda"); g.manual_seed(0)
flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
xs = [torch.randn(M, K, device="cuda", generator=g).to(torch.bfloat16) for _ in range(2)]
ws = [(torch.randn(K, N // W, device="cuda", generator=g) / K ** 0.5).to(torch.bfloat16) for _ in range(2)]
for i in range(3):
    torch.matmul(xs[i % 2], ws[i % 2])
times = []
for i in range(iters):
    xs[i % 2].normal_(generator=g); ws[i % 2].normal_(generator=g)
    flush.zero_()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record(); torch.matmul(xs[i % 2], ws[i % 2]); b.record(); b.synchronize()
    times.append(a.elapsed_time(b))
times.sort()
print(json.dumps({"median_ms": times[len(times) // 2], "p10": times[len(times) // 10],
                  "p90": times[(9 * len(times)) // 10]}))
"""


def variants(code: str) -> list[tuple[dict[str, str], str]]:
    """Every (placement, sync, issuer) combination; chunks cycle so each of its values appears."""
    ks = {k.name: k for k in blocks.knobs(code)}
    chunks = ks["kChunks"].allowed
    out = []
    combos = itertools.product(ks["kPlacement"].allowed, ks["kSync"].allowed, ks["kIssuer"].allowed)
    for i, (p, s, iss) in enumerate(combos):
        kv = {"kPlacement": p, "kSync": s, "kIssuer": iss, "kChunks": chunks[i % len(chunks)]}
        out.append((kv, blocks.set_knobs(code, kv)))
    return out


def short(kv: dict[str, str]) -> str:
    return "/".join(v.split("::")[-1].lstrip("k") for v in kv.values())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "benchmarks" / "gemm_allgather" / "out"))
    ap.add_argument("--presets", default="4096,8192")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--budget-s", type=float, default=480.0)
    ap.add_argument("--skip-l2", action="store_true")
    ap.add_argument("--worlds", default="1,2,4", help="world sizes to run (1 = nccl, 2 and 4 = symm)")
    args = ap.parse_args()
    t_start = time.monotonic()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    wl = load_workload(WL_DIR)
    base = (WL_DIR / wl.baseline).read_text()
    seeds = {"seed_nccl.cu": (WL_DIR / "seed_nccl.cu").read_text(), "seed_copy.cu": (WL_DIR / "seed_copy.cu").read_text()}
    vs = variants(base)
    ev = GpuEvaluator(EvaluatorConfig())
    rows: list[dict[str, Any]] = []
    skipped: list[str] = []

    # 1. builds, in parallel
    t0 = time.monotonic()
    jobs = [(c, b) for _, c in vs for b in ("nccl", "symm")] + [(CUBLAS_ALONE, "nccl")] + [(seeds["seed_nccl.cu"], "nccl")] + \
           [(seeds["seed_copy.cu"], b) for b in ("nccl", "symm")]
    with cf.ThreadPoolExecutor(max_workers=min(16, os.cpu_count() or 4)) as pool:
        built = list(pool.map(lambda j: ev.prebuild(EvalRequest(candidate_code=j[0], workload_dir=str(WL_DIR),
                                                                backend=j[1])), jobs))
    build_s = time.monotonic() - t0
    print(f"built {sum(built)}/{len(built)} in {build_s:.1f} s", flush=True)

    def run(name: str, code: str, world: int, backend: str, preset: str, phase: str, **kw: Any) -> None:
        if time.monotonic() - t_start > args.budget_s:
            skipped.append(f"{phase} {name} {backend}-{world} {preset}")
            return
        req = EvalRequest(candidate_code=code, workload_dir=str(WL_DIR), params=dict(wl.size_presets[preset]),
                          world_size=world, backend=backend, label=name, **kw)
        r = ev.evaluate(req)
        row = {"phase": phase, "name": name, "world": world, "backend": backend, "preset": preset,
               "verdict": r.verdict, "level": r.level_reached, "reason": r.reason[:300], "median_ms": r.median_ms,
               "spread_ms": r.spread_ms, "seed_ms": r.seed_median_ms, "speedup": r.speedup,
               "max_rel_err": r.max_rel_err, "flagged": r.flagged, "iteration_ms": r.iteration_ms,
               "per_rank_median_ms": r.per_rank_median_ms, "provenance": r.provenance}
        rows.append(row)
        ms = f"{r.median_ms:.4f}" if r.median_ms else "-"
        print(f"[{phase}] {name:34s} {backend}-{world} {preset:5s} {r.verdict:5s} {r.level_reached} {ms} "
              f"{r.reason[:100]}", flush=True)

    # 2. L2 at the small preset: several fresh-input trials, every seed and variant
    worlds = {int(w) for w in args.worlds.split(",") if w}
    configs = [c for c in [(1, "nccl"), (2, "symm"), (4, "symm")] if c[0] in worlds]
    if not args.skip_l2:
        for world, backend in configs:
            for name, code in seeds.items():
                if backend == "symm" and name == "seed_nccl.cu":
                    continue
                run(name, code, world, backend, "small", "L2", iters=3, trials=4, measure_seed=False)
            for kv, code in vs:
                run(short(kv), code, world, backend, "small", "L2", iters=3, trials=4, measure_seed=False)

    # 3. benchmark at each preset
    for preset in [p for p in args.presets.split(",") if p]:
        if 1 in worlds:
            for name, code in {**seeds, "cublas_alone.cu": CUBLAS_ALONE}.items():
                run(name, code, 1, "nccl", preset, "bench", iters=args.iters)
        if 4 in worlds:
            run("seed_copy.cu", seeds["seed_copy.cu"], 4, "symm", preset, "bench", iters=args.iters)
        for world, backend in [c for c in ((1, "nccl"), (4, "symm")) if c[0] in worlds]:
            for kv, code in vs:
                run(short(kv), code, world, backend, preset, "bench", iters=args.iters)
    history = list(ev.history)
    ev.close()

    # cuBLAS alone, in a child (the evaluator's workers are gone; this process never touched CUDA)
    cublas = {}
    for preset in [p for p in args.presets.split(",") if p]:
        P = wl.size_presets[preset]
        for W in (1, 4):
            env = dict(os.environ, NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
            p = subprocess.run([sys.executable, "-c", CUBLAS_CHILD, str(P["M"]), str(P["N"]), str(P["K"]), str(W),
                                str(args.iters)], capture_output=True, text=True, timeout=120, env=env)
            try:
                cublas[f"{preset}-W{W}"] = json.loads(p.stdout.strip().splitlines()[-1])
            except Exception:  # noqa: BLE001
                cublas[f"{preset}-W{W}"] = {"error": (p.stderr or p.stdout)[-400:]}

    gpus = detect_gpu()
    prov = next((r["provenance"] for r in rows if r["provenance"].get("gpu")), {})
    symm_prov = next((r["provenance"] for r in rows if r["backend"] == "symm" and "mps" in r["provenance"]), {})
    meta = {"date": dt.date.today().isoformat(), "gpu": gpus[0]["name"] if gpus else None,
            "driver": gpus[0].get("driver_version") if gpus else None, "nccl": prov.get("nccl"),
            "mps": symm_prov.get("mps"),
            "torch": prov.get("torch"), "build_seconds": round(build_s, 1), "builds": len(built),
            "builds_ok": sum(built), "skipped": skipped, "wall_s": round(time.monotonic() - t_start, 1)}
    result = {"meta": meta, "cublas_alone": cublas, "rows": rows, "eval_history": history}
    text = json.dumps(result, indent=1, default=str)
    (out / "gemm_allgather.json").write_text(text)
    table = make_table(result)
    print(table)
    l2 = [r for r in rows if r["phase"] == "L2"]
    bad = [r for r in l2 if r["verdict"] != "pass"]
    print(f"L2: {len(l2) - len(bad)}/{len(l2)} passed; skipped: {len(skipped)}")
    return 0 if not bad and not skipped else 1


def make_table(result: dict[str, Any]) -> str:
    m = result["meta"]
    lines = [f"# GEMM + AllGather on one {m['gpu']} ({m['date']})", "",
             f"GPU {m['gpu']}, driver {m['driver']}, NCCL {m['nccl']}, MPS (symm rows) {m['mps']}, "
             f"torch {m['torch']}. Times: median over timed iterations of the slowest rank (ms), cold L2, fresh "
             "inputs; the seed re-measured in the same run. symm: all ranks share ONE GPU (one L2, one clock) — "
             "ratios there say nothing about NVLink.", ""]
    l2 = [r for r in result["rows"] if r["phase"] == "L2"]
    if l2:
        lines += ["## L2 (small preset, 4 fresh-input trials each)", "", "| backend-world | passed | failed |",
                  "|---|---|---|"]
        for key in sorted({(r["backend"], r["world"]) for r in l2}):
            g = [r for r in l2 if (r["backend"], r["world"]) == key]
            fails = [f"{r['name']}: {r['reason'][:60]}" for r in g if r["verdict"] != "pass"]
            lines.append(f"| {key[0]}-{key[1]} | {len(g) - len(fails)}/{len(g)} | {'; '.join(fails) or '-'} |")
        lines.append("")
    bench = [r for r in result["rows"] if r["phase"] == "bench"]
    for preset in sorted({r["preset"] for r in bench}):
        lines += [f"## M=N=K={preset}", ""]
        for W, backend in ((1, "nccl"), (4, "symm")):
            g = [r for r in bench if r["preset"] == preset and r["world"] == W]
            if not g:
                continue
            cb = result["cublas_alone"].get(f"{preset}-W{W}", {})
            cbm = cb.get("median_ms")
            lines += [f"### world size {W} ({backend})" + (f": cuBLAS alone {cbm:.4f} ms" if cbm else ""), "",
                      "| kernel | verdict | median ms | spread ms | seed ms | x seed | x cuBLAS alone |",
                      "|---|---|---|---|---|---|---|"]
            for r in sorted(g, key=lambda r: (r["median_ms"] is None, r["median_ms"] or 0)):
                med = r["median_ms"]
                lines.append(
                    f"| {r['name']} | {r['verdict']} | {med:.4f} | {r['spread_ms'] or 0:.4f} | "
                    f"{r['seed_ms'] or 0:.4f} | {r['speedup'] or 0:.3f} | {(cbm / med) if cbm and med else 0:.3f} |"
                    if med else f"| {r['name']} | {r['verdict']} | - | - | - | - | - |")
            ok = [r["median_ms"] for r in g if r["verdict"] == "pass" and r["median_ms"] and ".cu" not in r["name"]]
            if ok:
                lines.append("")
                lines.append(f"variants: best {min(ok):.4f} ms, worst {max(ok):.4f} ms "
                             f"(worst/best {max(ok) / min(ok):.2f}x)" + (
                                 f"; best vs cuBLAS alone {min(ok) / cbm:.3f}x" if cbm else ""))
            lines.append("")
    if result["meta"]["skipped"]:
        lines += ["Skipped (budget): " + "; ".join(result["meta"]["skipped"]), ""]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
