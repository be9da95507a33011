"""Launch bias of the harness's timing, in one command: at world size 1, cublas_alone.cu (one cublasGemmEx per step,
benchmarks/gemm_allgather/) under the harness against torch.matmul timed the same way in the same run, at
M = N = K = 1024, 2048, 4096 and 8192.

"The same way" is the harness's device timing (docs/timing.md): cold L2 (the 256 MB flush), fresh inputs, the
stream held by the harness's own blocking kernel (libcuco_harness.so: cuco_h_hold / cuco_h_release) while the
host enqueues start event, the product and end event, then released; the events give the device time. The torch
side runs in a child process (this process never creates a CUDA context; the rank worker owns the GPU) with the
same helper library, and also reports its time without the hold, as the harness's end-to-end time does. One
more profiled step on each side gives the product's own kernel time (us), which says whether a gap is the
kernel cuBLAS picked or the timing around it.

Writes <out>/launch_bias.json (raw: every iteration, GPU, driver, NCCL, torch, git revision, date) and
<out>/launch_bias.md (the table), default benchmarks/harness/. Exit code 0 when every size is within --bar.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

# Run by path, not installed: the repository root (the kit) and benchmarks/ (common) go first on sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import GEMM_KERNEL, torch_child

from cuco_kit.evaluate.api import EvalRequest
from cuco_kit.evaluate.build import build_helpers
from cuco_kit.evaluate.device import detect_gpu, git_revision
from cuco_kit.evaluate.gpu_evaluator import EvaluatorConfig, GpuEvaluator
from cuco_kit.evaluate.stats import FLUSH_BYTES

ROOT = Path(__file__).resolve().parents[2]
WL = ROOT / "sample_kernels" / "gemm_allgather"
CUBLAS_ALONE = ROOT / "benchmarks" / "gemm_allgather" / "cublas_alone.cu"
SIZES = (1024, 2048, 4096, 8192)
BAR = 0.03  # |harness / torch - 1| at most this at every size

# The torch side: the harness's hold around torch.matmul, plus the same product without the hold.
TORCH_HELD = f"""
import ctypes, json, re, statistics, sys, torch
from torch.profiler import ProfilerActivity, profile
torch.cuda.set_device(0)
helpers = ctypes.CDLL(sys.argv[1])
helpers.cuco_h_hold.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_void_p]
helpers.cuco_h_release.argtypes = [ctypes.c_void_p, ctypes.c_uint64]
iters, warmup = int(sys.argv[2]), int(sys.argv[3])
sizes = [int(s) for s in sys.argv[4:]]
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

out = {{}}
for n in sizes:
    g = torch.Generator(device="cuda"); g.manual_seed(n)
    x = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    w = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    y = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(warmup):
        once(x, w, y, g, True)
    held, e2e = [], []
    for _ in range(iters):
        held.append(once(x, w, y, g, True))
        e2e.append(once(x, w, y, g, False))
    with profile(activities=[ProfilerActivity.CUDA]) as prof:  # one more held product: its kernels
        once(x, w, y, g, True)
    kernels = {{}}
    for e in prof.events():
        if str(getattr(e, "device_type", "")).endswith("CUDA") and e.time_range is not None and re.search(
                {GEMM_KERNEL.pattern!r}, e.name, re.IGNORECASE):
            kernels[e.name] = kernels.get(e.name, 0.0) + e.time_range.end - e.time_range.start
    out[str(n)] = {{"device_ms": held, "e2e_ms": e2e, "kernels_us": kernels}}
