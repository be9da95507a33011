"""The novelty filter: reject a proposal that is a near-copy of a recent program of the same design cell.

Offline it compares normalised token n-grams (comments dropped, whitespace ignored, numeric literals kept:
they are often the point of a change) with Jaccard similarity. On a large file a targeted edit leaves the ratio
near 1 however real it is, so a proposal with at least ``min_new_ngrams`` n-grams its peer lacks is novel too:
only changes to comments and whitespace (no new n-gram) or a token or two are near-duplicates there.
Optionally, embeddings from an OpenAI-compatible endpoint (cuco_kit.llm.embeddings) replace the n-grams with
cosine similarity.

A near-duplicate may go on to the LLM novelty judge (search/novelty_judge.py; ``llm_judge``, off by default), which
lets it through when its change is new after all; only near-duplicates are sent.

Design-space and human proposals are exempt by default: a knob move differs from its parent by design in one
token (exact repeats are caught by the code hash instead), and a person's edit is never second-guessed.
"""
from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from cuco_kit.llm.embeddings import embed as _embed
from cuco_kit.llm.openai_client import LLMConfig
from cuco_kit.search.population import Population, ProgramView

log = logging.getLogger("cuco_kit.search")

_COMMENT_RE = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)
_TOKEN_RE = re.compile(r"[A-Za-z_]\w*|\d+(?:\.\d+)?[fFuUlL]*|0[xX][0-9a-fA-F]+|<<<|>>>|->|::|&&|\|\||[^\s\w]")


def tokens(code: str) -> list[str]:
    """Source tokens with comments removed (markers are comments, so they do not count either)."""
    return _TOKEN_RE.findall(_COMMENT_RE.sub(" ", code))


def ngrams(code: str, n: int = 4) -> frozenset[tuple[str, ...]]:
    toks = tokens(code)
    if len(toks) < n:
        return frozenset([tuple(toks)]) if toks else frozenset()
    return frozenset(tuple(toks[i:i + n]) for i in range(len(toks) - n + 1))


def jaccard(a: frozenset[tuple[str, ...]], b: frozenset[tuple[str, ...]]) -> float:
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


def cosine(u: Sequence[float], v: Sequence[float]) -> float:
    dot = sum(x * y for x, y in zip(u, v))
    nu = math.sqrt(sum(x * x for x in u))
    nv = math.sqrt(sum(y * y for y in v))
    return dot / (nu * nv) if nu and nv else 0.0


@dataclass
class NoveltyConfig:
    enabled: bool = True
    threshold: float = 0.97  # similarity at or above this is a near-duplicate ...
    min_new_ngrams: int = 2  # ... unless the proposal has at least this many n-grams the peer lacks (0: off)
    n: int = 4  # n-gram length
    recent: int = 30  # compare with the last this many programs of the same cell
    exempt_sources: list[str] = field(default_factory=lambda: ["design_space", "human"])
    use_embeddings: bool = False
    embedding_threshold: float = 0.995
    llm_judge: bool = False  # ask the novelty_judge model about near-duplicates (search/novelty_judge.py)
    judge_max_calls: int = 100  # judgements per run at most; then the filter decides alone
    judge_max_tokens: int = 300


@dataclass
class NoveltyVerdict:
    novel: bool
    similarity: float
    nearest_id: int | None
    method: str  # "ngram" | "embedding" | "exempt" | "empty"
    judge: str | None = None  # the LLM novelty judge's verdict ("novel" | "duplicate"); None: not judged
    judge_reason: str = ""

    def reason(self) -> str:
        if self.novel:
            return ""
        why = f"near-duplicate of program {self.nearest_id} ({self.method} similarity {self.similarity:.3f})"
        return why + (f"; the novelty judge agrees: {self.judge_reason}" if self.judge else "")

    def tags(self) -> list[str]:
        """Tags for a proposal the judge let through (a near-duplicate by similarity, new by the judge's reading)."""
        return ["novelty-judge:novel"] if self.novel and self.judge == "novel" else []


