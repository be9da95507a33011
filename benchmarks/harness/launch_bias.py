"""Launch bias of the harness's timing, in one command: at world size 1, cublas_alone.cu (one cublasGemmEx per step,
benchmarks/gemm_allgather/) under the harness against torch.matmul timed the same way in the same run, at
M = N = K = 1024, 2048, 4096 and 8192 (the harness at every size, then torch at every size in one child: each
side is judged against itself first, so the two need not alternate).

"The same way" is the harness's device timing (docs/timing.md): cold L2 (the 256 MB flush), fresh inputs, the
stream held by the harness's own blocking kernel (libcuco_harness.so: cuco_h_hold / cuco_h_release) while the
host enqueues start event, the product and end event, then released; the events give the device time. The torch
side runs in a child process (this process never creates a CUDA context; the rank worker owns the GPU) with the
same helper library, and also reports its time without the hold, as the harness's end-to-end time does.

What is compared (bias_check.py). Each side is judged against ITSELF first: its median held device time over
the median time of its own product in its own profiled timeline (--profiled more held steps per side, each under
a profiler of its own; the product is every kernel the step ran after the harness's hold and barrier kernels,
first start to last end). That ratio is the side's bias: what the timing adds around the work. Then the
harness's bias is compared with torch's, with a bootstrap interval (cuco_kit.evaluate.stats, each side's timed
and profiled samples resampled on their own); a size fails only when that interval lies entirely outside
1 +- --bar. Comparing the two device times directly (the check before this one) compared a precise number with a
noisy one and one cuBLAS kernel with another: cuBLAS and torch may pick different kernels for the same product.

What this can hide:
  - anything the two sides share: both time with the same hold and the same CUDA events, so the overhead of the
    method itself (event timestamps, the first launch after the release: a few us, a large share at 1024) is in
    both biases and cancels. The absolute biases are in the table; the check says the harness adds nothing that
    torch held the same way does not;
  - a harness that slows the product itself (a concurrent kernel, a warmer or colder cache than torch's): the
    product's own time grows with the device time, so the bias stays. The product times of both sides are in the
    table beside each other, unasserted (the kernels may differ);
  - a small bias under a wide interval: passing means "not shown to be outside +-bar", and the interval says how
    sure; more --iters and --profiled narrow it;
  - the profiled steps are other iterations than the timed ones (unpaired), under a profiler: drift between them
    widens the interval rather than moving it.
How it still catches a harness that adds time to the step: whatever the harness puts between its start and end
events (host launches, as before the hold: 50.5 us of device time around a 6.6 us kernel at 1024; a
synchronisation, a barrier, a flush inside the window) is in the harness's device time and not in its product's
time, while torch's bias stays where the method puts it, so harness bias / torch bias moves above 1 by that time
over the product's (a host-launch window: several times 1; 1 us at 1024: about +15%) and the interval with it.

Writes <out>/launch_bias.json (raw: every timed iteration, every profiled step's kernels, GPU, driver, NCCL, torch,
git revision, date) and <out>/launch_bias.md (the table with the intervals), default benchmarks/harness/. Exit
code 0 when no size's interval lies outside --bar.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# Run by path, not installed: the repository root (the kit), benchmarks/ (common) and this folder (bias_check) go
# first on sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bias_check import compare, steps_of
from common import GEMM_KERNEL, torch_child

from cuco_kit.evaluate.api import EvalRequest
from cuco_kit.evaluate.build import build_helpers
from cuco_kit.evaluate.device import detect_gpu, git_revision
from cuco_kit.evaluate.gpu_evaluator import EvaluatorConfig, GpuEvaluator
from cuco_kit.evaluate.stats import CI_LEVEL, FLUSH_BYTES

ROOT = Path(__file__).resolve().parents[2]
WL = ROOT / "sample_kernels" / "gemm_allgather"
CUBLAS_ALONE = ROOT / "benchmarks" / "gemm_allgather" / "cublas_alone.cu"
SIZES = (1024, 2048, 4096, 8192)
BAR = 0.03  # harness bias / torch bias: a size fails when its whole interval lies outside 1 +- BAR

# The torch side: the harness's hold around torch.matmul, the same product without the hold, and more held
# products each under a profiler of its own (their kernels, rows as the harness's kernel_rows gives them).
TORCH_HELD = f"""
import ctypes, json, sys, torch
from torch.profiler import ProfilerActivity, profile
torch.cuda.set_device(0)
helpers = ctypes.CDLL(sys.argv[1])
helpers.cuco_h_hold.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_void_p]
helpers.cuco_h_release.argtypes = [ctypes.c_void_p, ctypes.c_uint64]
iters, warmup, profiled = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
sizes = [int(s) for s in sys.argv[5:]]
FLUSH = torch.empty({FLUSH_BYTES}, dtype=torch.uint8, device="cuda")  # the harness's L2 flush
word = torch.zeros(1, dtype=torch.int64).pin_memory()
timed_out = torch.zeros(1, dtype=torch.int32).pin_memory()
stream = torch.cuda.Stream()
epoch = 0

