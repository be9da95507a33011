"""The host-driven seeds beside the device-initiated baselines, at 2 and 4 `symm` ranks on ONE GPU: every sample's
seed_nccl.cu (host NCCL, served by runtime/symm_nccl/nccl.h over the ranks' shared memory) and its device_lsa.cu at
the default knob values, each verified (L2) and timed against the workload's own symm seed (seed_copy.cu) measured
in the same evaluation. Ranks sharing one GPU under MPS check correctness and contention, not NVLink: these times
say how the host-NCCL layer compares with a copy-engine seed and an LSA kernel on one GPU, nothing about a
multi-GPU machine.

    python benchmarks/host_nccl/seeds_symm.py --out OUT [--preset small] [--iters 10] [--budget-s 300]
Writes OUT/seeds_symm.json (every result, GPU, driver, NCCL, torch, git revision, date) and OUT/seeds_symm.md.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import datetime as dt
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from cuco_kit.evaluate.api import EvalRequest
from cuco_kit.evaluate.device import detect_gpu, git_revision
from cuco_kit.evaluate.gpu_evaluator import GpuEvaluator, prebuild
from cuco_kit.workload import load_workload

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ("allgather", "gemm_allgather", "moe_dispatch_combine", "attention_cp", "kv_transfer")
SOURCES = ("seed_nccl.cu", "device_lsa.cu")
WORLDS = (2, 4)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--preset", default="small")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--budget-s", type=float, default=300.0, help="stop starting evaluations after this long")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    ev = GpuEvaluator()
    rows: list[dict[str, Any]] = []
    skipped: list[str] = []
    # every build at once (nvcc is most of a cold run): both sources, the copy seeds, the stress builds
    jobs = [EvalRequest(candidate_code=(ROOT / "sample_kernels" / s / n).read_text(),
                        workload_dir=str(ROOT / "sample_kernels" / s), world_size=2, backend="symm")
            for s in SAMPLES for n in (*SOURCES, "seed_copy.cu")]
    with cf.ThreadPoolExecutor(max_workers=16) as pool:
        built = list(pool.map(lambda req: prebuild(ev.cfg, req), jobs))
    print(f"prebuilt {sum(built)}/{len(built)} in {time.monotonic() - t0:.0f} s", flush=True)
    try:
        for sample in SAMPLES:
            d = ROOT / "sample_kernels" / sample
            wl = load_workload(d)
            for world in WORLDS:
                for name in SOURCES:
                    if time.monotonic() - t0 > args.budget_s:
                        skipped.append(f"{sample} {name} symm-{world}")
                        continue
                    r = ev.evaluate(EvalRequest(
                        candidate_code=(d / name).read_text(), workload_dir=str(d),
                        params=dict(wl.size_presets[args.preset]), world_size=world, backend="symm",
                        iters=args.iters, trials=2, label=f"{sample}/{name}"))
                    rows.append({"sample": sample, "source": name, "world": world, "verdict": r.verdict,
                                 "reason": r.reason[:300], "median_ms": r.median_ms, "spread_ms": r.spread_ms,
                                 "iteration_ms": r.iteration_ms, "copy_seed_ms": r.seed_median_ms,
                                 "vs_copy_seed": r.speedup, "vs_copy_seed_ci": r.speedup_ci,
                                 "timing": (r.timing or {}).get("score"), "max_rel_err": r.max_rel_err,
                                 "oracle": r.oracle, "provenance": r.provenance})
                    print(f"{sample:22s} {name:14s} symm-{world} {r.verdict:5s} {r.median_ms} ms "
                          f"(copy seed {r.seed_median_ms} ms) {r.reason[:120]}", flush=True)
    finally:
        ev.close()
    gpus = detect_gpu()
    prov = next((r["provenance"] for r in rows if r["provenance"].get("nccl")), rows[0]["provenance"] if rows else {})
    meta = {"gpu": gpus[0]["name"] if gpus else None, "driver": gpus[0].get("driver_version") if gpus else None,
            "nccl": prov.get("nccl"), "torch": prov.get("torch"), "mps": prov.get("mps"), "git": git_revision(),
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "preset": args.preset,
            "iters": args.iters, "skipped": skipped}
    (args.out / "seeds_symm.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=str))
    (args.out / "seeds_symm.md").write_text(table(meta, rows))
    print(table(meta, rows))
    return 0 if rows and not skipped and all(r["verdict"] == "pass" for r in rows) else 1


def table(meta: dict, rows: list[dict]) -> str:
    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.4f}"

    def ratio(r: dict) -> str:
        ci = r["vs_copy_seed_ci"]
        return "-" if r["vs_copy_seed"] is None else f"{r['vs_copy_seed']:.2f}x" + (
            f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "")

    out = [f"# Host-NCCL seeds beside the LSA baselines, `symm` ranks sharing one {meta['gpu']} ({meta['date']})", "",
           f"GPU {meta['gpu']}, driver {meta['driver']}, NCCL headers {meta['nccl']}, torch {meta['torch']}, MPS "
           f"{meta['mps']}, git {meta['git']}; preset `{meta['preset']}`, {meta['iters']} timed iterations, the score "
           "timing of each workload. Ratio: the workload's copy-engine symm seed (seed_copy.cu, measured in the same "
           "evaluation) over the row, [95% bootstrap interval]; above 1 is faster than the copy seed. Ranks share "
           "ONE GPU: correctness and contention only, nothing about NVLink.", "",
           "| sample | ranks | source | verdict | median (ms) | copy seed (ms) | copy seed / row |",
           "| --- | ---: | --- | --- | ---: | ---: | ---: |"]
    for r in rows:
        out.append(f"| {r['sample']} | {r['world']} | {r['source']} | {r['verdict']} | {ms(r['median_ms'])} | "
                   f"{ms(r['copy_seed_ms'])} | {ratio(r)} |")
    if meta["skipped"]:
        out += ["", "Not run (budget): " + "; ".join(meta["skipped"])]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
