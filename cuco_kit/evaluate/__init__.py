"""Evaluation: the cascade L0-L3, the launcher and rank workers, replay. Imports only what the GPU image has.

Two sides. The parent (notebook kernel, CLI, search) imports the modules of this package: api, device, stats,
build, launcher, pool, mps, gpu_evaluator, replay, simulated; none of them imports torch or creates a CUDA
context. What runs inside the rank processes (the worker loop, the harness, the backends, the ABI mirror) is
the subpackage ``rank``: it imports torch, and the parent only starts it as a process, never imports it.
"""
# Only the serialisable seam here: importing any submodule runs this file, rank processes included, so it must
# not pull in the parent's evaluator, pool and launcher. Import those from their modules.
from cuco_kit.evaluate.api import LEVELS, EvalRequest, EvalResult, Evaluator, Progress

__all__ = ["EvalRequest", "EvalResult", "Evaluator", "LEVELS", "Progress"]