class ReviewsNearDuplicates(Protocol):
    """The novelty judge's seam: given a near-duplicate's code, the program it is near and the filter's verdict,
    the verdict after the judge (the filter's when it cannot tell)."""

    def review(self, code: str, nearest: ProgramView | None, verdict: NoveltyVerdict) -> NoveltyVerdict: ...


class NoveltyFilter:
    """``check(code, cell, source, population)`` -> NoveltyVerdict. ``embed`` (texts -> vectors) is used when
    the config asks for embeddings; any failure of it falls back to n-grams for that check."""

    def __init__(self, config: NoveltyConfig | None = None,
                 embed: Callable[[list[str]], list[list[float]]] | None = None) -> None:
        self.config = config or NoveltyConfig()
        self.embed = embed
        self.judge: ReviewsNearDuplicates | None = None  # set by the engine when config.llm_judge is on
        self._grams: dict[int, frozenset[tuple[str, ...]]] = {}
        self._vectors: dict[int, list[float]] = {}

    def _grams_of(self, pid: int, code: str) -> frozenset[tuple[str, ...]]:
        g = self._grams.get(pid)
        if g is None:
            g = self._grams[pid] = ngrams(code, self.config.n)
        return g

    def check(self, code: str, cell: str | None, source: str, population: Population) -> NoveltyVerdict:
        verdict = self._similarity(code, cell, source, population)
        if verdict.novel or self.judge is None or not self.config.llm_judge:
            return verdict
        return self.judge.review(code, population.get(verdict.nearest_id), verdict)

    def _similarity(self, code: str, cell: str | None, source: str, population: Population) -> NoveltyVerdict:
        cfg = self.config
        if not cfg.enabled or source in cfg.exempt_sources:
            return NoveltyVerdict(True, 0.0, None, "exempt")
        peers = [p for p in population.evolvable() if p.cell == cell][-cfg.recent:]
        if not peers:
            return NoveltyVerdict(True, 0.0, None, "empty")
        if cfg.use_embeddings and self.embed is not None:
            try:
                return self._check_embeddings(self.embed, code, peers)
            except Exception as exc:  # noqa: BLE001 - the endpoint is optional; n-grams always work
                log.warning("novelty: embeddings failed (%s); using token n-grams", exc)
        mine = ngrams(code, cfg.n)
        best_sim, best_id, dup = -1.0, None, False
        for p in peers:
            theirs = self._grams_of(p.id, p.code)
            sim = jaccard(mine, theirs)
            near = sim >= cfg.threshold and (cfg.min_new_ngrams <= 0 or len(mine - theirs) < cfg.min_new_ngrams)
            if (near and not dup) or (near == dup and sim > best_sim):
                best_sim, best_id, dup = sim, p.id, near
        return NoveltyVerdict(not dup, best_sim, best_id, "ngram")

    def _check_embeddings(self, embed: Callable[[list[str]], list[list[float]]], code: str,
                          peers: list[ProgramView]) -> NoveltyVerdict:
        missing = [p for p in peers if p.id not in self._vectors]
        texts = [code] + [p.code for p in missing]
        vecs = embed(texts)
        for p, v in zip(missing, vecs[1:]):
            self._vectors[p.id] = v
        mine = vecs[0]
        best_sim, best_id = -1.0, None
        for p in peers:
            sim = cosine(mine, self._vectors[p.id])
            if sim > best_sim:
                best_sim, best_id = sim, p.id
        return NoveltyVerdict(best_sim < self.config.embedding_threshold, best_sim, best_id, "embedding")


def openai_embedder(config: LLMConfig | None = None) -> Callable[[list[str]], list[list[float]]]:
    """An ``embed`` function over the OpenAI-compatible endpoint of ``config`` (an LLMConfig)."""

    def embed(texts: list[str]) -> list[list[float]]:
        return _embed(texts, config)

    return embed
