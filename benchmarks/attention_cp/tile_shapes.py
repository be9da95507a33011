"""The shared attention kernel alone at each tile shape against torch SDPA (flash), on one GPU, in one process.

  PYTHONPATH=. python3 benchmarks/attention_cp/tile_shapes.py --out DIR [--iters 20]

Why a separate script: the sample benchmark (run.py) measures the kernel the sources build, i.e. the default tile
shape of each head dim (attn::TileShape). Choosing that default needs every shape on the same inputs, which the
harness cannot give (a candidate builds one shape). This script builds tile_shapes.cu (every shape that compiles
without register spills) into a shared library, and for each of run.py's kernel presets:
  1. checks every shape's output against the workload's reference (SDPA in float32) on the same q, k, v
     (max |error| / max |reference| within the workload's REL_TOLERANCE, as L2 does);
  2. times every shape and SDPA flash like the other references: profiler kernel time averaged over iterations,
     fresh random inputs and a cold L2 before each, all in the same process and the same run.
Counts: FLOPs = 4 * H * D per visible (query, key) pair. Writes tile_shapes.json (raw) and tile_shapes.md into
--out; benchmarks/attention_cp/ keeps the run the defaults come from (tile_shapes.json, TILE_SHAPES.md).

  --apply            then write the chosen shape of each head dim into attn::TileShape (attention_kernel.cuh)
  --apply-from JSON  only that, from an earlier run's tile_shapes.json (no GPU): the same edit, reproduced
The choice per head dim: among the shapes correct at every preset of that D, the one whose slowest ratio to
SDPA over those presets is highest (so a shape good for causal and bad for non-causal loses).
"""
from __future__ import annotations

import argparse
import ctypes
import datetime as dt
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType

# Run by path, not installed: the repository root (the kit) and benchmarks/ (common) go first on sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import TIMING_PRELUDE

from cuco_kit.evaluate.device import detect_gpu

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
SAMPLE = ROOT / "sample_kernels" / "attention_cp"
RUNTIME = ROOT / "cuco_kit" / "runtime"  # the kernel waits with the runtime's bounded wait (cuco_waits.h)
PRESETS = ("paper", "paper_noncausal", "d32", "d128")


def build(workdir: Path) -> ctypes.CDLL:
    lib = workdir / "libattn_tiles.so"
    nvcc = os.environ.get("NVCC", "nvcc")
    cmd = [nvcc, "-O3", "-arch=sm_90", "-shared", "-Xcompiler", "-fPIC", f"-I{SAMPLE}", f"-I{RUNTIME}",
           str(HERE / "tile_shapes.cu"), "-o", str(lib)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"tile_shapes.cu did not build:\n{p.stderr[-2000:]}")
    return ctypes.CDLL(str(lib))


def shapes(lib: ctypes.CDLL) -> list[tuple[int, ...]]:
    """(D, m-tiles per warp, keys per tile, prefetch K, min CTAs per SM) of every shape the library holds."""
    out = []
    for i in range(lib.attn_shape_count()):
        vals = [ctypes.c_int() for _ in range(5)]
        lib.attn_shape(i, *map(ctypes.byref, vals))
        out.append(tuple(v.value for v in vals))
    return out


def choose(rows: list[dict]) -> dict[int, dict]:
    """Per head dim, the shape with the best worst-case ratio to SDPA flash over that D's presets, among the
    shapes that were correct at all of them."""
    by_d: dict[int, dict[tuple, list[dict]]] = {}
    for r in rows:
        for sh in r["shapes"]:
            key = (sh["m_tiles"], sh["block_k"], sh["prefetch_k"], sh["min_ctas"])
            by_d.setdefault(r["D"], {}).setdefault(key, []).append(sh)
    n_presets = {d: sum(1 for r in rows if r["D"] == d) for d in by_d}
    best = {}
    for d, per_shape in by_d.items():
        ok = {k: v for k, v in per_shape.items() if len(v) == n_presets[d] and all(x["ok"] for x in v)}
        if ok:
            key = max(ok, key=lambda k: min(x["vs_sdpa"] for x in ok[k]))
            best[d] = {"m_tiles": key[0], "block_k": key[1], "prefetch_k": key[2], "min_ctas": key[3],
                       "worst_vs_sdpa": min(x["vs_sdpa"] for x in ok[key])}
    return best


