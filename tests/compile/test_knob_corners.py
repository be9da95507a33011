"""Compile tier: every sample's baseline builds at the corners of its range knobs (every range knob at its
minimum, then every one at its maximum; written-set knobs at their defaults), for the symm backend. Two builds
per sample: the ends of the ranges are where register, shared-memory and launch-bound limits bite first."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from cuco_kit import markers
from cuco_kit.evaluate import build as B

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = sorted(p for p in ROOT.glob("sample_kernels/*/*.cu") if "EVOLVE-BLOCK-START knobs" in p.read_text())

pytestmark = pytest.mark.timeout(900)


@pytest.mark.parametrize("corner", [0, -1], ids=["min", "max"])
@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.parent.name)
def test_sample_builds_at_its_range_corners(sample: Path, corner: int, tmp_path_factory: pytest.TempPathFactory
                                            ) -> None:
    cfg = B.BuildConfig()
    if shutil.which(cfg.nvcc) is None and not Path(cfg.nvcc).exists():
        pytest.skip(f"nvcc not found ({cfg.nvcc})")
    if cfg.nccl_include is None or cfg.nccl_lib is None:
        pytest.skip("nvidia-nccl wheel (headers + libnccl.so.2) not installed")
    code = sample.read_text()
    ranges = [k for k in markers.knobs(code) if k.range is not None]
    assert ranges, f"{sample.parent.name}: no range knobs"
    variant = markers.set_knobs(code, {k.name: k.allowed[corner] for k in ranges})
    res = B.build(variant, "symm", B.for_workload(cfg, sample.parent), tmp_path_factory.mktemp("corners"))
    assert res.ok, res.log[-3000:]
