"""Executor throughput on a CPU machine: evaluations per second with 1 and with 4 slots, local and on Ray.

  PYTHONPATH=. python3 benchmarks/executors/run.py [--delay 0.4] [--requests 24] [--parts local,ray]

The evaluator is the SIMULATED one with a sleep per evaluation (default 0.4 s, about the mean evaluation time of a
4-rank candidate on the H200 in benchmarks/search/RESULTS.md), so the numbers measure the executor -- how well it
keeps its slots busy -- and nothing about any kernel. For each executor and slot count: the slots are started
and warmed with one evaluation each (not timed), then ``--requests`` requests are submitted at once and timed
until the last result is back. Ray runs a private local cluster on 127.0.0.1 with 4 logical GPUs (no GPU is
used). Writes results.json and RESULTS.md next to this file (``--out`` elsewhere); exit code 0 only when every
executor's 4-slot rate is at least 3x its 1-slot rate.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from cuco_kit.evaluate.api import EvalRequest
from cuco_kit.evaluate.spec import EvaluatorSpec
from cuco_kit.search.ray_executor import ray_executor
from cuco_kit.search.slots import SlotExecutor, local_executor
from cuco_kit.search.synthetic import write_synthetic_workload
from cuco_kit.workload import load_workload

HERE = Path(__file__).resolve().parent
TARGET = 3.0


def _executor(part: str, spec: EvaluatorSpec, slots: int, wl: Path) -> SlotExecutor:
    if part == "local":
        return local_executor(spec, [str(i) for i in range(slots)], 1, "nccl")
    return ray_executor(spec, 1, "nccl", max_slots=slots, workload_dir=str(wl))


def measure(part: str, slots: int, delay: float, n: int, wl: Path) -> dict[str, Any]:
    spec = EvaluatorSpec("simulated", {"seed": 0, "delay_s": delay, "check_l0": False})
    w = load_workload(wl)
    code = w.path(w.baseline).read_text()
    t0 = time.monotonic()
    ex = _executor(part, spec, slots, wl)
    started = time.monotonic() - t0
    try:
        warm = [ex.submit(EvalRequest(code, str(wl), label=f"warm {i}")) for i in range(ex.slots)]
        for f in warm:
            f.result()
        t1 = time.monotonic()
        futures = [ex.submit(EvalRequest(code, str(wl), label=f"r{i}")) for i in range(n)]
        results = [f.result() for f in futures]
        wall = time.monotonic() - t1
    finally:
        ex.shutdown()
    per_slot = {}
    for r in results:
        per_slot[r.provenance.get("slot", "?")] = per_slot.get(r.provenance.get("slot", "?"), 0) + 1
    return {"executor": part, "slots": ex.slots, "requests": n, "delay_s": delay, "wall_s": round(wall, 3),
            "evaluations_per_s": round(n / wall, 3), "start_s": round(started, 2),
            "passed": sum(r.passed for r in results), "per_slot": per_slot}


def table(result: dict[str, Any]) -> str:
    lines = ["# Executor throughput (SIMULATED evaluator, CPU machine)", "",
             f"{result['date']}, {result['machine']}; a sleep of {result['delay_s']} s per evaluation stands for the "
             "GPU's work (about the mean 4-rank evaluation on the H200, benchmarks/search/RESULTS.md); every number "
             "below measures the executor, not a kernel. Command: `PYTHONPATH=. python3 benchmarks/executors/run.py`.",
             "", "| executor | slots | requests | wall s | evaluations/s | x 1 slot | slot start s |",
             "|---|---|---|---|---|---|---|"]
    for r in result["runs"]:
        base = next(b for b in result["runs"] if b["executor"] == r["executor"] and b["slots"] == 1)
        lines.append(f"| {r['executor']} | {r['slots']} | {r['requests']} | {r['wall_s']:.2f} | "
                     f"{r['evaluations_per_s']:.2f} | {r['evaluations_per_s'] / base['evaluations_per_s']:.2f} | "
                     f"{r['start_s']:.1f} |")
    lines += ["", "Done when: 4 slots give at least 3x the evaluations per second of 1 slot, for each executor: "
              + ("**held**" if result["ok"] else "**NOT held**") + "."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--delay", type=float, default=0.4, help="seconds of simulated GPU work per evaluation")
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--slots", default="1,4")
    ap.add_argument("--parts", default="local,ray")
    ap.add_argument("--out", default=str(HERE))
    args = ap.parse_args(argv)
    wl = write_synthetic_workload(Path(tempfile.mkdtemp(prefix="cuco-exec-bench-")) / "synthetic")
    runs: list[dict[str, Any]] = []
    for part in args.parts.split(","):
        if part == "ray":
            import ray  # noqa: PLC0415 - only for the Ray part

            ray.init(num_cpus=6, num_gpus=4, include_dashboard=False, _node_ip_address="127.0.0.1",
                     log_to_driver=False)
        try:
            for n in (int(s) for s in args.slots.split(",")):
                r = measure(part, n, args.delay, args.requests, wl)
                print(f"{part:5s} {r['slots']} slot(s): {r['evaluations_per_s']:.2f} evaluations/s "
                      f"({r['requests']} in {r['wall_s']:.2f} s; {r['per_slot']})", flush=True)
                runs.append(r)
        finally:
            if part == "ray":
                ray.shutdown()
    ratios = {}
    for part in {r["executor"] for r in runs}:
        rate = {r["slots"]: r["evaluations_per_s"] for r in runs if r["executor"] == part}
        if 1 in rate and 4 in rate:
            ratios[part] = round(rate[4] / rate[1], 2)
    result = {"date": dt.date.today().isoformat(), "machine": f"{os.cpu_count()} CPU cores, {platform.machine()}",
              "delay_s": args.delay, "runs": runs, "ratio_4_to_1": ratios, "target": TARGET,
              "ok": bool(ratios) and all(v >= TARGET for v in ratios.values()),
              "badge": "simulated"}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    (out / "RESULTS.md").write_text(table(result))
    print(table(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