def apply(best: dict[int, dict], header: Path = SAMPLE / "attention_kernel.cuh") -> list[str]:
    """Rewrite the `template <> struct TileShape<D> : TileConfig<...> {};` line of each chosen D."""
    text = header.read_text()
    changed = []
    for d, sh in sorted(best.items()):
        line = (f"template <> struct TileShape<{d}> : TileConfig<{sh['m_tiles']}, {sh['block_k']}, "
                f"{'true' if sh['prefetch_k'] else 'false'}, {sh['min_ctas']}> {{}};")
        pattern = re.compile(rf"^template <> struct TileShape<{d}> : TileConfig<[^>]*> {{}};$", re.MULTILINE)
        if not pattern.search(text):
            raise SystemExit(f"{header.name}: no TileShape<{d}> line of the form this script rewrites")
        text, _ = pattern.subn(line, text)
        changed.append(line)
    header.write_text(text)
    return changed


def report(meta: dict, rows: list[dict]) -> str:
    """The markdown table of a run (tile_shapes.md), with the shape chosen per head dim."""
    lines = [f"# The attention kernel alone at each tile shape vs torch SDPA flash ({meta['date']})", "",
             f"GPU {meta['gpu']}, driver {meta['driver']}, torch {meta['torch']}. Profiler kernel time averaged over "
             f"{meta['iters']} iterations, fresh inputs and cold L2 before each; world size 1, one segment.", "",
             "| preset | D | causal | m-tiles/warp | block Q x K | prefetch K | min CTAs/SM | ours ms | SDPA flash ms "
             "| ours / SDPA | TFLOP/s | rel error |", "|" + "---|" * 12]
    for r in rows:
        for s in r["shapes"]:
            lines.append(f"| {r['preset']} | {r['D']} | {r['causal']} | {s['m_tiles']} | {s['block_q']} x "
                         f"{s['block_k']} | {s['prefetch_k']} | {s['min_ctas']} | {s['kernel_us'] / 1000:.4f} | "
                         f"{r['sdpa_flash_us'] / 1000:.4f} | {s['vs_sdpa']:.0%} | {s['tflops']:.0f} | "
                         f"{s['rel_error']:.1e}{'' if s['ok'] else ' FAIL'} |")
    lines += ["", "Chosen per head dim (best worst-case ratio over its presets, correct everywhere): " + "; ".join(
        f"D {d}: {b['m_tiles']} m-tiles, K tile {b['block_k']}, prefetch {b['prefetch_k']}, min CTAs "
        f"{b['min_ctas']} ({b['worst_vs_sdpa']:.0%})" for d, b in sorted(choose(rows).items()))]
    return "\n".join(lines) + "\n"


