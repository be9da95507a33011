"""What the GPU tests share: one warm GpuEvaluator per test module (its rank workers and MPS daemon end with it)."""
from __future__ import annotations

import pytest

from cuco_kit.evaluate.gpu_evaluator import GpuEvaluator


@pytest.fixture(scope="module")
def evaluator():
    ev = GpuEvaluator()
    yield ev
    ev.close()
