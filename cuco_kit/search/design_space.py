"""The offline mutation source: Optuna ask-and-tell over the knob block, structural placement knobs included.
Written sets are categorical distributions; numeric range knobs are IntDistributions (pow2 ranges over the
exponent), so the samplers see order and distance, not unrelated labels.

Optuna has no lineage, so each proposal uses a throwaway in-memory study for its lineage node (the parent):
the parent's own values are enqueued first (``enqueue_trial``) and told with its result, the parent's
evaluated children are added as finished trials from our store's results, and then the sampler is asked for
new points. Combinations known to fail (earlier failures in the lineage, a point that breaks one of the knob
block's rules, or a user predicate) are infeasible through ``constraints_func``, and a point the sampler asks for
anyway is told failed and never proposed: no invalid point reaches evaluation. Every point asked for becomes
SEARCH/REPLACE edits of the knob lines, applied by cuco_kit.source.patch exactly like an LLM's diff, so
design-space proposals carry the same diff format.

Samplers: ``GPSampler`` for small budgets run one at a time (it needs scipy and torch; when they are missing
TPE is used and the fallback is logged once), ``TPESampler(multivariate=True, constant_liar=True)`` when
evaluations run in parallel. Sampler seeds derive from the run's seed, the parent and the lineage size, so a
seeded run asks the same points again.

``RandomKnobSource`` samples the same space uniformly without repeats, drawing again while a knob rule fails: the
baseline the model-based search is compared against at equal evaluation budget (the search benchmark,
search_vs_random).
"""
from __future__ import annotations

import itertools
import logging
import math
import random
import warnings
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cuco_kit.search.population import ProgramView
from cuco_kit.search.proposal import Proposal, ProposalContext, unified_diff
from cuco_kit.source import knob_rules, markers, patch

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution

log = logging.getLogger("cuco_kit.search")

# Knob names that select a structural variant; changing one is tagged "placement" for viewers (advisory).
_STRUCTURAL_WORDS = ("placement", "issuer", "scope", "sync", "variant", "fuse", "fusion", "stream")


@dataclass
class DesignSpaceConfig:
    sampler: str = "auto"  # "auto" | "gp" | "tpe" | "random"
    gp_max_evaluations: int = 60  # "auto" uses GP (one at a time) up to this many evaluated programs in the run
    n_startup_trials: int = 4  # sampler's random start before modelling
    max_asks: int = 30  # asks per proposal before the sampler is given up for this proposal
    # A space of at most this many points is walked point by point when the sampler finds nothing untried, so
    # "no proposal" means every point is tried (the search then ends: "design space exhausted").
    enumerable_points: int = 4096
    failed_value: float = 0.0  # value told for a failed combination (speed-up 0)


def distributions(knobs: list[markers.Knob]) -> dict[str, BaseDistribution]:
    """Optuna's distribution of each knob: a written set is categorical; a range knob an IntDistribution (with
    its step), a pow2 knob an IntDistribution over the exponent, so the sampler models order and distance."""
    import optuna

    out: dict[str, BaseDistribution] = {}
    for k in knobs:
        if k.range is None:
            out[k.name] = optuna.distributions.CategoricalDistribution(list(k.allowed))
        elif k.range.kind == "pow2":
            out[k.name] = optuna.distributions.IntDistribution(_log2(k.range.low), _log2(k.range.high))
        else:
            out[k.name] = optuna.distributions.IntDistribution(k.range.low, k.range.high, step=k.range.step)
    return out


def _log2(v: int) -> int:
    return int(v).bit_length() - 1


def to_params(by_name: dict[str, markers.Knob], values: dict[str, str]) -> dict[str, Any]:
    """Knob values (source tokens) -> Optuna params of `distributions`."""
    out: dict[str, Any] = {}
    for n, v in values.items():
        r = by_name[n].range
        out[n] = v if r is None else _log2(int(v)) if r.kind == "pow2" else int(v)
    return out


def from_params(by_name: dict[str, markers.Knob], params: dict[str, Any]) -> dict[str, str]:
    """Optuna params of `distributions` -> knob values (source tokens)."""
    out: dict[str, str] = {}
    for n, v in params.items():
        r = by_name[n].range
        out[n] = str(v) if r is None else str(1 << int(v)) if r.kind == "pow2" else str(int(v))
    return out


