"""GEMM + AllGather on one GPU machine, in one command: L2 of every seed and knob value, then the benchmark table.

  PYTHONPATH=. python3 benchmarks/gemm_allgather/run.py --out DIR [--bench-presets 4096,8192] [--smoke] [--budget-s 480]

1. L2 (4 fresh-input trials) at the small preset, world size 1 (nccl) and 2 and 4 ranks (symm + compat): both
   seeds and a covering set of device_lsa.cu variants (every (placement, sync, issuer) combination, the chunk
   count cycling, so every value of every knob runs).
2. Benchmark at each preset: world size 1 (nccl): cublas_alone.cu (the same cublasGemmEx under the same harness,
   none of the co-design machinery: the bar is the best variant within 5% of it), both seeds and the
   variants; 4 ranks (symm): the copy seed and the variants.
3. torch.matmul alone on the same per-rank shape, in a child process (events, cold L2, fresh inputs, median):
   what a user would get outside the harness.
Counts first: FLOPs per rank = 2*M*K*N/W; bytes each rank receives = (W-1)*(M/W)*K*2.
"""
from __future__ import annotations

import sys
from pathlib import Path

# Run by path, not installed: benchmarks/ (common) goes first on sys.path; common adds the repository root.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import TIMING_PRELUDE, SampleBench, base_args, bench_table, header, l2_table, torch_child

SAMPLE = "gemm_allgather"
L2_PRESETS = ("small",)
BENCH_PRESETS = ("4096", "8192")  # M=N=K
# The world-1 compute bound under the same harness (same cublasGemmEx call, none of the co-design machinery).
CUBLAS_ALONE_NAME = "cublas_alone.cu"
CUBLAS_ALONE = (Path(__file__).parent / CUBLAS_ALONE_NAME).read_text()
BAR = 1.05  # at world size 1 the best variant within 5% of cuBLAS alone

TORCH_MATMUL = TIMING_PRELUDE + r"""
M, N, K, W, iters = (int(a) for a in sys.argv[1:6])
g = torch.Generator(device="cuda"); g.manual_seed(0)
x = torch.randn(M, K, device="cuda", generator=g).to(torch.bfloat16)
w = (torch.randn(K, N // W, device="cuda", generator=g) / K ** 0.5).to(torch.bfloat16)
def refresh():
    x.normal_(generator=g); w.normal_(generator=g)
print(json.dumps({"median_ms": time_it(lambda: torch.matmul(x, w), refresh, iters)}))
"""


def main() -> int:
    args = base_args(__doc__.splitlines()[0], Path(__file__).parent / "out").parse_args()
    b = SampleBench(SAMPLE, args)
    presets = b.bench_labels(BENCH_PRESETS)
    bench = not args.smoke and not args.skip_bench
    worlds = [w for w in (1, 4) if w in b.worlds]
    try:
        b.prebuild([(CUBLAS_ALONE, "nccl")] if 1 in worlds else [])
        if not args.skip_l2:
            b.l2(L2_PRESETS)
        if bench:
            for preset in presets:
                for world in worlds:
                    if world == 1:
                        b.run(CUBLAS_ALONE_NAME, CUBLAS_ALONE, 1, preset, "bench", iters=args.iters)
                    b.bench(preset, world)
    finally:
        b.close()
    refs = {}
    if bench:  # "<preset>-W<world>": the key merge_runs.py pairs with the rows measured beside it
        for preset in presets:
            P = b.wl.size_presets[preset]
            for world in worlds:
                refs[f"{preset}-W{world}"] = torch_child(TORCH_MATMUL, P["M"], P["N"], P["K"], world, args.iters)
    return b.finish({"cublas_alone": refs}, make_table(b, refs))


def make_table(b: SampleBench, refs: dict) -> str:
    lines = header(b.meta(), "GEMM + AllGather") + l2_table(b.rows)
    for preset in sorted({r["preset"] for r in b.rows if r["phase"] == "bench"}):
        lines += [f"## M=N=K={preset}", ""]
        for world in (1, 4):
            ref = refs.get(f"{preset}-W{world}", {})
            lines += bench_table(b.rows, preset, world, ref.get("median_ms"), "torch.matmul alone")
        g = [r for r in b.rows if r["phase"] == "bench" and r["preset"] == preset and r["world"] == 1
             and r["verdict"] == "pass" and r["median_ms"]]
        cublas = next((r["median_ms"] for r in g if r["name"] == CUBLAS_ALONE_NAME), None)
        variants = [r["median_ms"] for r in g if ".cu" not in r["name"]]
        if cublas and variants:
            ratio = min(variants) / cublas
            within = "within" if ratio <= BAR else "NOT within"
            lines += [f"World size 1, under the same harness: best variant {min(variants):.4f} ms vs "
                      f"{CUBLAS_ALONE_NAME} {cublas:.4f} ms = {ratio:.3f}x ({within} the {BAR - 1:.0%} bar)", ""]
    if b.skipped:
        lines += ["Skipped (budget): " + "; ".join(b.skipped), ""]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
