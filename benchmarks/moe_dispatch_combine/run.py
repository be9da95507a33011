"""MoE dispatch -> expert GEMMs -> combine on one GPU machine, in one command: L2 of every seed and knob value, then
the benchmark table and the expert-compute check.

  PYTHONPATH=. python3 benchmarks/moe_dispatch_combine/run.py --out DIR [--smoke] [--budget-s 480]

1. L2 (4 fresh-input trials) at the small preset, uniform routing and 5:1 skew, bf16 and block-scaled e4m3
   dispatch (FP8=1), world size 1 (nccl) and 2 and 4 ranks (symm + compat): both seeds and a covering set of
   device_lsa.cu variants (every enum combination, the integer knobs cycling, so every value of every knob runs).
2. Benchmark at DeepSeek-V3 expert shapes with 32 experts (dsv3_e32: T 4096, H 7168, I 2048, top-8), uniform and
   5:1 skew, and uniform with 8-bit dispatch, world size 1 (nccl) and 4 ranks (symm). The time is the slowest
   rank's (the harness's), never a token-weighted mean: under skew the hot experts' rank sets it.
3. Expert compute alone: the summed duration of the cuBLAS kernels in one profiled iteration of the world-1 run
   (the nccl seed and every variant: the same GEMMs) against torch's bf16 expert GEMMs on the SAME per-expert
   row counts (one routing draw of the workload's own generator), as the better of torch._grouped_mm and one
   torch.matmul per expert, also summed over the profiler's GEMM kernels. The bar: ours >= 60% of torch.
Counts first: FLOPs per layer = 2 * rows * (H*2I + I*H) with rows = T*K over the world; bytes each rank sends in
dispatch = its rows bound for other ranks * H * 2 (bf16), the same again in combine.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

# Run by path, not installed: benchmarks/ (common) goes first on sys.path; common adds the repository root.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import (
    GEMM_KERNEL,
    TIMING_PRELUDE,
    SampleBench,
    base_args,
    bench_table,
    header,
    l2_table,
    matching_us,
    median_or_none,
    torch_child,
)

SAMPLE = "moe_dispatch_combine"
L2_PRESETS = ("small", "small_skew5", "small_fp8", "small_skew5_fp8")
BENCH = [("dsv3_e32", {}, "dsv3_e32"), ("dsv3_e32", {"SKEW": 500}, "dsv3_e32_skew5"),
         ("dsv3_e32_fp8", {}, "dsv3_e32_fp8")]

TORCH_EXPERTS = TIMING_PRELUDE + r"""
sys.path.insert(0, "sample_kernels/moe_dispatch_combine")
import workload as W
params = json.loads(sys.argv[1]); iters = int(sys.argv[2])
g = torch.Generator(device="cuda"); g.manual_seed(0)
inp = W.make_inputs(params, 1, 0, g)
E, H, I = params["E"], params["H"], params["I"]
idx = inp["topk_idx"][inp["topk_idx"] >= 0].long()
counts = torch.bincount(idx, minlength=E)
rows = int(counts.sum())
x = torch.randn(rows, H, device="cuda", generator=g).to(torch.bfloat16)
a = torch.randn(rows, I, device="cuda", generator=g).to(torch.bfloat16)
wgu, wd = inp["w_gate_up"], inp["w_down"]
offs = torch.cumsum(counts, 0).to(torch.int32)
bounds = [0] + offs.tolist()
def per_expert():
    for e in range(E):
        s, t = bounds[e], bounds[e + 1]
        if t > s:
            torch.matmul(x[s:t], wgu[e]); torch.matmul(a[s:t], wd[e])
def grouped():
    torch._grouped_mm(x, wgu, offs=offs); torch._grouped_mm(a, wd, offs=offs)
def refresh():
    x.normal_(generator=g); a.normal_(generator=g)
out = {"rows": rows, "counts_min": int(counts.min()), "counts_max": int(counts.max()),
       "flops": 2.0 * rows * (H * 2 * I + I * H)}
for name, fn in (("per_expert", per_expert), ("grouped_mm", grouped)):
    try:
        out[name] = {"event_ms": time_it(fn, refresh, iters),
                     "gemm_kernel_us": kernel_us(fn, refresh, iters, r"gemm|nvjet|xmma|cutlass")}
    except Exception as exc:
        out[name] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
print(json.dumps(out))
"""


def main() -> int:
    args = base_args(__doc__.splitlines()[0], Path(__file__).parent / "out").parse_args()
    b = SampleBench(SAMPLE, args)
    labels = b.bench_labels(label for _, _, label in BENCH)
    bench = [x for x in BENCH if x[2] in labels]
    try:
        b.prebuild()
        if not args.skip_l2:
            b.l2(L2_PRESETS)
        if not args.smoke and not args.skip_bench:
            for preset, params, label in bench:
                for world in (w for w in (1, 4) if w in b.worlds):
                    b.bench(preset, world, params, label, timeline=(world == 1))
    finally:
        b.close()
    refs = {}
    if not args.smoke and not args.skip_bench and 1 in b.worlds:
        for preset, params, label in bench:
            p = {**b.wl.size_presets[preset], **params}
            refs[label] = torch_child(TORCH_EXPERTS, json.dumps(p), args.iters)
    return b.finish({"torch_experts": refs}, make_table(b, refs))


def make_table(b: SampleBench, refs: dict) -> str:
    lines = header(b.meta(), "MoE dispatch -> expert GEMMs -> combine") + l2_table(b.rows)
    for _, _, label in BENCH:
        lines += [f"## {label}", ""]
        ref = refs.get(label, {})
        torch_us = [v["gemm_kernel_us"] for k, v in ref.items() if isinstance(v, dict) and "gemm_kernel_us" in v]
        ours = median_or_none(matching_us(r, GEMM_KERNEL) for r in b.rows
                              if r["phase"] == "bench" and r["preset"] == label and r["world"] == 1
                              and r["name"] != "seed_copy.cu")
        if torch_us and ours:
            best = min(torch_us)
            lines += [f"Expert compute alone (world 1, GEMM kernels of one profiled iteration, median over the runs): "
                      f"ours {ours / 1000:.4f} ms; torch's best bf16 expert GEMMs on the same {ref['rows']} rows "
                      f"(per-expert rows {ref['counts_min']}-{ref['counts_max']}) {best / 1000:.4f} ms; ours reaches "
                      f"{best / ours:.0%} of torch ({ref['flops'] / ours / 1e6:.0f} TFLOP/s). torch: "
                      + "; ".join(f"{k} {v['gemm_kernel_us'] / 1000:.4f} ms kernels, {v['event_ms']:.4f} ms events"
                                  for k, v in ref.items() if isinstance(v, dict) and "gemm_kernel_us" in v), ""]
        elif ref:
            torch_txt = "; ".join(f"{k} {v['gemm_kernel_us'] / 1000:.4f} ms kernels" if "gemm_kernel_us" in v
                                  else f"{k} {v.get('error', v)}" for k, v in ref.items() if isinstance(v, dict))
            lines += ["Expert compute check not computed: " + (
                "no profiled world-1 row of ours at this preset" if not ours else "torch reference missing") +
                f". torch on {ref.get('rows')} rows (per-expert {ref.get('counts_min')}-{ref.get('counts_max')}): "
                f"{torch_txt or ref}", ""]
        for world in (1, 4):
            lines += bench_table(b.rows, label, world)
    if b.skipped:
        lines += ["Skipped (budget): " + "; ".join(b.skipped), ""]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
