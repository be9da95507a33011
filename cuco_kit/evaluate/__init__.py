"""Evaluation: the cascade L0-L3, the launcher and rank workers, replay. Imports only what the GPU image has."""
from cuco_kit.evaluate.api import EvalRequest, EvalResult, Evaluator, LEVELS, Progress

__all__ = ["EvalRequest", "EvalResult", "Evaluator", "LEVELS", "Progress"]