class DesignSpaceSource:
    """Proposals that move knob values (``kinds = ("design_space",)``)."""

    name = "design_space"
    kinds: tuple[str, ...] = ("design_space",)

    def __init__(self, config: DesignSpaceConfig | None = None,
                 is_valid: Callable[[dict[str, str]], bool] | None = None) -> None:
        self.config = config or DesignSpaceConfig()
        self.is_valid = is_valid  # user constraint over knob values (e.g. chunks must divide the tile)
        self._gp_warned = False
        self.last_sampler = ""

    # -- sampler --------------------------------------------------------------------------------------------
    def _sampler(self, ctx: ProposalContext, seed: int, constraints: Callable[..., Any]) -> Any:
        import optuna

        want = self.config.sampler
        if want == "auto":
            small = len(ctx.population.scored()) <= self.config.gp_max_evaluations
            want = "gp" if ctx.parallel <= 1 and small else "tpe"
        if want == "gp":
            try:
                import scipy  # noqa: F401 - probe: GPSampler needs it at ask time, not at construction
                import torch  # noqa: F401 - probe, as scipy

                self.last_sampler = "GPSampler"
                with warnings.catch_warnings():
                    # Optuna 5 deprecates constraints_func (still honoured) with a FutureWarning per sampler.
                    warnings.simplefilter("ignore", FutureWarning)
                    return optuna.samplers.GPSampler(seed=seed, n_startup_trials=self.config.n_startup_trials,
                                                     constraints_func=constraints, deterministic_objective=False)
            except ImportError as exc:
                if not self._gp_warned:
                    log.info("design space: GPSampler unavailable (%s); using TPESampler", exc)
                    self._gp_warned = True
        if want == "random":
            self.last_sampler = "RandomSampler"
            return optuna.samplers.RandomSampler(seed=seed)
        self.last_sampler = "TPESampler"
        with warnings.catch_warnings():
            # multivariate/constant_liar are "experimental" in some versions; constraints_func deprecated in 5
            warnings.simplefilter("ignore")
            return optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True,
                                              n_startup_trials=self.config.n_startup_trials,
                                              constraints_func=constraints)

    # -- proposing ------------------------------------------------------------------------------------------
    def propose(self, ctx: ProposalContext) -> list[Proposal]:
        import optuna

        parent = ctx.parent
        try:
            knobs = markers.knobs(parent.code)
            rules = knob_rules.rules(parent.code)
        except Exception as exc:  # noqa: BLE001 - a parent without a usable knob block has no design space
            log.info("design space: program %s has no usable knob block (%s)", parent.id, exc)
            return []
        if not knobs:
            return []
        dists = distributions(knobs)
        by_name = {k.name: k for k in knobs}
        allowed = {k.name: k.allowed for k in knobs}
        parent_values = {k.name: k.value for k in knobs}
        known_bad: set[tuple[str, ...]] = set()

        def key(values: dict[str, Any]) -> tuple[str, ...]:
            return tuple(str(values[n]) for n in dists)

        rejected: dict[str, int] = {}  # why points were refused before evaluation: the broken rule, the predicate

        def allowed_point(values: dict[str, str]) -> bool:
            broken = knob_rules.first_broken(rules, values)
            if broken is None and (self.is_valid is None or self.is_valid(values)):
                return True
            why = broken.label if broken is not None else "the search's own predicate (is_valid)"
            rejected[why] = rejected.get(why, 0) + 1
            return False

        def constraints(trial: Any) -> list[float]:
            # Infeasible (> 0) when the lineage saw this combination fail, a knob rule does not hold there or the
            # user predicate rejects it.
            params = from_params(by_name, trial.params)
            if len(params) != len(dists):
                return [0.0]
            bad = key(params) in known_bad or not knob_rules.is_valid(rules, params) or (
                self.is_valid is not None and not self.is_valid(params))
            return [1.0 if bad else 0.0]

        lineage = [c for c in ctx.population.children_of(parent.id) if c.evaluated]
        seed = zlib.crc32(f"{ctx.seed}/{parent.id}/{len(lineage)}/{ctx.generation}/{ctx.island}".encode())
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = optuna.create_study(direction="maximize", sampler=self._sampler(ctx, seed, constraints))
        seen: dict[tuple[str, ...], ProgramView | None] = {key(parent_values): parent}

        # The parent's point first: enqueued, asked, told with what the store knows of it.
        study.enqueue_trial(to_params(by_name, parent_values))
        t = study.ask(dists)
        self._tell(study, t, parent, known_bad, key(parent_values))
        for child in lineage:
            values = {k: v for k, v in child.knobs.items() if k in dists}
            if set(values) != set(dists) or any(values[n] not in allowed[n] for n in dists):
                continue  # a child whose knob set changed cannot be a point of this space
            if key(values) in seen:
                continue
            seen[key(values)] = child
            fit = child.fitness
            if fit is None:
                known_bad.add(key(values))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                study.add_trial(optuna.trial.create_trial(
                    params=to_params(by_name, values), distributions=dists,
                    value=fit if fit is not None else self.config.failed_value,
                    system_attrs={"constraints": [0.0 if fit is not None else 1.0]}))

        existing = {p.code for p in ctx.population.all()}
        out: list[Proposal] = []
        asks = 0
        while len(out) < ctx.n and asks < self.config.max_asks:
            asks += 1
            trial = study.ask(dists)
            values = from_params(by_name, trial.params)
            k = key(values)
            if k in seen or not allowed_point(values):
                # Already measured (or proposed in this batch), or invalid: tell what we know so the sampler
                # moves on (an invalid point is told failed, never evaluated).
                self._tell(study, trial, seen.get(k), known_bad, k)
                continue
            code = self._apply(parent.code, knobs, values)
            if code is None or code in existing:
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
                continue
            seen[k] = None  # pending: constant_liar treats it as running
            existing.add(code)
            out.append(self._proposal(ctx, parent, parent_values, values, code, len(lineage), trial.number))
        if not out and math.prod(len(k.allowed) for k in knobs) <= self.config.enumerable_points:
            # The sampler found nothing untried: walk the untried points (in a seeded order), so that an empty
            # answer means the space is spent (the engine then ends the search).
            points = [dict(zip(allowed, combo)) for combo in itertools.product(*allowed.values())]
            random.Random(seed).shuffle(points)
            for values in points:
                if len(out) == ctx.n:
                    break
                if key(values) in seen or not allowed_point(values):
                    continue
                code = self._apply(parent.code, knobs, values)
                if code is None or code in existing:
                    continue
                seen[key(values)] = None
                existing.add(code)
                out.append(self._proposal(ctx, parent, parent_values, values, code, len(lineage), None))
        self._log_rejected(parent.id, rejected)
        return out

    @staticmethod
    def _log_rejected(parent_id: int, rejected: dict[str, int]) -> None:
        for why, n in sorted(rejected.items(), key=lambda kv: -kv[1]):
            log.info("design space: %d point(s) near program %s refused before evaluation: %s", n, parent_id, why)

    def _tell(self, study: Any, trial: Any, program: ProgramView | None, known_bad: set[tuple[str, ...]],
              k: tuple[str, ...]) -> None:
        import optuna

        if program is None or not program.evaluated:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
        elif program.fitness is None:
            known_bad.add(k)
            study.tell(trial, self.config.failed_value)
        else:
            study.tell(trial, program.fitness)

    @staticmethod
    def _apply(code: str, knobs: list[markers.Knob], values: dict[str, str]) -> str | None:
        """SEARCH/REPLACE edits of the changed knob lines (each line is unique: a knob is declared once),
        applied with cuco_kit.source.patch, the path an LLM's diff takes."""
        target = markers.set_knobs(code, values).split("\n")
        lines = code.split("\n")
        edits = [patch.Edit(lines[k.line - 1], target[k.line - 1]) for k in knobs if values[k.name] != k.value]
        if not edits:
            return None
        try:
            return patch.apply_edits(code, edits)
        except patch.PatchError as exc:
            log.warning("design space: could not apply knob edits: %s", exc)
            return None

    def _proposal(self, ctx: ProposalContext, parent: ProgramView, old: dict[str, str], new: dict[str, str],
                  code: str, lineage: int, trial_no: int | None) -> Proposal:
        """A proposal of the point ``new``; ``trial_no`` None: an untried point taken when the sampler had none."""
        changed = [n for n in new if new[n] != old[n]]
        name = "knobs: " + ", ".join(f"{n} {old[n]}->{new[n]}" for n in changed)
        structural = [n for n in changed if any(w in n.lower() for w in _STRUCTURAL_WORDS)]
        tags = ["design_space"] + (["placement"] if structural else []) + [f"knob:{n}" for n in changed]
        plain = markers.plain_knob
        moves = ", ".join(f"{plain(n)} {plain(old[n])} -> {plain(new[n])}" for n in changed)
        picked = (f"the {_SAMPLER_WORDS.get(self.last_sampler, 'sampler')} picked this point of the knob block "
                  f"after {lineage} measured sibling(s) ({self.last_sampler}, trial {trial_no})"
                  if trial_no is not None else
                  f"an untried point of the knob block: the {self.last_sampler} kept asking for tried ones after "
                  f"{lineage} measured sibling(s)")
        rationale = f"Try {moves} on program #{parent.id}: {picked}."
        sampler = self.last_sampler if trial_no is not None else "untried point"
        return Proposal(name=name[:120], rationale=rationale, diff=unified_diff(parent.code, code), tags=tags,
                        source="design_space", parent_id=parent.id, code=code,
                        meta={"sampler": sampler, "trial": trial_no, "params": new})


