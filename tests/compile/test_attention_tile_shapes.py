"""Compile tier: benchmarks/attention_cp/tile_shapes.cu (the shared attention kernel at every tile shape, which
the sources' defaults are chosen from) builds for sm_90 as a shared library with the entry points
tile_shapes.py calls, and no shape spills registers - a spill would make the shape comparison measure local
memory instead of the tile. (tile_shapes.cu also static_asserts that attn::TileShape's defaults are among the
shapes it compares.)"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "benchmarks" / "attention_cp" / "tile_shapes.cu"
SAMPLE = ROOT / "sample_kernels" / "attention_cp"
RUNTIME = ROOT / "cuco_kit" / "runtime"

pytestmark = pytest.mark.timeout(300)


def test_every_tile_shape_builds_without_spills(tmp_path: Path) -> None:
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not found")
    lib = tmp_path / "libattn_tiles.so"
    p = subprocess.run(["nvcc", "-O3", "-arch=sm_90", "-shared", "-Xcompiler", "-fPIC", "-Xptxas", "-v",
                        f"-I{SAMPLE}", f"-I{RUNTIME}", str(SOURCE), "-o", str(lib)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-3000:]
    # ptxas prints, per kernel: "Compiling entry function '<mangled>'", then its properties with "N bytes spill
    # stores".
    kernels = [(m.group(1), int(re.search(r"(\d+) bytes spill stores", chunk).group(1)))
               for chunk in p.stderr.split("Compiling entry function")[1:]
               if (m := re.match(r" '(_ZN4attn16flash_fwd_kernel\w+)'", chunk))]
    shapes = re.findall(r"X\((\d+), (\d+), (\d+), ([01]), (\d+)\)", SOURCE.read_text())
    assert len(kernels) == len(shapes) >= 3, p.stderr[-3000:]
    spilling = [name for name, stores in kernels if stores > 0]
    assert not spilling, f"these tile shapes spill registers: {spilling}"
    if shutil.which("nm"):
        syms = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True).stdout
        for entry in ("attn_shape_count", "attn_shape", "attn_run"):
            assert re.search(rf"\bT {entry}$", syms, re.MULTILINE), f"tile_shapes.cu does not export {entry}"
