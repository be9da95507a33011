"""Evaluation: the cascade L0-L3, the launcher and rank workers, replay. Imports only what the GPU image has."""
from cuco_kit.evaluate.api import EvalRequest, EvalResult, Evaluator, LEVELS, Progress

__all__ = ["EvalRequest", "EvalResult", "Evaluator", "LEVELS", "Progress", "GpuEvaluator", "EvaluatorConfig",
           "detect_gpu"]


_LAZY = {"GpuEvaluator": "cuco_kit.evaluate.gpu_evaluator", "EvaluatorConfig": "cuco_kit.evaluate.gpu_evaluator",
         "detect_gpu": "cuco_kit.evaluate.device"}


def __getattr__(name: str):  # the GPU evaluator imports torch: only when asked for
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'cuco_kit.evaluate' has no attribute {name!r}")
