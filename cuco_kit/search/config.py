"""`SearchConfig`: every knob of the search in one JSON-serialisable dataclass with defaults that work."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from cuco_kit.errors import BadInput
from cuco_kit.search.archive import DEFAULT_FEATURES
from cuco_kit.search.budget import BudgetConfig
from cuco_kit.search.design_space import DesignSpaceConfig
from cuco_kit.search.diagnosis import DiagnosisConfig
from cuco_kit.search.islands import IslandConfig
from cuco_kit.search.meta import MetaConfig
from cuco_kit.search.models import ModelsConfig
from cuco_kit.search.novelty import NoveltyConfig
from cuco_kit.search.phases import PhaseConfig
from cuco_kit.search.selection import SelectionConfig


@dataclass
class SearchConfig:
    world_size: int = 1
    backend: str = "nccl"  # "nccl" | "symm"
    params: dict[str, int] = field(default_factory=dict)  # workload parameter overrides
    iters: int = 20  # timed iterations per evaluation
    seed: int = 0  # seeds proposal order, parent draws and samplers: same seed, same programs
    proposals_per_generation: int = 4
    slots: int = 1  # evaluations at once (GPUs, or concurrent evaluations the evaluator takes)
    gate: str = "auto"  # "auto" | "manual"
    max_pending: int = 8  # manual gate: stop proposing while this many wait for a decision
    # A search ends when this many generations in a row bring nothing new (LLM answers that repeat the run, or
    # none); a generation of design-space slots only that finds no untried knob setting ends it at once.
    max_empty_generations: int = 3
    inspirations: int = 3
    failures_in_prompt: int = 3
    cell_features: list[str] = field(default_factory=lambda: list(DEFAULT_FEATURES))
    idle_poll_s: float = 0.2  # how often an idle engine looks for decisions and stop requests
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    islands: IslandConfig = field(default_factory=IslandConfig)
    selection: SelectionConfig = field(default_factory=SelectionConfig)
    phases: PhaseConfig = field(default_factory=PhaseConfig)
    novelty: NoveltyConfig = field(default_factory=NoveltyConfig)
    meta: MetaConfig = field(default_factory=MetaConfig)
    diagnosis: DiagnosisConfig = field(default_factory=DiagnosisConfig)  # LLM diagnoses of failed and slow programs
    design_space: DesignSpaceConfig = field(default_factory=DesignSpaceConfig)
    models: ModelsConfig = field(default_factory=ModelsConfig)  # per-role models (empty: the one client given)
    # Stop once a program's speed-up over the seed beats this ratio with its 95% interval clear of it (the
    # interval's lower bound above it; search/target.py). None: no target.
    target_ratio: float | None = None
    # More programs to start from (files, each checked like a --from result): evaluated at generation 0 next to
    # the baseline root, the i-th on island (i + 1) % islands, so islands start from different programs.
    initial_programs: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.backend not in ("nccl", "symm"):
            raise BadInput(f"backend {self.backend!r} is not one of nccl, symm")
        if self.world_size < 1:
            raise BadInput(f"world_size must be >= 1, got {self.world_size}")
        if self.proposals_per_generation < 1 or self.slots < 1 or self.max_empty_generations < 1:
            raise BadInput("proposals_per_generation, slots and max_empty_generations must be >= 1")
        if self.gate not in ("auto", "manual"):
            raise BadInput(f"gate {self.gate!r} is not one of auto, manual")
        if self.target_ratio is not None and not (isinstance(self.target_ratio, (int, float))
                                                  and not isinstance(self.target_ratio, bool)
                                                  and math.isfinite(self.target_ratio) and self.target_ratio > 0):
            raise BadInput(f"target_ratio must be a speed-up over the seed (a number > 0, e.g. 1.2), got "
                           f"{self.target_ratio!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SearchConfig:
        d = dict(d)
        sub = {"budget": BudgetConfig, "islands": IslandConfig, "selection": SelectionConfig,
               "novelty": NoveltyConfig, "meta": MetaConfig, "design_space": DesignSpaceConfig,
               "diagnosis": DiagnosisConfig}
        for k, t in sub.items():
            if isinstance(d.get(k), dict):
                d[k] = t(**d[k])
        if isinstance(d.get("models"), dict):
            d["models"] = ModelsConfig.from_dict(d["models"])
        if isinstance(d.get("phases"), dict):
            d["phases"] = PhaseConfig.from_dict(d["phases"])
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in known})
