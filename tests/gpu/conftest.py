"""What the GPU tests share: one warm GpuEvaluator per test module (its rank workers and MPS daemon end with it),
and the quick form of the tier (CUCO_GPU_QUICK=1; scripts/remote_gpu/gpu_tier.py --quick sets it): the tests and
cases marked `slow` are left out, and a module's benchmark script runs with its smaller settings (`quick`)."""
from __future__ import annotations

import os

import pytest

from cuco_kit.evaluate.gpu_evaluator import GpuEvaluator

QUICK = os.environ.get("CUCO_GPU_QUICK") == "1"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not QUICK:
        return
    slow = [item for item in items if item.get_closest_marker("slow")]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if not item.get_closest_marker("slow")]


@pytest.fixture(scope="session")
def quick() -> bool:
    """Whether this is the quick form of the gpu tier (CUCO_GPU_QUICK=1)."""
    return QUICK


@pytest.fixture(scope="module")
def evaluator():
    ev = GpuEvaluator()
    yield ev
    ev.close()
