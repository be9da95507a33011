"""Re-measuring a program before it is promoted: the rule, and the request that measures it again.

Why: the search promotes the program with the best measured ratio over the seed -- as the run's best, and as the
migrants an island sends to others. Over many noisy measurements the best one is partly the luckiest (the
winner's curse): a program whose true time is no better than the seed's can come out on top once, and then seed
other islands and be reported as an improvement. A second, independent measurement does not share the first one's
luck.

The rule: a promotion that claims the program beats the seed (its ratio above 1) is made only after the program
was evaluated again -- a fresh request seed (fresh inputs and noise), the seed measured beside it in the same
evaluator call (``EvalRequest.measure_seed``) -- and the re-measured ratio still beats the seed with its 95%
interval clear of it: the interval's lower bound above 1.0, the rule `search/target.py` applies to a target. An
evaluator that reports no interval (it does not measure the seed beside the candidate) is judged on the
re-measured ratio alone. A promotion that claims nothing over the seed (ratio <= 1, the best so far of a run that
has not beaten the seed yet) is not re-measured: there is no advantage to confirm.

The re-measure is an evaluation like any other (stored, counted in the run's evaluation budget, shown in its events
and log); its stored request says why it was made (``REQUEST_KEY``), which is how a resumed run finds its verdicts
again. The program's latest result, and so its fitness, is the re-measured one from then on. What a verdict leads to
(not copying a migrant, not announcing a best) is the engine's; the store only keeps the evaluations.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from cuco_kit.errors import BadInput
from cuco_kit.search.population import Population, ProgramView

# In a re-measure's stored request: {"purpose": one of PURPOSES, "claimed": the ratio it was promoted on}.
REQUEST_KEY = "remeasure"
PURPOSES = ("migrant", "best")
SEED_RATIO = 1.0  # the bar: the seed's own ratio
# Badges whose evaluators cannot measure again: a replay serves the recorded numbers (a second call repeats them),
# an unmeasured result has no time. Their promotions go as before.
CANNOT_REMEASURE = ("replayed", "unmeasured")


@dataclass
class RemeasureConfig:
    # On by default: a false elite costs more than the evaluation that catches it (it seeds other islands and is
    # reported as the run's result); the cost is one evaluation per program promoted with a claim over the seed.
    migrants: bool = True  # re-measure a program before it migrates to another island
    bests: bool = True  # re-measure a program before it is announced as the run's best
    iters: int | None = None  # timed iterations of a re-measure; None: the search's own `iters`

    def __post_init__(self) -> None:
        if self.iters is not None and (isinstance(self.iters, bool) or not isinstance(self.iters, int)
                                       or self.iters < 2):
            raise BadInput(f"remeasure.iters must be a count of timed iterations >= 2 (an interval needs two), "
                           f"got {self.iters!r}; or leave it out to use the search's iters")


@dataclass
class Verdict:
    program_id: int
    purpose: str
    held: bool
    claimed: float | None  # the ratio the program was promoted on
    ratio: float | None  # the re-measured ratio (None: it did not pass)
    ci: list[float] | None
    evaluation_id: int | None
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def supported(badge: str) -> bool:
    """Whether an evaluator with this badge can measure a program again (independently of its last result)."""
    return badge not in CANNOT_REMEASURE


def claims(p: ProgramView) -> bool:
    """Whether promoting ``p`` claims it beats the seed."""
    return p.fitness is not None and p.fitness > SEED_RATIO


def request_seed(run_seed: int, program_id: int, attempt: int) -> int:
    """The request seed of a program's ``attempt``-th re-measure: not the run's (that one drew the first
    measurement's inputs and noise), and the same on a resume (so a replayed run asks the same)."""
    return (int(run_seed) * 1_000_003 + int(program_id) * 7919 + 104_729 * (int(attempt) + 1)) % (2**31 - 1)


def _interval(result: dict[str, Any] | None) -> list[float] | None:
    ci = (result or {}).get("speedup_ci")
    if isinstance(ci, (list, tuple)) and len(ci) == 2 and all(
            isinstance(x, (int, float)) and math.isfinite(x) for x in ci):
        return [float(ci[0]), float(ci[1])]
    return None


def judge(p: ProgramView, *, purpose: str, claimed: float | None, evaluation_id: int | None) -> Verdict:
    """The verdict on ``p`` whose latest result is its re-measure: held when the re-measured ratio's interval is
    clear of the seed (no interval: the ratio itself above it)."""
    ci = _interval(p.result)
    if p.fitness is None:
        r = p.result or {}
        why = "flagged for review" if r.get("flagged") else f"{r.get('verdict', 'no result')} at " \
                                                              f"{r.get('level_reached', '?')}"
        return Verdict(p.id, purpose, False, claimed, None, ci, evaluation_id, f"re-measure did not pass ({why})")
    if ci is not None:
        held = ci[0] > SEED_RATIO
        where = "clear of" if held else "not clear of"
        reason = f"re-measured {p.fitness:.3f}x the seed, 95% interval [{ci[0]:.3f}, {ci[1]:.3f}] {where} the seed"
    else:
        held = p.fitness > SEED_RATIO
        reason = (f"re-measured {p.fitness:.3f}x the seed (no interval: the evaluator measured no seed beside it), "
                  f"{'still' if held else 'no longer'} above the seed")
    if claimed is not None:
        reason += f"; claimed {claimed:.3f}x"
    return Verdict(p.id, purpose, held, claimed, p.fitness, ci, evaluation_id, reason)


def rebuild(evaluations: Iterable[Mapping[str, Any]], population: Population) -> dict[int, Verdict]:
    """The verdicts of a stored run (on resume): a program's latest finished re-measure, judged on its result as
    the population holds it (its latest)."""
    out: dict[int, Verdict] = {}
    for ev in evaluations:
        tag = (ev.get("request") or {}).get(REQUEST_KEY)
        p = population.get(ev["program_id"])
        if not isinstance(tag, dict) or ev["status"] != "done" or p is None or p.evaluation_id != ev["id"]:
            continue
        claimed = tag.get("claimed")
        out[p.id] = judge(p, purpose=str(tag.get("purpose", "")), evaluation_id=ev["id"],
                          claimed=float(claimed) if isinstance(claimed, (int, float)) else None)
    return out


def tag(purpose: str, claimed: float | None) -> dict[str, Any]:
    """What a re-measure's stored request carries under REQUEST_KEY."""
    return {"purpose": purpose, "claimed": claimed}
