"""`SearchConfig`: every knob of the search in one JSON-serialisable dataclass with defaults that work."""
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

from cuco_kit.errors import BadInput
from cuco_kit.search.archive import DEFAULT_FEATURES
from cuco_kit.search.budget import BudgetConfig
from cuco_kit.search.design_space import DesignSpaceConfig
from cuco_kit.search.diagnosis import DiagnosisConfig
from cuco_kit.search.gate import GateMode
from cuco_kit.search.islands import IslandConfig
from cuco_kit.search.meta import MetaConfig
from cuco_kit.search.models import ModelsConfig
from cuco_kit.search.novelty import NoveltyConfig
from cuco_kit.search.phases import PhaseConfig, PhaseSettings
from cuco_kit.search.remeasure import RemeasureConfig
from cuco_kit.search.selection import SelectionConfig

TIMELINE_CHOICES = ("every", "off")
# How candidates talk across ranks: host NCCL collectives, or the runtime's symmetric memory (several ranks may
# share a GPU). The evaluator's request carries the same names.
Backend = Literal["nccl", "symm"]
BACKENDS: tuple[Backend, ...] = ("nccl", "symm")

# The tables of a SearchConfig that are plain dataclasses (models and phases have their own from_dict).
TABLES: dict[str, type] = {"budget": BudgetConfig, "islands": IslandConfig, "selection": SelectionConfig,
                           "novelty": NoveltyConfig, "meta": MetaConfig, "design_space": DesignSpaceConfig,
                           "diagnosis": DiagnosisConfig, "remeasure": RemeasureConfig}


def _names(cls: type) -> list[str]:
    return [f.name for f in fields(cls)]


def _refuse_unknown(d: dict[str, Any], known: Iterable[str], where: str) -> None:
    known = list(known)
    unknown = sorted(str(k) for k in d if k not in known)
    if unknown:
        raise BadInput(f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; known: {', '.join(known)}")


def _table(d: dict[str, Any], key: str) -> dict[str, Any] | None:
    """``d[key]`` when it is a table; None when absent; BadInput when it is something else."""
    v = d.get(key)
    if v is None or isinstance(v, dict):
        return v
    raise BadInput(f"[{key}] must be a table of settings, got {v!r}")


@dataclass
class SearchConfig:
    world_size: int = 1
    backend: Backend = "nccl"
    params: dict[str, int] = field(default_factory=dict)  # workload parameter overrides
    iters: int = 20  # timed iterations per evaluation
    seed: int = 0  # seeds proposal order, parent draws and samplers: same seed, same programs
    proposals_per_generation: int = 4
    slots: int = 1  # evaluations at once (GPUs, or concurrent evaluations the evaluator takes)
    gate: GateMode = "auto"
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
    # Measure a program again, beside the seed, before it migrates or is announced as the run's best
    # (search/remeasure.py); each check is one more evaluation.
    remeasure: RemeasureConfig = field(default_factory=RemeasureConfig)
    # Stop once a program's speed-up over the seed beats this ratio with its 95% interval clear of it (the
    # interval's lower bound above it; search/target.py). None: no target.
    target_ratio: float | None = None
    # More programs to start from (files, each checked like a --from result): evaluated at generation 0 next to
    # the baseline root, the i-th on island (i + 1) % islands, so islands start from different programs.
    initial_programs: list[str] = field(default_factory=list)
    # Which evaluations also record the per-rank kernel timeline the overlap column is read from
    # (cuco_kit.evaluate.overlap): "every" program, "off". It costs one more untimed step per rank under
    # torch.profiler after timing (never part of the score): the profiler's start-up and one iteration, per
    # evaluation that passes L2.
    timeline: str = "every"

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:  # a value read from a file or a stored run is checked here
            raise BadInput(f"backend {self.backend!r} is not one of {', '.join(BACKENDS)}")
        if self.world_size < 1:
            raise BadInput(f"world_size must be >= 1, got {self.world_size}")
        if self.proposals_per_generation < 1 or self.slots < 1 or self.max_empty_generations < 1:
            raise BadInput("proposals_per_generation, slots and max_empty_generations must be >= 1")
        if self.timeline not in TIMELINE_CHOICES:
            raise BadInput(f"timeline {self.timeline!r} is not one of {', '.join(TIMELINE_CHOICES)}")
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
    def from_dict(cls, d: dict[str, Any], *, strict: bool = False) -> SearchConfig:
        """The config of ``d``. ``strict`` (a file the user wrote, `cuco search --config`): a key this code does
        not know, at the top or in any table, is refused by name, and so is a value of the wrong kind (one line);
        otherwise (a stored run's config, maybe from a newer version) an unknown key is left out."""
        d = dict(d)
        if not strict:
            return cls._build(d, strict=False)
        _refuse_unknown(d, _names(cls), "search config")
        try:
            return cls._build(d, strict=True)
        except TypeError as exc:  # a value of the wrong kind (a string where a number goes, ...)
            raise BadInput(f"search config: a value is missing or of the wrong kind ({exc})") from None

    @classmethod
    def _build(cls, d: dict[str, Any], *, strict: bool) -> SearchConfig:
        for k, t in TABLES.items():
            table = _table(d, k) if strict else (d.get(k) if isinstance(d.get(k), dict) else None)
            if table is not None:
                if strict:
                    _refuse_unknown(table, _names(t), f"[{k}]")
                d[k] = t(**{n: v for n, v in table.items() if n in _names(t)})
        phases = _table(d, "phases") if strict else (d.get("phases") if isinstance(d.get("phases"), dict) else None)
        if phases is not None:
            if strict:
                _refuse_unknown(phases, _names(PhaseConfig), "[phases]")
                for k in ("explore", "exploit"):
                    if (sub := _table(phases, k)) is not None:
                        _refuse_unknown(sub, _names(PhaseSettings), f"[phases.{k}]")
            d["phases"] = PhaseConfig.from_dict(phases)
        if isinstance(d.get("models"), dict):
            d["models"] = ModelsConfig.from_dict(d["models"], strict=strict)
        known = set(_names(cls))
        return cls(**{k: v for k, v in d.items() if k in known})

