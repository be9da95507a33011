"""Fixtures the sample-workload tests share (tests/unit/test_<sample>_workload.py). Each such module names its
sample folder in a module-level SAMPLE."""
from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch

from cuco_kit.workload import TensorSpec, Workload, load_workload

Inputs = list[dict[str, torch.Tensor]]


@pytest.fixture(scope="module")
def wl(request: pytest.FixtureRequest) -> Workload:
    """The workload of the test module's SAMPLE folder."""
    return load_workload(request.module.SAMPLE)


@pytest.fixture(scope="module")
def wl_module(request: pytest.FixtureRequest) -> ModuleType:
    """The SAMPLE folder's workload.py as a module, for its own helpers (scratch sizes, layouts, codecs)."""
    sample: Path = request.module.SAMPLE
    spec = importlib.util.spec_from_file_location(f"{sample.name}_workload_under_test", sample / "workload.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _inputs_for(wl: Workload, params: dict[str, int], world: int, seed: int = 0, *,
                widened: bool = False) -> Inputs:
    """Every rank's inputs from the workload's make_inputs (rank r seeded seed * 1000 + r); widened: floats
    widened to float32, as the harness hands them to the reference."""
    assert wl.make_inputs is not None, f"{wl.name} has no make_inputs"
    out = []
    for r in range(world):
        g = torch.Generator(device="cpu").manual_seed(seed * 1000 + r)
        made = dict(wl.make_inputs(params, world, r, g))
        out.append({k: v.float() if widened and v.dtype.is_floating_point else v for k, v in made.items()})
    return out


@pytest.fixture(scope="session")
def inputs_for() -> Callable[..., Inputs]:
    return _inputs_for


def _tensor(wl: Workload, name: str) -> TensorSpec:
    return next(t for t in wl.tensors if t.name == name)


@pytest.fixture(scope="session")
def tensor() -> Callable[[Workload, str], TensorSpec]:
    """The workload's tensor spec of that name."""
    return _tensor