_SAMPLER_WORDS = {"GPSampler": "Gaussian-process model of the measured points",
                  "TPESampler": "tree-structured Parzen estimator over the measured points",
                  "RandomSampler": "random sampler"}


class RandomKnobSource:
    """Uniform random points of the knob block, never one the run already has: the baseline a model-based
    design-space search must beat at equal evaluation budget (``kinds = ("design_space",)``, so it drops into
    the same slots; proposals carry the same diff format and ``source="design_space"``, tagged "random").

    Points are drawn with the context's seeded RNG, so a seeded run samples the same points again. The parent
    only supplies the knob block (every point is the parent's code with all knob lines set), so a parent
    without one falls back to a root that has one."""

    name = "random"
    kinds: tuple[str, ...] = ("design_space",)

    def __init__(self, max_draws_per_proposal: int = 200) -> None:
        self.max_draws_per_proposal = max_draws_per_proposal

    def propose(self, ctx: ProposalContext) -> list[Proposal]:
        base, knobs, rules = None, [], []
        for cand in [ctx.parent, *ctx.population.roots()]:
            try:
                knobs = markers.knobs(cand.code)
                rules = knob_rules.rules(cand.code)
            except Exception:  # noqa: BLE001 - no usable knob block: try the next candidate
                knobs = []
            if knobs:
                base = cand
                break
        if base is None:
            log.info("random knobs: neither program %s nor a root has a knob block", ctx.parent.id)
            return []
        names = [k.name for k in knobs]
        base_values = {k.name: k.value for k in knobs}
        seen = {tuple(str(p.knobs.get(n)) for n in names) for p in ctx.population.all()
                if set(names) <= set(p.knobs)}
        seen.add(tuple(base_values[n] for n in names))
        existing = {p.code for p in ctx.population.all()}
        out: list[Proposal] = []
        draws = 0
        rejected: dict[str, int] = {}
        while len(out) < ctx.n and draws < self.max_draws_per_proposal * ctx.n:
            draws += 1
            values = {k.name: ctx.rng.choice(list(k.allowed)) for k in knobs}
            point = tuple(values[n] for n in names)
            if point in seen:
                continue
            seen.add(point)
            broken = knob_rules.first_broken(rules, values)
            if broken is not None:  # an invalid point is drawn again, never proposed (uniform over the valid points)
                rejected[broken.label] = rejected.get(broken.label, 0) + 1
                continue
            code = DesignSpaceSource._apply(base.code, knobs, values)
            if code is None or code in existing:
                continue
            existing.add(code)
            changed = [n for n in names if values[n] != base_values[n]]
            structural = [n for n in changed if any(w in n.lower() for w in _STRUCTURAL_WORDS)]
            out.append(Proposal(
                name=("random knobs: " + ", ".join(f"{n}={values[n]}" for n in names))[:120],
                rationale=f"uniform random point of the knob block of program {base.id} (draw {draws})",
                diff=unified_diff(base.code, code),
                tags=["design_space", "random"] + (["placement"] if structural else [])
                + [f"knob:{n}" for n in changed],
                source="design_space", parent_id=base.id, code=code,
                meta={"sampler": "uniform random", "params": values}))
        DesignSpaceSource._log_rejected(base.id, rejected)
        return out
