"""Compile tier: the harness's helper library (runtime/harness_helpers.cu) builds and exports the stream hold of
device timing and the interference kernel of the L2 trials (rank/perturb.py). Pure host code is checked here without
a GPU: cuco_h_release stores the release value where the hold kernel looks for it, and cuco_h_interfere refuses an
empty grid before it launches anything. The kernels themselves run on the GPU tier."""
from __future__ import annotations

import ctypes
import os

import pytest

from cuco_kit.evaluate import build as B

pytestmark = pytest.mark.timeout(300)
CUDA_ERROR_INVALID_VALUE = 1


@pytest.fixture(scope="module")
def helpers(tmp_path_factory: pytest.TempPathFactory, toolchain: B.BuildConfig) -> ctypes.CDLL:
    cfg = toolchain
    return ctypes.CDLL(str(B.build_helpers(tmp_path_factory.mktemp("helpers"), cfg)), mode=os.RTLD_NOW | os.RTLD_LOCAL)


def test_release_stores_the_epoch_the_hold_waits_for(helpers: ctypes.CDLL) -> None:
    for name in ("cuco_h_hold", "cuco_h_release"):
        assert hasattr(helpers, name), name
    helpers.cuco_h_release.argtypes = [ctypes.c_void_p, ctypes.c_uint64]
    helpers.cuco_h_release.restype = ctypes.c_int
    word = ctypes.c_uint64(0)
    for epoch in (1, 2, 2**40 + 7):
        assert helpers.cuco_h_release(ctypes.addressof(word), epoch) == 0
        assert word.value == epoch


def test_the_interference_kernel_is_exported_and_refuses_an_empty_grid(helpers: ctypes.CDLL) -> None:
    fn = helpers.cuco_h_interfere
    fn.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64]
    fn.restype = ctypes.c_int
    for blocks in (0, -3):
        assert fn(None, 0, blocks, 1000, 1) == CUDA_ERROR_INVALID_VALUE
