"""Attention with context parallelism on one GPU machine, in one command: L2 of every seed and knob value, causal and
not, then the benchmark table and the attention-kernel check against torch SDPA (flash).

  PYTHONPATH=. python3 benchmarks/attention_cp/run.py --out DIR [--smoke] [--budget-s 480]

1. L2 (4 fresh-input trials) at the small presets (causal and non-causal), world size 1 (nccl) and 2 and 4 ranks
   (symm + compat): both seeds and a covering set of device_lsa.cu variants.
2. Benchmark at the paper's SEQ 8192, 16 heads, head dim 64, causal and not: world size 1 (nccl) and 4 (symm).
3. The attention kernel alone: flash_fwd_kernel's duration in one profiled iteration of the nccl seed at world
   size 1 (the whole sequence in one launch) against torch SDPA's flash kernel on the same [1, H, SEQ, D] bf16
   problem (profiler kernel time, median-free mean over iterations, cold L2), at head dims 32, 64 and 128,
   causal and not. The bar: ours >= 60% of SDPA flash.
Counts first: FLOPs of the busiest rank = 4*H*D per visible (query, key) pair; bytes each rank receives =
2 * (W-1)/W * SEQ*H*D*2 (the other ranks' K and V, bf16).
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

# Run by path, not installed: benchmarks/ (common) goes first on sys.path; common adds the repository root.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import TIMING_PRELUDE, SampleBench, base_args, bench_table, header, l2_table, matching_us, torch_child

SAMPLE = "attention_cp"
L2_PRESETS = ("small", "small_noncausal")
BENCH_PRESETS = ("paper", "paper_noncausal")
KERNEL_PRESETS = ("paper", "paper_noncausal", "d32", "d128")
OUR_KERNEL = re.compile(r"flash_fwd_kernel")

TORCH_SDPA = TIMING_PRELUDE + r"""
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
p = json.loads(sys.argv[1]); iters = int(sys.argv[2])
S, H, D, causal = p["SEQ"], p["H"], p["D"], bool(p["CAUSAL"])
g = torch.Generator(device="cuda"); g.manual_seed(0)
q, k, v = (torch.randn(1, H, S, D, device="cuda", generator=g).to(torch.bfloat16) for _ in range(3))
def refresh():
    for t in (q, k, v):
        t.normal_(generator=g)
def fn():
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        F.scaled_dot_product_attention(q, k, v, is_causal=causal)
pairs = S * (S + 1) // 2 if causal else S * S
print(json.dumps({"event_ms": time_it(fn, refresh, iters), "kernel_us": kernel_us(fn, refresh, iters, "flash"),
                  "flops": 4.0 * H * D * pairs}))
"""


def main() -> int:
    args = base_args(__doc__.splitlines()[0], Path(__file__).parent / "out").parse_args()
    b = SampleBench(SAMPLE, args)
    full = not args.smoke and not args.skip_bench
    labels = b.bench_labels(dict.fromkeys(BENCH_PRESETS + KERNEL_PRESETS))
    bench = [p for p in BENCH_PRESETS if p in labels]
    kernel = [p for p in KERNEL_PRESETS if p in labels]
    try:
        b.prebuild()
        if not args.skip_l2:
            b.l2(L2_PRESETS)
        if full:
            for preset in bench:
                for world in (w for w in (1, 4) if w in b.worlds):
                    b.bench(preset, world)
            if 1 in b.worlds:
                seed = (b.wl_dir / "seed_nccl.cu").read_text()  # even when --only left it out of b.seeds
                for preset in kernel:
                    b.run("seed_nccl.cu", seed, 1, preset, "kernel", iters=args.iters, measure_seed=False,
                          timeline=True)
    finally:
        b.close()
    refs = {p: torch_child(TORCH_SDPA, json.dumps(b.wl.size_presets[p]), args.iters) for p in kernel} \
        if full and 1 in b.worlds else {}
    return b.finish({"torch_sdpa_flash": refs}, make_table(b, refs))


def make_table(b: SampleBench, refs: dict) -> str:
    lines = header(b.meta(), "Attention + context parallelism") + l2_table(b.rows)
    if refs:
        lines += ["## The attention kernel alone vs torch SDPA (flash), world size 1", "",
                  "| preset | SEQ | H | D | causal | ours ms | SDPA flash ms | ours / SDPA speed | ours TFLOP/s |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for preset, ref in refs.items():
            row = next((r for r in b.rows if r["phase"] == "kernel" and r["preset"] == preset), None)
            ours = matching_us(row, OUR_KERNEL) if row else None
            p = b.wl.size_presets[preset]
            if ours and "kernel_us" in ref:
                lines.append(f"| {preset} | {p['SEQ']} | {p['H']} | {p['D']} | {p['CAUSAL']} | {ours / 1000:.4f} | "
                             f"{ref['kernel_us'] / 1000:.4f} | {ref['kernel_us'] / ours:.0%} | "
                             f"{ref['flops'] / ours / 1e6:.0f} |")
            else:
                why = ref.get("error") or (row or {}).get("reason") or "no profiled row"
                lines.append(f"| {preset} | {p['SEQ']} | {p['H']} | {p['D']} | {p['CAUSAL']} | - | - | not "
                             f"measured: {str(why)[:80]} | - |")
        lines += ["", "These rows time the kernel of the tree their run names (see Runs). The kernel at every tile "
                  "shape, the current attn::TileShape defaults included, against SDPA flash on the same inputs: "
                  "TILE_SHAPES.md (tile_shapes.py).", ""]
    for preset in BENCH_PRESETS:
        for world in (1, 4):
            lines += bench_table(b.rows, preset, world)
    if b.skipped:
        lines += ["Skipped (budget): " + "; ".join(b.skipped), ""]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
