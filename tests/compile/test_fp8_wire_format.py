"""Compile tier: the CUDA conversions behind the MoE sample's 8-bit dispatch agree bit for bit with the torch
reference (workload.fp8_roundtrip). A host program built with nvcc applies, per element, the same calls as
moe_kernels.cuh's quantize_rows / dequantize_rows (scale = amax / kE4m3Max, __nv_cvt_float_to_fp8 with
__NV_SATFINITE, __nv_cvt_fp8_to_halfraw, bf16 rounding) on blocks built to hit ties, the block maximum,
e4m3 subnormals and an all-zero block; no GPU needed. The warp reduction itself is covered on the GPU by L2."""
from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from cuco_kit.evaluate import build as B

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "sample_kernels" / "moe_dispatch_combine"

HOST_PROGRAM = r"""
#include <cstdio>
#include <vector>
#include "moe_kernels.cuh"
using namespace moe_kernels;
// stdin: a count of blocks, then kFp8Block floats per block; stdout: each element after encode + decode.
int main() {
  int blocks = 0;
  if (std::scanf("%d", &blocks) != 1) return 2;
  std::vector<float> v(kFp8Block);
  for (int b = 0; b < blocks; ++b) {
    float amax = 0.f;
    for (int i = 0; i < kFp8Block; ++i) {
      if (std::scanf("%f", &v[i]) != 1) return 2;
      v[i] = __bfloat162float(__float2bfloat16(v[i]));
      amax = fmaxf(amax, fabsf(v[i]));
    }
    const float scale = amax > 0.f ? amax / kE4m3Max : 1.f;  // as quantize_rows
    for (int i = 0; i < kFp8Block; ++i) {
      const __nv_fp8_storage_t q = __nv_cvt_float_to_fp8(v[i] / scale, __NV_SATFINITE, __NV_E4M3);
      const __half h(__nv_cvt_fp8_to_halfraw(q, __NV_E4M3));  // as dequantize_rows
      std::printf("%.9g\n", __bfloat162float(__float2bfloat16(__half2float(h) * scale)));
    }
  }
  return 0;
}
"""


def _workload_module():
    spec = importlib.util.spec_from_file_location("moe_workload_fp8", SAMPLE / "workload.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _blocks() -> torch.Tensor:
    g = torch.Generator().manual_seed(5)
    rows = [torch.randn(128, generator=g) * s for s in (1e-3, 0.3, 1.0, 7.0, 1e3)]
    ties = torch.zeros(128)
    ties[:6] = torch.tensor([448.0, 1.0625, 1.1875, -2.125, 0.0137, -448.0])  # scale 1: e4m3 ties, subnormals
    wide = torch.randn(128, generator=g) * 1e-4
    wide[0] = 300.0  # one large element: the rest fall into e4m3's subnormal range or to zero
    return torch.stack(rows + [ties, wide, torch.zeros(128)]).to(torch.bfloat16)


@pytest.mark.timeout(300)
def test_cuda_encode_decode_matches_the_torch_reference_bit_for_bit(tmp_path: Path) -> None:
    cfg = B.BuildConfig()
    if shutil.which(cfg.nvcc) is None and not Path(cfg.nvcc).exists():
        pytest.skip(f"nvcc not found ({cfg.nvcc})")
    src = tmp_path / "fp8_host.cu"
    src.write_text(HOST_PROGRAM)
    exe = tmp_path / "fp8_host"
    subprocess.run([cfg.nvcc, "-std=c++17", "-O2", f"-I{SAMPLE}", str(src), "-o", str(exe)], check=True,
                   capture_output=True, timeout=240)
    x = _blocks()
    text = f"{x.shape[0]}\n" + "\n".join(" ".join(f"{v:.9g}" for v in row.float().tolist()) for row in x)
    out = subprocess.run([str(exe)], input=text, capture_output=True, text=True, check=True, timeout=30).stdout
    cuda = torch.tensor([float(t) for t in out.split()]).reshape(x.shape)
    ref = _workload_module().fp8_roundtrip(x).float()
    mismatch = (cuda != ref).nonzero()
    assert mismatch.numel() == 0, f"{len(mismatch)} elements differ, first at {mismatch[0].tolist()}: " \
        f"cuda {cuda[tuple(mismatch[0])]:.9g} vs torch {ref[tuple(mismatch[0])]:.9g}"
    assert ref[5, :6].tolist() == [448.0, 1.0, 1.25, -2.0, 0.013671875, -448.0]