print(json.dumps({{"sizes": out, "hold_timed_out": int(timed_out[0]), "torch": torch.__version__}}))
"""


def harness_row(ev: GpuEvaluator, n: int, iters: int, warmup: int) -> dict[str, Any]:
    req = EvalRequest(candidate_code=CUBLAS_ALONE.read_text(), workload_dir=str(WL),
                      params={"M": n, "N": n, "K": n}, world_size=1, backend="nccl", iters=iters, warmup=warmup,
                      trials=1, measure_seed=False, timeline=True, label=f"cublas_alone-{n}")
    res = ev.evaluate(req)
    timing = res.timing or {}
    dev, e2e = timing.get("device") or {}, timing.get("end_to_end") or {}
    kernels: dict[str, float] = {}
    for r in res.timeline or []:  # one profiled (held) step: the product's kernels, not the harness's own
        if GEMM_KERNEL.search(r["name"]):
            kernels[r["name"]] = kernels.get(r["name"], 0.0) + r["dur_us"]
    return {"verdict": res.verdict, "reason": res.reason[:300], "score": timing.get("score"), "kernels_us": kernels,
            "device_ms": dev.get("iteration_ms"), "e2e_ms": e2e.get("iteration_ms"),
            "device_median_ms": dev.get("median_ms"), "e2e_median_ms": e2e.get("median_ms"),
            "notes": res.provenance.get("notes", []), "nccl": res.provenance.get("nccl"),
            "driver": res.provenance.get("driver"), "gpu": res.provenance.get("gpu")}


def table(meta: dict[str, Any], rows: list[dict[str, Any]], bar: float) -> str:
    lines = [f"# Launch bias of the harness's timing on one {meta['gpu']} ({meta['date']})", "",
             f"GPU {meta['gpu']}, driver {meta['driver']}, NCCL {meta['nccl']}, torch {meta['torch']}, git "
             f"{meta['git']}. World size 1: `cublas_alone.cu` under the harness (device time: the stream held while "
             "the host enqueues the step, then released) against `torch.matmul` timed the same way in the same run "
             f"(bf16, M = N = K; median of {meta['iters']} iterations each, cold L2, fresh inputs). End to end: the "
             "same without the hold (host launches included). Bar: within "
             f"{bar:.0%}.", "",
             "| M=N=K | harness device (ms) | torch device (ms) | harness / torch | within bar | harness end to end "
             "(ms) | torch end to end (ms) | harness kernels (us) | torch kernels (us) |",
             "| ---: | ---: | ---: | ---: | :---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        def ms(v: float | None) -> str:
            return "-" if v is None else f"{v:.4f}"

        def us(v: float | None) -> str:
            return "-" if v is None else f"{v:.1f}"
        ratio = r.get("ratio")
        lines.append(f"| {r['n']} | {ms(r['harness_device_ms'])} | {ms(r['torch_device_ms'])} | "
                     f"{'-' if ratio is None else f'{ratio:.3f}'} | {'yes' if r['ok'] else 'NO'} | "
                     f"{ms(r['harness_e2e_ms'])} | {ms(r['torch_e2e_ms'])} | {us(r['harness_kernels_us'])} | "
                     f"{us(r['torch_kernels_us'])} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).parent), help="folder for launch_bias.json and .md")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
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
    rows: list[dict[str, Any]] = []
    torch_raw: dict[str, Any] = {}
    try:
        for n in args.sizes:  # the harness and torch at each size in turn, in the same run
            h = harness_row(ev, n, args.iters, args.warmup)
            t = torch_child(TORCH_HELD, helpers, args.iters, args.warmup, n)
            torch_raw[str(n)] = t
            td = (t.get("sizes") or {}).get(str(n)) or {}
            tdev = statistics.median(td["device_ms"]) if td.get("device_ms") else None
            te2e = statistics.median(td["e2e_ms"]) if td.get("e2e_ms") else None
            hdev = h["device_median_ms"]
            ratio = hdev / tdev if hdev and tdev else None
            rows.append({"n": n, "harness_device_ms": hdev, "torch_device_ms": tdev, "ratio": ratio,
                         "ok": ratio is not None and abs(ratio - 1.0) <= args.bar, "harness_e2e_ms": h["e2e_median_ms"],
                         "torch_e2e_ms": te2e, "harness": h, "torch_error": t.get("error"),
                         "harness_kernels_us": sum(h["kernels_us"].values()) if h["kernels_us"] else None,
                         "torch_kernels_us": sum(td["kernels_us"].values()) if td.get("kernels_us") else None})
            print(f"launch_bias: {n}: harness {hdev} ms, torch {tdev} ms, ratio {ratio}", flush=True)
    finally:
        ev.close()
    first = next((r["harness"] for r in rows if r["harness"].get("gpu")), {})
    meta = {"gpu": gpus[0]["name"], "driver": gpus[0].get("driver_version"), "nccl": first.get("nccl"),
            "torch": next((t.get("torch") for t in torch_raw.values() if t.get("torch")), None),
            "git": git_revision(), "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "iters": args.iters, "warmup": args.warmup, "bar": args.bar, "wall_s": round(time.monotonic() - t0, 1)}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "launch_bias.json").write_text(json.dumps({"meta": meta, "rows": rows, "torch_raw": torch_raw}, indent=1))
    text = table(meta, rows, args.bar)
    (out / "launch_bias.md").write_text(text)
    print(text)
    return 0 if rows and all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