def once(x, w, y, g, held):
    global epoch
    with torch.cuda.stream(stream):
        x.normal_(generator=g); w.normal_(generator=g); FLUSH.fill_(epoch & 0xFF)
    stream.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    epoch += 1
    if held:
        helpers.cuco_h_hold(word.data_ptr(), epoch, int(5e8), timed_out.data_ptr(), stream.cuda_stream)
    with torch.cuda.stream(stream):
        a.record(stream); torch.matmul(x, w, out=y); b.record(stream)
    if held:
        helpers.cuco_h_release(word.data_ptr(), epoch)
    b.synchronize()
    return a.elapsed_time(b)

def kernel_rows(prof):
    return [{{"name": e.name, "start_us": e.time_range.start, "dur_us": e.time_range.end - e.time_range.start}}
            for e in prof.events()
            if str(getattr(e, "device_type", "")).rsplit(".", 1)[-1] == "CUDA" and e.time_range is not None]

out = {{}}
for n in sizes:
    g = torch.Generator(device="cuda"); g.manual_seed(n)
    x = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    w = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    y = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    torch.matmul(x, w, out=y)  # cuBLAS's first call at a size (handle, workspace, heuristics) outside any hold
    torch.cuda.synchronize()
    for _ in range(warmup):
        once(x, w, y, g, True)
    timed_out.zero_()  # a stall in the warm-up says nothing of the measured steps: the flag covers those only
    held, e2e = [], []
    for _ in range(iters):
        held.append(once(x, w, y, g, True))
        e2e.append(once(x, w, y, g, False))
    steps = []
    for _ in range(profiled):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            once(x, w, y, g, True)
        steps.append(kernel_rows(prof))
    out[str(n)] = {{"device_ms": held, "e2e_ms": e2e, "steps": steps, "hold_timed_out": int(timed_out[0])}}
print(json.dumps({{"sizes": out, "hold_timed_out": max(s["hold_timed_out"] for s in out.values()),
                  "torch": torch.__version__}}))
"""


def harness_side(ev: GpuEvaluator, n: int, iters: int, warmup: int, profiled: int) -> dict[str, Any]:
    req = EvalRequest(candidate_code=CUBLAS_ALONE.read_text(), workload_dir=str(WL),
                      params={"M": n, "N": n, "K": n}, world_size=1, backend="nccl", iters=iters, warmup=warmup,
                      trials=1, measure_seed=False, timeline=True, timeline_iters=profiled,
                      label=f"cublas_alone-{n}")
    res = ev.evaluate(req)
    timing = res.timing or {}
    dev, e2e = timing.get("device") or {}, timing.get("end_to_end") or {}
    return {"verdict": res.verdict, "reason": res.reason[:300], "score": timing.get("score"),
            "device_ms": dev.get("iteration_ms"), "e2e_ms": e2e.get("iteration_ms"),
            "device_median_ms": dev.get("median_ms"), "e2e_median_ms": e2e.get("median_ms"),
            "steps": steps_of(res.timeline or []), "notes": res.provenance.get("notes", []),
            "nccl": res.provenance.get("nccl"), "driver": res.provenance.get("driver"),
            "gpu": res.provenance.get("gpu")}


def gemm_us(steps: Sequence[Sequence[Mapping[str, Any]]]) -> float | None:
    """Median over profiled steps of the summed time of the cuBLAS kernels (GEMM_KERNEL) in each: which kernel
    each side ran, for the reader (the check uses the whole product, bias_check.product_us)."""
    per_step = [sum(float(r["dur_us"]) for r in s if GEMM_KERNEL.search(str(r["name"]))) for s in steps]
    per_step = [x for x in per_step if x > 0]
    return statistics.median(per_step) if per_step else None


def median_or_none(xs: Sequence[float] | None) -> float | None:
    return statistics.median(xs) if xs else None


def size_row(n: int, h: dict[str, Any], t: dict[str, Any], bar: float) -> dict[str, Any]:
    """One size: both sides' raw numbers, their biases and the comparison (bias_check.compare)."""
    td = (t.get("sizes") or {}).get(str(n)) or {}
    cmp = compare(h["device_ms"], h["steps"], td.get("device_ms"), td.get("steps") or [], bar)
    hdev, tdev = h["device_median_ms"], median_or_none(td.get("device_ms"))
    return {"n": n, **cmp, "harness_run": h, "torch_run": td, "torch_error": t.get("error"),
            "torch_hold_timed_out": td.get("hold_timed_out"),  # a stall in this size's timed or profiled steps
            "harness_device_ms": hdev, "torch_device_ms": tdev,
            "device_ratio": hdev / tdev if hdev and tdev else None,
            "harness_e2e_ms": h["e2e_median_ms"], "torch_e2e_ms": median_or_none(td.get("e2e_ms")),
            "harness_gemm_us": gemm_us(h["steps"]), "torch_gemm_us": gemm_us(td.get("steps") or []),
            "harness_gemm_kernels": sorted({r["name"] for s in h["steps"] for r in s if GEMM_KERNEL.search(r["name"])}),
            "torch_gemm_kernels": sorted({r["name"] for s in td.get("steps") or [] for r in s
                                          if GEMM_KERNEL.search(r["name"])})}


