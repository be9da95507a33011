"""What the GPU tests share: one warm GpuEvaluator per test module (its rank workers and MPS daemon end with it)."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def evaluator():
    from cuco_kit.evaluate.gpu_evaluator import GpuEvaluator

    ev = GpuEvaluator()
    yield ev
    ev.close()
