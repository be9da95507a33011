"""The periodic meta-summary injected into prompts: what the search has learned so far.

Offline it is a statistical summary from the population: per knob value, how many programs were evaluated,
passed and failed, and their best and median speed-ups; which values are over-represented among the top
programs (won) and which mostly fail (lost); failure counts per level. With an LLM, the same statistics plus
the best programs and recent failures go through the ``search_meta`` prompt, and the statistical text is the
fallback when the call fails or the budget is spent.
"""
from __future__ import annotations

import logging
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass

from cuco_kit import prompts
from cuco_kit.llm.client import LLMClient, LLMError
from cuco_kit.search.population import Population

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


@dataclass
class MetaConfig:
    interval: int = 3  # generations between summaries; 0 = never
    use_llm: bool = True  # when an LLM client is given
    max_tokens: int = 800


class MetaSummarizer:
    def __init__(self, config: MetaConfig, llm: LLMClient | None = None, *, workload: str = "", backend: str = "",
                 world_size: int = 1) -> None:
        self.config = config
        self.llm = llm
        self.workload, self.backend, self.world_size = workload, backend, world_size

    def due(self, generation: int) -> bool:
        return self.config.interval > 0 and generation > 0 and generation % self.config.interval == 0

    def summarize(self, population: Population, generation: int) -> tuple[str, str]:
        """(summary text, method "llm" | "statistical")."""
        stats = statistical_summary(population)
        if self.llm is None or not self.config.use_llm:
            return stats, "statistical"

        best = "\n".join(f"- program {p.id} ({p.name or p.source}): {p.summary()}; knobs "
                         + ", ".join(f"{k}={v}" for k, v in sorted(p.knobs.items()))
                         for p in population.top(5)) or "none yet"
        failures = "\n".join(f.render(300) for f in population.failures(5)) or "none"
        text = prompts.render("search_meta", workload=self.workload, backend=self.backend,
                              world_size=self.world_size, generation=generation, statistics=stats,
                              best_programs=best, failures=failures)
        try:
            c = self.llm.complete([{"role": "system", "content": prompts.load("search_system")},
                                   {"role": "user", "content": text}], purpose="search.meta",
                                  temperature=0.2, max_tokens=self.config.max_tokens)
        except LLMError as exc:
            log.warning("meta-summary: LLM call failed (%s); using the statistical summary", exc)
            return stats, "statistical"
        return c.text.strip() + "\n\nStatistics:\n" + stats, "llm"