def table(meta: dict[str, Any], rows: list[dict[str, Any]], bar: float) -> str:
    def num(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    def with_ci(v: float | None, ci: Sequence[float] | None) -> str:
        return num(v, ".3f") + ("" if not ci else f" [{ci[0]:.3f}, {ci[1]:.3f}]")

    lines = [f"# Launch bias of the harness's timing on one {meta['gpu']} ({meta['date']})", "",
             f"GPU {meta['gpu']}, driver {meta['driver']}, NCCL {meta['nccl']}, torch {meta['torch']}, git "
             f"{meta['git']}. World size 1: `cublas_alone.cu` under the harness against `torch.matmul` held the "
             "same way in the same run (bf16, M = N = K; cold L2, fresh inputs). Device time: the median of "
             f"{meta['iters']} held iterations (the stream held while the host enqueues the step). Product: the "
             f"median over {meta['profiled']} more held steps, each profiled on its own, of the time from the first "
             "kernel after the harness's hold (and barrier) to the end of the last one. Bias: device time / product "
             f"time, per side; [{CI_LEVEL:.0%} bootstrap interval]. The check: harness bias / torch bias fails only "
             f"when its whole interval lies outside 1 +- {bar:g} (launch_bias.py says what this can hide). End to "
             "end: the same step without the hold (host launches included). cuBLAS kernels: the GEMM kernels' own "
             "time, which may differ between the sides.", "",
             "| M=N=K | harness device (ms) | harness product (us) | harness bias | torch device (ms) | torch product "
             "(us) | torch bias | harness bias / torch bias | check | device harness / torch | end to end harness / "
             "torch (ms) | cuBLAS kernels harness / torch (us) |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | :---: | ---: | ---: | ---: |"]
    for r in rows:
        h, t = r["harness"], r["torch"]
        lines.append(
            f"| {r['n']} | {num(r['harness_device_ms'], '.4f')} | {num(h['product_median_us'], '.1f')} | "
            f"{with_ci(h['bias'], h['bias_ci'])} | {num(r['torch_device_ms'], '.4f')} | "
            f"{num(t['product_median_us'], '.1f')} | {with_ci(t['bias'], t['bias_ci'])} | "
            f"{with_ci(r['bias_ratio'], r['bias_ratio_ci'])} | {'pass' if r['ok'] else 'FAIL'} | "
            f"{num(r['device_ratio'], '.3f')} | {num(r['harness_e2e_ms'], '.4f')} / {num(r['torch_e2e_ms'], '.4f')} | "
            f"{num(r['harness_gemm_us'], '.1f')} / {num(r['torch_gemm_us'], '.1f')} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).parent), help="folder for launch_bias.json and .md")
    ap.add_argument("--iters", type=int, default=30, help="timed held iterations per side and size")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--profiled", type=int, default=20, help="profiled held steps per side and size")
    ap.add_argument("--bar", type=float, default=BAR)
    ap.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    args = ap.parse_args(argv)
    gpus = detect_gpu()
    if not gpus:
        print("launch_bias: no GPU (nvidia-smi lists none)")
        return 2
    t0 = time.monotonic()
    cfg = EvaluatorConfig()
    ev = GpuEvaluator(cfg)
    helpers = build_helpers(cfg.cache_dir, cfg.build)
    try:
        runs = {n: harness_side(ev, n, args.iters, args.warmup, args.profiled) for n in args.sizes}
    finally:
        ev.close()  # torch gets the GPU to itself
    t = torch_child(TORCH_HELD, helpers, args.iters, args.warmup, args.profiled, *args.sizes)
    rows = [size_row(n, runs[n], t, args.bar) for n in args.sizes]
    for row in rows:
        print(f"launch_bias: {row['n']}: harness bias {row['harness']['bias']}, torch bias {row['torch']['bias']}, "
              f"ratio {row['bias_ratio']} {row['bias_ratio_ci']} {'pass' if row['ok'] else 'FAIL'}", flush=True)
    first = next((r["harness_run"] for r in rows if r["harness_run"].get("gpu")), {})
    meta = {"gpu": gpus[0]["name"], "driver": gpus[0].get("driver_version"), "nccl": first.get("nccl"),
            "torch": t.get("torch"), "git": git_revision(),
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "iters": args.iters,
            "warmup": args.warmup, "profiled": args.profiled, "bar": args.bar, "ci_level": CI_LEVEL,
            "wall_s": round(time.monotonic() - t0, 1)}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "launch_bias.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    text = table(meta, rows, args.bar)
    (out / "launch_bias.md").write_text(text)
    print(text)
    return 0 if rows and all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
