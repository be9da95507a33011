"""The LLM novelty judge: asked about the candidates the similarity filter calls near-duplicates, whether they
are new after all.

Off by default (``NoveltyConfig.llm_judge``). When on, a candidate that the n-gram or embedding filter finds too
close to a recent program of its cell is shown to the ``novelty_judge`` role's model with its change against that
program (``search_novelty_judge`` prompt): NOVEL lets it through, DUPLICATE rejects it with the judge's reason. A
candidate the filter lets through as novel is never sent. Each judgement is one call through the run's ledger
(purpose ``search.novelty.judge``), at most ``NoveltyConfig.judge_max_calls`` per run; its verdict and reason are
stored in the run's ``novelty_judgements`` metadata with the candidate's code hash, so the same candidate is not
judged twice, across resumes too. A call that fails, an unreadable answer or a spent budget leaves the filter's
verdict standing.
"""
from __future__ import annotations

import logging
import re
import time
from typing import TYPE_CHECKING, Any

from cuco_kit import prompts
from cuco_kit.llm.client import LLMClient, LLMError
from cuco_kit.search.model_stats import purpose_with_model
from cuco_kit.search.novelty import NoveltyConfig, NoveltyVerdict
from cuco_kit.search.proposal import unified_diff
from cuco_kit.store import code_hash

if TYPE_CHECKING:  # typing only
    from cuco_kit.search.population import ProgramView
    from cuco_kit.store import Store

log = logging.getLogger("cuco_kit.search")

KEY = "novelty_judgements"  # run metadata: every judgement, oldest first
PURPOSE = "search.novelty.judge"
_VERDICT_RE = re.compile(r"VERDICT\W*(?P<v>NOVEL|DUPLICATE)\b", re.IGNORECASE)
_REASON_RE = re.compile(r"REASON\W*(?P<r>.+)", re.IGNORECASE)
DIFF_CHARS = 6000


def parse(answer: str) -> tuple[str | None, str]:
    """("novel" | "duplicate" | None when unreadable, the reason) of a judge's answer."""
    m = _VERDICT_RE.search(answer)
    r = _REASON_RE.search(answer)
    reason = r.group("r").strip() if r else answer.strip().splitlines()[-1].strip() if answer.strip() else ""
    return (m.group("v").lower() if m else None), reason[:500]


class NoveltyJudge:
    """``review(code, nearest, verdict)`` -> the verdict after the judge (see the module doc)."""

    def __init__(self, config: NoveltyConfig, llm: LLMClient, model: str | None, store: Store, run_id: int, *,
                 workload: str = "", backend: str = "", world_size: int = 1) -> None:
        self.config, self.llm, self.model = config, llm, model
        self.store, self.run_id = store, run_id
        self.workload, self.backend, self.world_size = workload, backend, world_size
        self.records: list[dict[str, Any]] = list(store.get_meta(run_id, KEY, []) or [])
        self._by_hash = {r["code_hash"]: r for r in self.records}

    def messages(self, code: str, nearest: ProgramView, verdict: NoveltyVerdict) -> list[dict[str, str]]:
        diff = unified_diff(nearest.code, code)
        if len(diff) > DIFF_CHARS:
            diff = diff[:DIFF_CHARS] + "\n... (clipped)"
        text = prompts.render("search_novelty_judge", workload=self.workload, backend=self.backend,
                              world_size=self.world_size, nearest_id=nearest.id,
                              nearest_name=nearest.name or nearest.source, nearest_result=nearest.summary(),
                              method=verdict.method, similarity=f"{verdict.similarity:.3f}", diff=diff or "(none)")
        return [{"role": "system", "content": prompts.load("search_system")}, {"role": "user", "content": text}]

    def review(self, code: str, nearest: ProgramView | None, verdict: NoveltyVerdict) -> NoveltyVerdict:
        if verdict.novel or nearest is None:
            return verdict  # the judge is asked about near-duplicates only
        h = code_hash(code)
        rec = self._by_hash.get(h)
        if rec is None:
            if len(self.records) >= self.config.judge_max_calls:
                return verdict
            rec = self._ask(h, code, nearest, verdict)
            if rec is None:
                return verdict
        if rec["verdict"] is None:
            return verdict
        return NoveltyVerdict(rec["verdict"] == "novel", verdict.similarity, verdict.nearest_id, verdict.method,
                              judge=rec["verdict"], judge_reason=rec["reason"])

    def _ask(self, h: str, code: str, nearest: ProgramView, verdict: NoveltyVerdict) -> dict[str, Any] | None:
        try:
            c = self.llm.complete(self.messages(code, nearest, verdict),
                                  purpose=purpose_with_model(PURPOSE, self.model), temperature=0.0,
                                  max_tokens=self.config.judge_max_tokens)
        except LLMError as exc:  # the budget too: the filter's verdict stands
            log.warning("novelty judge: the call failed (%s); the similarity filter's verdict stands", exc)
            return None
        v, reason = parse(c.text)
        if v is None:
            log.warning("novelty judge: no VERDICT line in the answer; the similarity filter's verdict stands")
        rec = {"at": time.time(), "code_hash": h, "nearest_id": nearest.id, "similarity": verdict.similarity,
               "method": verdict.method, "verdict": v, "reason": reason if v else "unreadable answer",
               "model": c.model, "fixture": c.fixture}
        self.records.append(rec)
        self._by_hash[h] = rec
        self.store.put_meta(self.run_id, KEY, self.records)
        return rec
