"""KV-cache transfer (prefill -> decode, layer by layer) on one GPU machine, in one command: L2 of every seed and knob
value, contiguous and paged, then the benchmark table against the per-layer compute alone.

  PYTHONPATH=. python3 benchmarks/kv_transfer/run.py --out DIR [--smoke] [--budget-s 480] [--worlds 1,2]

1. L2 (4 fresh-input trials) at the small presets (contiguous and paged, page 16), world size 1 (nccl: the
   transfer is a local copy) and 2 ranks (symm + compat: rank 0 prefill, rank 1 decode).
2. Benchmark at the default (L 8, S 2048, D 4096, KVD 512) and its paged form: world size 1 and 2.
3. The bound the overlap races: the per-layer compute alone, L GEMMs [S, D] x [D, 2*KVD] in bf16, timed by torch
   in a child (events, cold L2, median; and the profiler's GEMM kernel time), next to the summed duration of our
   cuBLAS kernels in one profiled world-1 iteration. A transfer fully hidden behind compute costs no more than
   that bound; the table gives every variant's time as a multiple of it.
Counts first: FLOPs on the prefill rank = 2*L*S*D*2*KVD; bytes each decode rank receives = L*S*2*KVD*2.
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

SAMPLE = "kv_transfer"
L2_PRESETS = ("small", "small_paged")
BENCH_PRESETS = ("default", "default_paged")

TORCH_LAYERS = TIMING_PRELUDE + r"""
p = json.loads(sys.argv[1]); iters = int(sys.argv[2])
L, S, D, KVD = p["L"], p["S"], p["D"], p["KVD"]
g = torch.Generator(device="cuda"); g.manual_seed(0)
h = torch.randn(S, D, device="cuda", generator=g).to(torch.bfloat16)
w = (torch.randn(L, D, 2 * KVD, device="cuda", generator=g) / D ** 0.5).to(torch.bfloat16)
def refresh():
    h.normal_(generator=g)
def fn():
    for l in range(L):
        torch.matmul(h, w[l])
print(json.dumps({"event_ms": time_it(fn, refresh, iters),
                  "gemm_kernel_us": kernel_us(fn, refresh, iters, r"gemm|nvjet|xmma|cutlass"),
                  "flops": 2.0 * L * S * D * 2 * KVD}))
"""


def main() -> int:
    ap = base_args(__doc__.splitlines()[0], Path(__file__).parent / "out")
    ap.set_defaults(worlds="1,2")
    args = ap.parse_args()
    b = SampleBench(SAMPLE, args)
    full = not args.smoke and not args.skip_bench
    bench = b.bench_labels(BENCH_PRESETS)
    try:
        b.prebuild()
        if not args.skip_l2:
            b.l2(L2_PRESETS)
        if full:
            for preset in bench:
                for world in (w for w in (1, 2) if w in b.worlds):
                    b.bench(preset, world, timeline=(world == 1))
    finally:
        b.close()
    refs = {p: torch_child(TORCH_LAYERS, json.dumps(b.wl.size_presets[p]), args.iters) for p in bench} \
        if full else {}
    return b.finish({"torch_layer_gemms": refs}, make_table(b, refs))


def make_table(b: SampleBench, refs: dict) -> str:
    lines = header(b.meta(), "KV-cache transfer, prefill -> decode") + l2_table(b.rows)
    for preset in BENCH_PRESETS:
        ref = refs.get(preset, {})
        bound = ref.get("event_ms")
        ours = median_or_none(matching_us(r, GEMM_KERNEL) for r in b.rows
                              if r["phase"] == "bench" and r["preset"] == preset and r["world"] == 1)
        lines += [f"## {preset}", ""]
        if bound:
            lines += [f"Per-layer compute alone (the bound): torch, L GEMMs, {bound:.4f} ms by events "
                      f"({ref['gemm_kernel_us'] / 1000:.4f} ms of GEMM kernels, "
                      f"{ref['flops'] / ref['gemm_kernel_us'] / 1e6:.0f} TFLOP/s)"
                      + (f"; our cuBLAS kernels in one profiled world-1 iteration {ours / 1000:.4f} ms" if ours
                         else "") + ".", ""]
        elif ref:
            lines += [f"Compute bound not measured: {ref.get('error', ref)}", ""]
        for world in (1, 2):
            lines += bench_table(b.rows, preset, world, bound, "compute alone")
    if b.skipped:
        lines += ["Skipped (budget): " + "; ".join(b.skipped), ""]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
