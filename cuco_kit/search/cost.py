"""What a proposal costs: LLM dollars and GPU seconds, expected before it is approved and actual after.

Approving a proposal spends two things:
- GPU seconds: its evaluation. Expected: the mean time of the run's last `CostConfig.recent_evaluations`
  finished evaluations times the ranks each used; actual: its own evaluation's time times its ranks (the
  evaluator's `eval_seconds` when recorded, else start to finish in the store). Time of a replayed evaluation is
  the recorded run's and of a simulated one made up; both are badged so (no GPU was used here).
- LLM dollars: an LLM proposal that does not build goes back to its model for a repair (`build_repairs`). Expected:
  the share of the recent LLM programs that failed to build, times the tokens of one answer of that model (the
  mean of the run's recorded proposals of that model) priced with the table (`cuco_kit.llm.prices`); actual:
  what the repair proposals made for its program cost. A model the table does not know gives "unknown price",
  never a number; a proposal no LLM wrote costs no LLM dollars.
What the proposal itself cost to write is already spent when it waits; it is shown beside ("proposed for").
"""
from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cuco_kit.llm import prices as price_table
from cuco_kit.search.model_stats import MODEL_TAG
from cuco_kit.store import Store

# Store meta key: proposal id (as text) -> {model, prompt_tokens, completion_tokens, dollars, repairs}.
PROPOSAL_LLM_KEY = "proposal_llm"
LLM_SOURCES = ("llm_diff", "llm_full", "llm_crossover")


@dataclass
class CostConfig:
    prices: dict[str, tuple[float, float]] = field(default_factory=dict)  # model -> ($/Mtok in, out) overrides
    recent_evaluations: int = 10  # the window the expected GPU time and build-failure share are read from
    build_repairs: int = 1  # as LLMSourceConfig.build_repairs: repair calls a failed build triggers (0: none)


@dataclass(frozen=True)
class Cost:
    state: str  # "expected" (before approval) or "actual" (after its evaluation) or "none" (rejected)
    gpu_seconds: float | None
    gpu_note: str
    llm_dollars: float | None
    llm_note: str
    proposed_dollars: float | None = None  # what writing the proposal cost (spent already); None: unknown
    proposed_note: str = ""
    gpu_badge: str = "real"  # the badge of the evaluations the GPU time comes from

    def text(self) -> str:
        """'expected: 4.1 GPU-s, $0.0012 LLM' with what is unknown said in words."""
        if self.state == "none":
            return "cost: nothing spent after proposing (rejected)"
        gpu = f"{self.gpu_seconds:.1f} GPU-s" if self.gpu_seconds is not None else f"GPU time unknown ({self.gpu_note})"
        if self.gpu_seconds is not None and self.gpu_badge != "real":
            gpu += f" [{self.gpu_badge.upper() if self.gpu_badge == 'simulated' else self.gpu_badge}]"
        if self.llm_dollars is None:
            llm = f"LLM {self.llm_note}"
        elif self.llm_dollars == 0 and self.llm_note.startswith("no LLM"):
            llm = "no LLM call"
        else:
            llm = f"${self.llm_dollars:.4f} LLM"
        out = f"{self.state}: {gpu}, {llm}"
        if self.proposed_dollars:
            out += f"; proposed for ${self.proposed_dollars:.4f}"
        elif self.proposed_note:
            out += f"; proposed for: {self.proposed_note}"
        return out


def record_proposal_llm(store: Store, run_id: int, proposal_id: int, meta: Mapping[str, Any]) -> None:
    """Keep the tokens and model of the answer that became proposal `proposal_id` (from Proposal.meta)."""
    table = dict(store.get_meta(run_id, PROPOSAL_LLM_KEY, {}) or {})
    table[str(proposal_id)] = {k: meta.get(k) for k in ("model", "prompt_tokens", "completion_tokens", "dollars",
                                                          "repairs")}
    store.put_meta(run_id, PROPOSAL_LLM_KEY, table)


