"""Compile tier: the harness's helper library (runtime/harness_helpers.cu) builds and exports the stream hold of
device timing, and its host half, cuco_h_release, stores the release value where the hold kernel looks for it
(pure host code: checked here without a GPU; the kernel side runs on the GPU tier)."""
from __future__ import annotations

import ctypes
import os
import shutil
from pathlib import Path

import pytest

from cuco_kit.evaluate import build as B

pytestmark = pytest.mark.timeout(300)


def test_release_stores_the_epoch_the_hold_waits_for(tmp_path: Path) -> None:
    cfg = B.BuildConfig()
    if shutil.which(cfg.nvcc) is None and not Path(cfg.nvcc).exists():
        pytest.skip(f"nvcc not found ({cfg.nvcc})")
    if cfg.nccl_include is None or cfg.nccl_lib is None:
        pytest.skip("nvidia-nccl wheel (headers + libnccl.so.2) not installed")
    lib = ctypes.CDLL(str(B.build_helpers(tmp_path, cfg)), mode=os.RTLD_NOW | os.RTLD_LOCAL)
    for name in ("cuco_h_hold", "cuco_h_release"):
        assert hasattr(lib, name), name
    lib.cuco_h_release.argtypes = [ctypes.c_void_p, ctypes.c_uint64]
    lib.cuco_h_release.restype = ctypes.c_int
    word = ctypes.c_uint64(0)
    for epoch in (1, 2, 2**40 + 7):
        assert lib.cuco_h_release(ctypes.addressof(word), epoch) == 0
        assert word.value == epoch
