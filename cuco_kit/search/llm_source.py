"""The LLM mutation source: SEARCH/REPLACE diffs inside EVOLVE blocks, full rewrites and crossovers of two
parents, from the prompt files ``search_diff``, ``search_full`` and ``search_crossover``.

Prompts carry the parent (code and result), inspirations (elites of other islands and archive cells, their
EVOLVE blocks only), recent failures with their log tails, and the meta-summary. An answer that cannot be
applied (SEARCH text not found, no code block) is no proposal; its error is kept and shown in the next
prompts as a failure, so the model learns from it too.
"""
from __future__ import annotations

import collections
import logging
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cuco_kit import markers, patch, prompts
from cuco_kit.llm.client import LLMBudgetExceeded, LLMClient, LLMError
from cuco_kit.llm.ledger import LedgeredClient
from cuco_kit.search.population import ProgramView
from cuco_kit.search.proposal import MUTATION_KINDS, Proposal, ProposalContext, unified_diff

if TYPE_CHECKING:
    from cuco_kit.search.engine import SearchEngine  # for the annotation only: sources sit below the engine

log = logging.getLogger("cuco_kit.search")

_HEADER_RE = {k: re.compile(rf"^\s*\**{k}\**\s*:\s*(?P<v>.+?)\s*$", re.MULTILINE | re.IGNORECASE)
              for k in ("NAME", "RATIONALE", "TAGS")}


@dataclass
class LLMSourceConfig:
    max_tokens: int = 8192
    inspiration_chars: int = 4000  # per inspiration: its EVOLVE blocks, clipped
    recent_errors: int = 3  # unapplicable answers shown back


def parse_header(text: str) -> tuple[str, str, list[str]]:
    """NAME, RATIONALE and TAGS lines of an answer ("" / [] when absent)."""
    def get(k: str) -> str:
        m = _HEADER_RE[k].search(text)
        return m.group("v").strip() if m else ""

    tags = [t.strip().lower() for t in get("TAGS").split(",") if t.strip()]
    return get("NAME"), get("RATIONALE"), tags


def evolve_blocks_text(code: str, max_chars: int) -> str:
    """The program's EVOLVE blocks with their names (what an inspiration needs to show), clipped."""
    try:
        parts = [f"// block {b.name}\n{b.text}" for b in markers.blocks(code)]
    except Exception:  # noqa: BLE001 - broken markers: show the head of the file instead
        parts = [code]
    text = "\n".join(parts)
    return text if len(text) <= max_chars else text[:max_chars] + "\n// ... (clipped)"


class LLMSource:
    """``kinds = ("diff", "full", "crossover")``. ``client`` is any cuco_kit.llm LLMClient (usually a
    LedgeredClient, so every call counts against the run's dollar budget)."""

    name = "llm"
    kinds: tuple[str, ...] = ("diff", "full", "crossover")

    def __init__(self, client: LLMClient, config: LLMSourceConfig | None = None) -> None:
        self.client = client
        self.config = config or LLMSourceConfig()
        self.errors: collections.deque[str] = collections.deque(maxlen=self.config.recent_errors)

    def bind(self, engine: SearchEngine) -> None:
        """Route calls through the engine's ledger (dollar budget, store rows) unless already ledgered."""
        if not isinstance(self.client, LedgeredClient) and engine.ledger is not None:
            self.client = engine.ledger.wrap(self.client)

    # -- prompt ---------------------------------------------------------------------------------------------
    def _inspirations(self, ctx: ProposalContext) -> str:
        if not ctx.inspirations:
            return "none yet"
        out = []
        for p in ctx.inspirations:
            out.append(f"### program {p.id} ({p.name or p.source}), island {p.island}, cell {p.cell}: "
                       f"{p.summary()}\n```cuda\n{evolve_blocks_text(p.code, self.config.inspiration_chars)}\n```")
        return "\n\n".join(out)

    def _failures(self, ctx: ProposalContext) -> str:
        lines = [f.render() for f in ctx.failures]
        lines += [f"- an earlier answer could not be applied: {e}" for e in self.errors]
        return "\n".join(lines) or "none yet"

    def build_messages(self, ctx: ProposalContext, kind: str) -> list[dict]:
        parent = ctx.parent
        values: dict[str, Any] = dict(
            phase=ctx.phase.name, phase_hint=ctx.phase.hint, parent_id=parent.id, parent_result=parent.summary(),
            parent_code=parent.code, meta_summary=ctx.meta_summary or "nothing yet",
            failures=self._failures(ctx))
        if kind == "crossover":
            second: ProgramView = ctx.second_parent  # type: ignore[assignment]  # propose(): crossover has one
            values.update(second_parent_id=second.id, second_parent_result=second.summary(),
                          second_parent_code=second.code)
        else:
            values["inspirations"] = self._inspirations(ctx)
        name = {"diff": "search_diff", "full": "search_full", "crossover": "search_crossover"}[kind]
        return [{"role": "system", "content": prompts.load("search_system")},
                {"role": "user", "content": prompts.render(name, **values)}]

    # -- proposing ------------------------------------------------------------------------------------------
    def propose(self, ctx: ProposalContext) -> list[Proposal]:
        kind = ctx.kind if ctx.kind in self.kinds else "diff"
        if kind == "crossover" and ctx.second_parent is None:
            kind = "diff"
        out: list[Proposal] = []
        for _ in range(max(1, ctx.n)):
            messages = self.build_messages(ctx, kind)
            try:
                c = self.client.complete(messages, purpose=f"search.mutate.{kind}",
                                         temperature=ctx.phase.temperature, max_tokens=self.config.max_tokens)
            except LLMBudgetExceeded:
                raise  # the engine stops proposing; budgets are its business
            except LLMError as exc:
                log.warning("LLM %s proposal for program %s failed: %s", kind, ctx.parent.id, exc)
                self.errors.append(f"{kind}: the call failed: {exc}")
                continue
            text = c.text
            edits = patch.parse_edits(text)
            try:
                code = patch.apply_proposal(ctx.parent.code, text)
            except patch.PatchError as exc:
                self.errors.append(f"{kind} answer for program {ctx.parent.id}: {exc}")
                log.info("LLM %s answer not applicable: %s", kind, exc)
                continue
            if code == ctx.parent.code:
                self.errors.append(f"{kind} answer for program {ctx.parent.id} changed nothing")
                continue
            # What the answer actually was decides the source (a diff prompt may get a rewrite back).
            actual = "crossover" if kind == "crossover" and not edits else ("diff" if edits else "full")
            name, rationale, tags = parse_header(text)
            if getattr(c, "fixture", False):
                tags = tags + ["fixture"]  # a scripted test answer, labelled so viewers can badge it
            out.append(Proposal(
                name=(name or f"{actual} of program {ctx.parent.id}")[:120], rationale=rationale, tags=tags,
                diff=unified_diff(ctx.parent.code, code), source=MUTATION_KINDS[actual], parent_id=ctx.parent.id,
                code=code, second_parent_id=ctx.second_parent.id if actual == "crossover" and ctx.second_parent
                else None,
                meta={"model": c.model, "fixture": bool(getattr(c, "fixture", False)), "purpose":
                      f"search.mutate.{kind}", "temperature": ctx.phase.temperature, "dollars": c.dollars}))
        return out
