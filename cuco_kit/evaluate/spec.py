"""`EvaluatorSpec`: which evaluator to make, as plain data, so that an executor can make one per GPU set, here or
on another machine (a Ray actor gets the spec as JSON and makes its evaluator where its GPUs are).

A spec names a kind ("gpu", "simulated", "replay") and the keyword options of its constructor; ``make`` adds the
GPU set (CUDA_VISIBLE_DEVICES syntax) that the evaluator may use, and ``prebuild`` runs L1 ahead of an
evaluation without making an evaluator (what a CPU build pool calls).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from cuco_kit.errors import BadInput
from cuco_kit.evaluate.api import Badge, EvalRequest, Evaluator
from cuco_kit.evaluate.gpu_evaluator import EvaluatorConfig, GpuEvaluator, prebuild
from cuco_kit.evaluate.replay import ReplayEvaluator
from cuco_kit.evaluate.simulated import SimulatedEvaluator

KINDS: dict[str, Badge] = {"gpu": "real", "simulated": "simulated", "replay": "replayed"}
_PATH_OPTIONS = ("cache_dir", "scratch_root")  # EvaluatorConfig fields that are paths (strings in JSON)


@dataclass
class EvaluatorSpec:
    """``EvaluatorSpec("simulated", {"seed": 3, "delay_s": 0.2})``, ``EvaluatorSpec("gpu", {"recycle_every":
    25})`` (EvaluatorConfig fields), ``EvaluatorSpec("replay", {"path": "run.sqlite"})`` (or a list of
    recordings)."""

    kind: str
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise BadInput(f"evaluator kind {self.kind!r}: use one of {', '.join(KINDS)}")
        if self.kind == "gpu":
            known = {f.name for f in fields(EvaluatorConfig)} - {"build", "visible_devices"}
            unknown = sorted(set(self.options) - known)
            if unknown:
                raise BadInput(f"gpu evaluator options {unknown} are not EvaluatorConfig fields; known: "
                               f"{', '.join(sorted(known))}")
        if self.kind == "replay" and "path" not in self.options:
            raise BadInput("a replay evaluator spec needs options {'path': <recorded run .sqlite>}")

    @property
    def badge(self) -> Badge:
        return KINDS[self.kind]

    def _gpu_config(self, visible_devices: str | None) -> EvaluatorConfig:
        opts: dict[str, Any] = {k: Path(v) if k in _PATH_OPTIONS and v is not None else v
                                for k, v in self.options.items()}
        return EvaluatorConfig(**opts, visible_devices=visible_devices)

    def make(self, visible_devices: str | None = None) -> Evaluator:
        """The evaluator, using the GPU set ``visible_devices`` (None: what the process sees)."""
        if self.kind == "gpu":
            return GpuEvaluator(self._gpu_config(visible_devices))
        if self.kind == "simulated":
            return SimulatedEvaluator(**self.options, visible_devices=visible_devices)
        path = self.options["path"]  # one recording, or a list of them (every recording of a configuration)
        return ReplayEvaluator(str(path) if isinstance(path, (str, Path)) else [str(p) for p in path])

    def prebuild(self, request: EvalRequest) -> None:
        """Build ``request``'s candidate into the build cache ahead of its evaluation (only the GPU evaluator
        builds anything; the others have nothing to do ahead of time)."""
        if self.kind == "gpu":
            prebuild(self._gpu_config(None), request)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, default=str)

    @classmethod
    def from_json(cls, text: str) -> EvaluatorSpec:
        return cls(**json.loads(text))
