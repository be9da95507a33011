"""What every compile-tier build needs, in one place."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from cuco_kit.evaluate import build as B


@pytest.fixture(scope="session")
def toolchain() -> B.BuildConfig:
    """The default build configuration, once nvcc and the nvidia-nccl wheel (headers and libnccl.so.2) are found;
    otherwise the test is skipped, saying which is missing. Read-only: derive with dataclasses.replace or
    build.for_workload."""
    cfg = B.BuildConfig()
    if shutil.which(cfg.nvcc) is None and not Path(cfg.nvcc).exists():
        pytest.skip(f"nvcc not found ({cfg.nvcc})")
    if cfg.nccl_include is None or cfg.nccl_lib is None:
        pytest.skip("nvidia-nccl wheel (headers + libnccl.so.2) not installed")
    return cfg