def proposal_llm(store: Store, run_id: int) -> dict[int, dict[str, Any]]:
    return {int(k): v for k, v in (store.get_meta(run_id, PROPOSAL_LLM_KEY, {}) or {}).items()}


def model_of(proposal: Mapping[str, Any]) -> str | None:
    return next((t[len(MODEL_TAG):] for t in proposal.get("tags") or [] if str(t).startswith(MODEL_TAG)), None)


def dollars_of(rec: Mapping[str, Any], prices: Mapping[str, tuple[float, float]] | None = None) -> float | None:
    """The dollars of one recorded answer: what the client priced, else tokens x the table; None when unknown."""
    if rec.get("dollars") is not None:
        return float(rec["dollars"])
    return price_table.cost(str(rec.get("model") or ""), rec.get("prompt_tokens"), rec.get("completion_tokens"),
                            prices)


def _finished(store: Store, run_id: int) -> list[dict[str, Any]]:
    return [e for e in store.evaluation_summaries(run_id)
            if e["status"] == "done" and e.get("finished_at") is not None]


def gpu_seconds(evaluation: Mapping[str, Any]) -> float:
    """Time of one finished evaluation times the ranks it held: the evaluator's own `eval_seconds` when its
    provenance has it (a replayed one carries the recorded run's), else the store's start-to-finish wall time."""
    recorded = (evaluation.get("provenance") or {}).get("eval_seconds")
    wall = float(recorded) if isinstance(recorded, (int, float)) else \
        float(evaluation["finished_at"]) - float(evaluation["started_at"])
    return max(0.0, wall) * int(evaluation["world_size"])


def expected_gpu(store: Store, run_id: int, n: int = 10) -> tuple[float | None, str, str]:
    """(mean GPU seconds of the last `n` finished evaluations or None, what it is, their badge)."""
    recent = _finished(store, run_id)[-n:]
    if not recent:
        return None, "no evaluation has finished yet", "real"
    badges = {str(e.get("badge")) for e in recent}
    badge = "real" if badges == {"real"} else ("simulated" if "simulated" in badges else "replayed")
    return statistics.fmean(gpu_seconds(e) for e in recent), f"mean of the last {len(recent)} evaluation(s)", badge


def build_failure_share(store: Store, run_id: int, n: int = 10) -> tuple[float | None, int]:
    """The share of the last `n` finished evaluations of LLM programs that failed at L1 (build), and how many."""
    sources = {p["id"]: p["source"] for p in store.programs(run_id)}
    recent = [e for e in _finished(store, run_id) if sources.get(e["program_id"]) in LLM_SOURCES][-n:]
    if not recent:
        return None, 0
    failed = sum(e.get("verdict") != "pass" and e.get("level_reached") == "L1" for e in recent)
    return failed / len(recent), len(recent)


def _mean_tokens(records: Iterable[Mapping[str, Any]], model: str) -> tuple[float, float] | None:
    same = [r for r in records if r.get("model") == model and r.get("prompt_tokens") is not None
            and r.get("completion_tokens") is not None]
    if not same:
        return None
    return (statistics.fmean(float(r["prompt_tokens"]) for r in same),
            statistics.fmean(float(r["completion_tokens"]) for r in same))


def expected_llm(store: Store, run_id: int, proposal: Mapping[str, Any],
                 config: CostConfig) -> tuple[float | None, str]:
    """(expected LLM dollars approving `proposal` triggers, or None; what it is)."""
    if proposal.get("source") not in LLM_SOURCES:
        return 0.0, f"no LLM call follows ({proposal.get('source')})"
    if config.build_repairs <= 0:
        return 0.0, "build repairs are off"
    model = model_of(proposal)
    if model is None:
        return None, "unknown model"
    if price_table.lookup(model, config.prices) is None:
        return None, f"unknown price ({model})"
    share, seen = build_failure_share(store, run_id, config.recent_evaluations)
    if share is None:
        return None, "unknown (no LLM program evaluated yet)"
    tokens = _mean_tokens(proposal_llm(store, run_id).values(), model)
    if tokens is None:
        return None, f"unknown (no recorded answer of {model})"
    one = price_table.cost(model, round(tokens[0]), round(tokens[1]), config.prices) or 0.0
    return share * one * config.build_repairs, (f"{share:.0%} of {seen} LLM program(s) failed to build x one "
                                                f"repair answer of {model}")


