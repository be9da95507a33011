"""On a GPU machine: short offline searches of gemm_allgather through the local slot executor (one warm GPU
evaluator per GPU set, builds on a CPU pool ahead of the GPUs), and their evaluations per GPU-hour beside the
single-evaluator figure recorded in benchmarks/search/results.json (both parts of that run together).

  set -a; . cuco_kit/evaluate/multicast_off.env; set +a
  PYTHONPATH=. python3 benchmarks/executors/gpu_slots.py --out "$OUT" [--budget-s 200] [--parts nccl1,symm4]

Each part is a fresh search (a new store in a temp dir) of ``--candidates`` candidates (uniform random knob points
by default, which needs no optuna on the GPU image; ``--source design`` for the Optuna source), on every GPU
nvidia-smi lists (``--gpus`` to choose), within its share of ``--budget-s``. The build cache starts as the machine
has it: the builds a fresh machine makes run on the CPU pool during the search, and their time counts.
Evaluations per GPU-hour = candidates / search wall / GPUs x 3600. Writes gpu_slots.json and gpu_slots.md into
--out (copy them to benchmarks/executors/); exit code 0 when every part evaluated at least half its candidates
and each slot's evaluations report that slot's GPUs.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from cuco_kit.evaluate.device import MULTICAST_OFF, detect_gpu  # noqa: E402

os.environ.update(MULTICAST_OFF)  # every child inherits multicast off (the launcher sets them too)

from cuco_kit.evaluate.spec import EvaluatorSpec  # noqa: E402
from cuco_kit.events import EventBus  # noqa: E402
from cuco_kit.search.budget import BudgetConfig  # noqa: E402
from cuco_kit.search.config import SearchConfig  # noqa: E402
from cuco_kit.search.design_space import DesignSpaceSource, RandomKnobSource  # noqa: E402
from cuco_kit.search.engine import SearchEngine  # noqa: E402
from cuco_kit.search.slots import build_workers_default, local_executor  # noqa: E402
from cuco_kit.store import Store  # noqa: E402
from cuco_kit.workload import load_workload  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
os.chdir(ROOT)  # the stores name the workload by its repository path
warnings.filterwarnings("ignore", category=FutureWarning, message=".*constraints_func.*")
WL_REL = "sample_kernels/gemm_allgather"
PARTS = {"nccl1": (1, "nccl"), "symm4": (4, "symm")}
EARLIER = Path("benchmarks/search/results.json")  # the single-evaluator run (its parts together)


def earlier_figure() -> float | None:
    if not EARLIER.is_file():
        return None
    figure = json.loads(EARLIER.read_text()).get("throughput", {}).get("candidates_per_gpu_hour")
    return round(figure) if figure is not None else None


def run_part(part: str, gpus: list[str], args: argparse.Namespace, wall_cap: float) -> dict[str, Any]:
    world, backend = PARTS[part]
    wl = load_workload(WL_REL)
    spec = EvaluatorSpec("gpu", {"recycle_every": 1000})
    ex = local_executor(spec, gpus, world, backend, build_workers=args.build_workers)
    cfg = SearchConfig(world_size=world, backend=backend, params=dict(wl.size_presets[args.preset]), iters=10,
                       seed=0, proposals_per_generation=max(4, 2 * ex.slots),
                       budget=BudgetConfig(generations=100000, wall_s=wall_cap, evaluations=args.candidates + 1))
    cfg.phases.explore.mix = {"design_space": 1.0}
    cfg.phases.exploit.mix = {"design_space": 1.0}
    events = EventBus()
    events.subscribe(lambda e: e.kind == "evaluation_finished" and print(
        f"  [{part}] eval {e.data['evaluation_id']}: {e.data['verdict']} at {e.data['level_reached']} "
        f"{e.data['median_ms']} ms", flush=True))
    db = Path(tempfile.mkdtemp(prefix="cuco-gpu-slots-")) / f"{part}.sqlite"
    t0 = time.monotonic()
    with Store(db) as st:
        source = DesignSpaceSource() if args.source == "design" else RandomKnobSource()
        summary = SearchEngine(WL_REL, st, ex, [source], cfg, events, executor=ex).run()
        evs = st.evaluations(run_id=summary.run_id)
        programs = {p["id"]: p for p in st.programs(summary.run_id)}
    wall = time.monotonic() - t0
    cands = [e for e in evs if programs[e["program_id"]]["source"] != "seed" and e["status"] == "done"]
    provs = [(e.get("result") or {}).get("provenance") or {} for e in evs]
    slot_gpus = {p.get("slot"): p.get("cuda_visible_devices") for p in provs if p.get("slot")}
    own = all(label.endswith(f"[GPU {g}]") for label, g in slot_gpus.items())
    secs = [p["eval_seconds"] for p in provs if p.get("eval_seconds") is not None]
    cached = [bool(p.get("build_cached")) for p in provs if "build_cached" in p]
    per_hour = 3600.0 * len(cands) / wall / len(gpus) if wall > 0 else 0.0
    return {"part": part, "world": world, "backend": backend, "preset": args.preset, "gpus": gpus,
            "slots": ex.slots, "slot_gpus": slot_gpus, "slots_report_own_gpus": own, "state": summary.state,
            "candidates": len(cands), "passed": sum(e["verdict"] == "pass" for e in cands),
            "best_speedup": summary.best_speedup, "wall_s": round(wall, 2), "prebuilds": summary.prebuilds,
            "mean_eval_s": round(sum(secs) / len(secs), 3) if secs else None,
            "build_cache_hit_rate": round(sum(cached) / len(cached), 3) if cached else None,
            "candidates_per_gpu_hour": round(per_hour), "earlier_single_evaluator_per_gpu_hour": earlier_figure(),
            "gpu": provs[0].get("gpu") if provs else None, "badge": "real"}


def table(res: dict[str, Any]) -> str:
    lines = ["# Slot executor on the GPU machine", "",
             f"{res['date']}, {res['machine']}; `benchmarks/executors/gpu_slots.py` (offline search of "
             f"gemm_allgather, {res['source']} knob source, 10 timed iterations, builds overlapped on a CPU pool, the "
             "machine's build cache as it was). Earlier figure: the single evaluator of benchmarks/search/ "
             "(search phase only, every variant built beforehand).", "",
             "| part | GPUs | slots | candidates (passed) | wall s | mean eval s | build cache hits | "
             "candidates per GPU-hour | earlier single evaluator |", "|---|---|---|---|---|---|---|---|---|"]
    for r in res["parts"]:
        lines.append(f"| {r['part']} | {','.join(r['gpus'])} | {r['slots']} | {r['candidates']} ({r['passed']}) | "
                     f"{r['wall_s']} | {r['mean_eval_s']} | {r['build_cache_hit_rate']} | "
                     f"**{r['candidates_per_gpu_hour']}** | {r['earlier_single_evaluator_per_gpu_hour']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or tempfile.mkdtemp(prefix="cuco-gpu-slots-out-"))
    ap.add_argument("--budget-s", type=float, default=200.0)
    ap.add_argument("--parts", default="nccl1,symm4")
    ap.add_argument("--preset", default="4096")
    ap.add_argument("--candidates", type=int, default=24)
    ap.add_argument("--source", choices=["random", "design"], default="random",
                    help="random knob points (no optuna needed) or the design-space source (optuna)")
    ap.add_argument("--gpus", default=None, help="GPU indices (default: all nvidia-smi lists)")
    ap.add_argument("--build-workers", type=int, default=build_workers_default())
    args = ap.parse_args(argv)
    listed = detect_gpu()
    gpus = args.gpus.split(",") if args.gpus else [g["index"] for g in listed]
    if not gpus:
        print("gpu_slots.py: nvidia-smi lists no GPU; run it on a GPU machine", file=sys.stderr)
        return 2
    parts = [p for p in args.parts.split(",") if p]
    t_end = time.monotonic() + args.budget_s
    runs = []
    for i, part in enumerate(parts):
        cap = (t_end - time.monotonic()) / (len(parts) - i)
        print(f"{part}: up to {cap:.0f} s on GPU(s) {','.join(gpus)}", flush=True)
        runs.append(run_part(part, gpus, args, cap))
        print(json.dumps({k: v for k, v in runs[-1].items() if k != "slot_gpus"}), flush=True)
    res = {"date": dt.date.today().isoformat(), "machine": f"{len(listed)} x {listed[0]['name']}" if listed else "?",
           "source": args.source, "parts": runs}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_slots.json").write_text(json.dumps(res, indent=1, sort_keys=True) + "\n")
    (out / "gpu_slots.md").write_text(table(res))
    print(table(res))
    ok = all(r["candidates"] * 2 >= args.candidates and r["slots_report_own_gpus"] for r in runs)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