def measure(preset: str, workload: ModuleType, lib: ctypes.CDLL, all_shapes: list[tuple[int, ...]],
            scope: dict, iters: int, once: bool) -> dict:
    """SDPA flash and every shape of the preset's head dim on the same inputs: each shape checked against the
    workload's reference and timed, SDPA timed (with ``once``: every shape run once, nothing checked or timed)."""
    torch = scope["torch"]
    import torch.nn.functional as F  # noqa: PLC0415 - torch is heavy: imported only by the GPU path
    from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: PLC0415 - torch is heavy, as above

    p = workload.SIZE_PRESETS[preset]
    S, H, D, causal = p["SEQ"], p["H"], p["D"], int(p["CAUSAL"])
    g = torch.Generator(device="cuda")
    g.manual_seed(0)
    q, k, v = (torch.randn(S, H, D, device="cuda", generator=g).to(torch.bfloat16) for _ in range(3))
    o = torch.empty_like(q)
    heads_first = [t.permute(1, 0, 2).unsqueeze(0) for t in (q, k, v)]  # [1, H, S, D] views, same data

    def refresh() -> None:
        for t in (q, k, v):
            t.normal_(generator=g)

    def sdpa() -> object:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(*heads_first, is_causal=bool(causal))

    pairs = S * (S + 1) // 2 if causal else S * S
    flops = 4.0 * H * D * pairs
    sdpa_us = 0.0 if once else scope["kernel_us"](sdpa, refresh, iters, "flash")
    row = {"preset": preset, "SEQ": S, "H": H, "D": D, "causal": causal, "flops": flops,
           "sdpa_flash_us": sdpa_us, "shapes": []}
    for shape in (s for s in all_shapes if s[0] == D):
        d, m_tiles, block_k, prefetch_k, min_ctas = shape

        def ours(shape: tuple[int, ...] = shape) -> None:
            rc = lib.attn_run(*shape, ctypes.c_void_p(q.data_ptr()),
                              ctypes.c_void_p(k.data_ptr()), ctypes.c_void_p(v.data_ptr()),
                              ctypes.c_void_p(o.data_ptr()), S, H, causal,
                              ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
            if rc != 0:
                raise RuntimeError(f"attn_run{shape} returned CUDA error {rc}")

        if once:
            ours()
            continue
        ref = workload.attention(q, k, v, bool(causal))  # fp32, on the inputs the last timing left
        ours()
        torch.cuda.synchronize()
        rel = ((o.float() - ref).abs().max() / ref.abs().max()).item()
        us = scope["kernel_us"](ours, refresh, iters, "flash_fwd_kernel")
        row["shapes"].append({"m_tiles": m_tiles, "block_k": block_k, "prefetch_k": prefetch_k,
                              "min_ctas": min_ctas,
                              "block_q": 64 * m_tiles,
                              "rel_error": rel, "ok": rel <= workload.REL_TOLERANCE, "kernel_us": us,
                              "vs_sdpa": sdpa_us / us, "tflops": flops / us / 1e6})
        print(f"{preset} D{D} m{m_tiles} k{block_k} p{prefetch_k} c{min_ctas}: {us:.1f} us vs SDPA "
              f"{sdpa_us:.1f} us ({sdpa_us / us:.0%}), rel err {rel:.2e}", flush=True)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or str(HERE / "out"))
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--presets", default=",".join(PRESETS), help="comma list of the sample's presets")
    ap.add_argument("--apply", action="store_true", help="write the chosen shapes into attn::TileShape")
    ap.add_argument("--apply-from", metavar="JSON", help="only apply the choice of an earlier tile_shapes.json")
    ap.add_argument("--once", action="store_true",
                    help="run every shape once and stop (no timing, no files): for a profiler such as ncu")
    args = ap.parse_args()
    if args.apply_from:
        try:
            rows = json.loads(Path(args.apply_from).read_text())["rows"]
        except (OSError, ValueError, KeyError) as exc:
            raise SystemExit(f"--apply-from {args.apply_from}: not a tile_shapes.json ({exc})") from None
        print("\n".join(apply(choose(rows))))
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    sys.path.insert(0, str(SAMPLE))
    import workload  # noqa: PLC0415 - the sample's presets and tolerance: importable once SAMPLE is on sys.path

    scope: dict = {}
    exec(TIMING_PRELUDE, scope)  # time_it / kernel_us / the L2 flush buffer, shared with the reference children
    torch = scope["torch"]

    with tempfile.TemporaryDirectory() as tmp:
        lib = build(Path(tmp))
        all_shapes = shapes(lib)
        rows = [measure(preset, workload, lib, all_shapes, scope, args.iters, args.once)
                for preset in args.presets.split(",")]
    if args.once:
        torch.cuda.synchronize()
        return 0

    gpu = (detect_gpu() or [{}])[0]
    meta = {"date": dt.date.today().isoformat(), "gpu": gpu.get("name"), "driver": gpu.get("driver_version"),
            "torch": torch.__version__, "iters": args.iters}
    (out / "tile_shapes.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    text = report(meta, rows)
    (out / "tile_shapes.md").write_text(text)
    print(text)
    if args.apply:
        print("applied:\n" + "\n".join(apply(choose(rows))))
    return 0 if all(s["ok"] for r in rows for s in r["shapes"]) else 1


if __name__ == "__main__":
    sys.exit(main())
