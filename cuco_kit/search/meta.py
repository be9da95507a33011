"""The periodic meta-summary injected into prompts: what the search has learned so far.

Offline it is a statistical summary from the population: per knob value, how many programs were evaluated,
passed and failed, and their best and median speed-ups; which values are over-represented among the top
programs (won) and which mostly fail (lost); failure counts per level.

With an LLM (the ``meta`` role's model) it takes three steps, each one call through the run's ledger:
1. summarise the programs evaluated since the last summary (``search_meta``: their changes, results and
   diagnoses, with the statistics);
2. update the run's persistent scratchpad with that summary (``search_meta_scratchpad``): kept in the run's
   ``meta_summary`` metadata, so it carries across rounds and resumes;
3. rank recommendations for the next programs from the scratchpad, the best programs and the recent failures
   (``search_meta_recommend``).
Prompts get the scratchpad, the ranked recommendations and the statistics; the workbench's reasoning panel
shows all three steps. When a step fails or the budget is spent, the statistical text is used and the
scratchpad stays as it was.
"""
from __future__ import annotations

import logging
import re
import statistics
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

from cuco_kit import prompts
from cuco_kit.llm.client import LLMClient, LLMError
from cuco_kit.search.model_stats import purpose_with_model
from cuco_kit.search.population import Population, ProgramView

log = logging.getLogger("cuco_kit.search")


@dataclass
class KnobValueStats:
    knob: str
    value: str
    evaluated: int = 0
    passed: int = 0
    best: float | None = None
    median: float | None = None
    in_top: int = 0

    @property
    def failed(self) -> int:
        return self.evaluated - self.passed


def knob_statistics(population: Population, top_fraction: float = 0.25) -> list[KnobValueStats]:
    """Per (knob, value) statistics over evaluated programs (the reference seed excluded)."""
    evaluated = [p for p in population.evolvable()
                 if p.result is not None and p.result.get("verdict") != "unavailable"]
    scored = population.top(len(evaluated), evaluated)
    n_top = max(1, int(round(len(scored) * top_fraction))) if scored else 0
    top_ids = {p.id for p in scored[:n_top]}
    fits: dict[tuple[str, str], list[float]] = defaultdict(list)
    stats: dict[tuple[str, str], KnobValueStats] = {}
    for p in evaluated:
        for k, v in sorted(p.knobs.items()):
            s = stats.setdefault((k, v), KnobValueStats(k, v))
            s.evaluated += 1
            if p.fitness is not None:
                s.passed += 1
                fits[(k, v)].append(p.fitness)
            if p.id in top_ids:
                s.in_top += 1
    for key, s in stats.items():
        if fits[key]:
            s.best = max(fits[key])
            s.median = statistics.median(fits[key])
    return [stats[k] for k in sorted(stats)]


def statistical_summary(population: Population, *, top_fraction: float = 0.25, max_lines: int = 40) -> str:
    """The offline meta-summary (plain text, numbers from the population only)."""
    evaluated = [p for p in population.evolvable() if p.evaluated]
    if not evaluated:
        return "No program has been evaluated yet."
    scored = population.scored()
    lines = [f"{len(evaluated)} programs evaluated, {len(scored)} passed."]
    best = population.best()
    if best is not None:
        lines.append(f"Best so far: program {best.id} ({best.name or best.source}) at {best.fitness:.3f}x the seed; "
                     f"knobs {', '.join(f'{k}={v}' for k, v in sorted(best.knobs.items())) or 'none'}.")
    stats = knob_statistics(population, top_fraction)
    n_top = max(1, int(round(len(scored) * top_fraction))) if scored else 0
    won, lost, table = [], [], []
    for s in stats:
        share_all = s.evaluated / len(evaluated)
        share_top = s.in_top / n_top if n_top else 0.0
        table.append(f"  {s.knob}={s.value}: {s.evaluated} evaluated, {s.passed} passed"
                     + (f", best {s.best:.3f}x, median {s.median:.3f}x" if s.best is not None else "")
                     + (f", {s.in_top} in the top {n_top}" if n_top else ""))
        if n_top and s.in_top and share_top > share_all * 1.25:
            won.append(f"{s.knob}={s.value} ({s.in_top}/{n_top} of the top vs {share_all:.0%} of all)")
        if s.evaluated >= 2 and s.failed / s.evaluated >= 0.5:
            lost.append(f"{s.knob}={s.value} ({s.failed}/{s.evaluated} failed)")
        elif s.evaluated >= 2 and n_top and s.in_top == 0 and s.passed:
            lost.append(f"{s.knob}={s.value} (never in the top {n_top}; median {s.median:.3f}x)")
    if won:
        lines.append("Won: " + "; ".join(won) + ".")
    if lost:
        lines.append("Lost: " + "; ".join(lost) + ".")
    results = [p.result for p in evaluated if p.result is not None]  # evaluated: all of them
    fails = Counter((r.get("level_reached"), r.get("verdict")) for r in results
                    if r.get("verdict") not in ("pass", "unavailable"))
    if fails:
        lines.append("Failures: " + ", ".join(f"{n} {v} at {lvl}" for (lvl, v), n in sorted(fails.items())) + ".")
    if table:
        lines.append("Per knob value:")
        lines.extend(table)
    return "\n".join(lines[:max_lines])