def proposed_for(store: Store, run_id: int, proposal: Mapping[str, Any],
                 config: CostConfig) -> tuple[float | None, str]:
    rec = proposal_llm(store, run_id).get(int(proposal["id"]))
    if rec is None:
        return (0.0, "") if proposal.get("source") not in LLM_SOURCES else (None, "not recorded")
    d = dollars_of(rec, config.prices)
    return d, "" if d is not None else f"unknown price ({rec.get('model')})"


def proposal_cost(store: Store, run_id: int, proposal: Mapping[str, Any], config: CostConfig | None = None) -> Cost:
    """Expected while `proposal` waits or its evaluation has not finished; actual once it has; none if rejected."""
    cfg = config or CostConfig()
    proposed, proposed_note = proposed_for(store, run_id, proposal, cfg)
    status = proposal.get("status")
    if status == "rejected":
        return Cost("none", None, "", None, "", proposed, proposed_note)
    pid = proposal.get("program_id")
    done = [e for e in _finished(store, run_id) if e["program_id"] == pid] if pid else []
    if done:
        ev = done[-1]
        repairs = [r for r in proposal_llm(store, run_id).values() if r.get("repairs") == pid]
        priced = [dollars_of(r, cfg.prices) for r in repairs]
        llm, note = ((None, "unknown price") if any(d is None for d in priced)
                     else (float(sum(d or 0.0 for d in priced)), f"{len(repairs)} repair answer(s)"))
        return Cost("actual", gpu_seconds(ev), "its evaluation", llm, note, proposed, proposed_note,
                    gpu_badge=str(ev.get("badge") or "real"))
    gpu, gpu_note, badge = expected_gpu(store, run_id, cfg.recent_evaluations)
    llm, llm_note = expected_llm(store, run_id, proposal, cfg)
    return Cost("expected", gpu, gpu_note, llm, llm_note, proposed, proposed_note, gpu_badge=badge)


@dataclass(frozen=True)
class BudgetPick:
    approve: list[int]  # proposal ids to approve, in order
    gpu_seconds: float
    llm_dollars: float
    stopped: str  # why it stopped before the end ("" when every proposal fitted)


def within_budget(costs: Iterable[tuple[int, Cost]], *, gpu_seconds: float | None = None,
                  llm_dollars: float | None = None) -> BudgetPick:
    """The proposals, in the order given, approved until the next one's expected cost would exceed a budget.

    A budget left None is not checked. A cost a set budget cannot count (unknown GPU time or unknown price)
    stops the pick: what cannot be counted cannot be shown to fit."""
    picked: list[int] = []
    gpu = dollars = 0.0
    for pid, c in costs:
        if gpu_seconds is not None:
            if c.gpu_seconds is None:
                return BudgetPick(picked, gpu, dollars, f"#{pid}: GPU time unknown ({c.gpu_note})")
            if gpu + c.gpu_seconds > gpu_seconds:
                return BudgetPick(picked, gpu, dollars,
                                  f"#{pid} would bring the GPU time to {gpu + c.gpu_seconds:.1f} s "
                                  f"of {gpu_seconds:.1f} s")
        if llm_dollars is not None:
            if c.llm_dollars is None:
                return BudgetPick(picked, gpu, dollars, f"#{pid}: LLM {c.llm_note}")
            if dollars + c.llm_dollars > llm_dollars:
                return BudgetPick(picked, gpu, dollars,
                                  f"#{pid} would bring the LLM dollars to ${dollars + c.llm_dollars:.4f} "
                                  f"of ${llm_dollars:.4f}")
        picked.append(pid)
        gpu += c.gpu_seconds or 0.0
        dollars += c.llm_dollars or 0.0
    return BudgetPick(picked, gpu, dollars, "")