_RANKED_RE = re.compile(r"^\s*(?:\d+[.)]|[-*])\s+(?P<item>\S.*)$")


@dataclass
class MetaConfig:
    interval: int = 3  # generations between summaries; 0 = never
    use_llm: bool = True  # when an LLM client is given
    max_tokens: int = 800  # per step
    recent: int = 12  # programs shown to step 1 at most (the newest since the last summary)


@dataclass
class MetaSummary:
    """One meta-summary: ``text`` is what prompts get; the steps' outputs are kept for the workbench."""

    text: str
    method: str  # "llm" | "statistical"
    statistics: str = ""
    summary: str = ""  # step 1: the recent programs
    scratchpad: str = ""  # step 2: the run's persistent scratchpad (the previous one when a step failed)
    recommendations: list[str] = field(default_factory=list)  # step 3, the most promising first

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def ranked(text: str) -> list[str]:
    """The items of a numbered (or bulleted) list in an answer, in order; every non-empty line when it has none."""
    items = [m.group("item").strip() for m in map(_RANKED_RE.match, text.splitlines()) if m]
    return items or [line.strip() for line in text.splitlines() if line.strip()]


def _program_line(p: ProgramView, population: Population) -> str:
    parent = population.get(p.parent_id)
    line = (f"- program {p.id} ({p.name or p.source}; {p.source}, generation {p.generation}, parent "
            f"{parent.id if parent else '-'}): {p.summary()}")
    if p.rationale:
        line += f"\n  rationale: {p.rationale[:300]}"
    if p.diagnosis:
        line += "\n  diagnosis: " + " / ".join(x.strip() for x in p.diagnosis.splitlines() if x.strip())[:400]
    return line


class MetaSummarizer:
    def __init__(self, config: MetaConfig, llm: LLMClient | None = None, *, workload: str = "", backend: str = "",
                 world_size: int = 1, model: str | None = None, scratchpad: str = "",
                 last_generation: int = 0) -> None:
        self.config = config
        self.llm = llm
        self.model = model  # the meta role's configured model (carried in the calls' purposes)
        self.workload, self.backend, self.world_size = workload, backend, world_size
        self.scratchpad = scratchpad  # carried from the run's stored meta-summary on resume
        self.last_generation = last_generation

    def due(self, generation: int) -> bool:
        return self.config.interval > 0 and generation > 0 and generation % self.config.interval == 0

    def _ask(self, prompt: str, step: str, **values: Any) -> str:
        text = prompts.render(prompt, workload=self.workload, backend=self.backend, world_size=self.world_size,
                              **values)
        assert self.llm is not None
        c = self.llm.complete([{"role": "system", "content": prompts.load("search_system")},
                               {"role": "user", "content": text}],
                              purpose=purpose_with_model(f"search.meta.{step}", self.model), temperature=0.2,
                              max_tokens=self.config.max_tokens)
        return c.text.strip()

    def summarize(self, population: Population, generation: int) -> MetaSummary:
        """The meta-summary after ``generation``: three LLM steps, else the statistical summary."""
        stats = statistical_summary(population)
        fallback = MetaSummary(text=stats, method="statistical", statistics=stats, scratchpad=self.scratchpad)
        if self.llm is None or not self.config.use_llm:
            return fallback
        recent = [p for p in population.evolvable() if p.evaluated and p.generation > self.last_generation]
        recent = recent[-self.config.recent:]
        best = "\n".join(f"- program {p.id} ({p.name or p.source}): {p.summary()}; knobs "
                         + ", ".join(f"{k}={v}" for k, v in sorted(p.knobs.items()))
                         for p in population.top(5)) or "none yet"
        failures = "\n".join(f.render(300) for f in population.failures(5)) or "none"
        try:
            summary = self._ask("search_meta", "summary", generation=generation, statistics=stats,
                                recent_programs="\n".join(_program_line(p, population) for p in recent)
                                or "none since the last summary")
            scratchpad = self._ask("search_meta_scratchpad", "scratchpad", generation=generation, statistics=stats,
                                   summary=summary, scratchpad=self.scratchpad or "(empty: this is the first update)")
            answer = self._ask("search_meta_recommend", "recommend", next_generation=generation + 1,
                               scratchpad=scratchpad, best_programs=best, failures=failures)
        except LLMError as exc:
            log.warning("meta-summary: LLM call failed (%s); using the statistical summary", exc)
            return fallback
        self.scratchpad, self.last_generation = scratchpad, generation
        recs = ranked(answer)
        text = ("Scratchpad (what the search has learned):\n" + scratchpad
                + "\n\nRecommendations, most promising first:\n"
                + "\n".join(f"{i}. {r}" for i, r in enumerate(recs, 1)) + "\n\nStatistics:\n" + stats)
        return MetaSummary(text=text, method="llm", statistics=stats, summary=summary, scratchpad=scratchpad,
                           recommendations=recs)
