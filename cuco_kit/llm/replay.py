"""Record model answers once, replay them later without a server (notebooks in CI, demos, debugging).

The recording is JSON lines, one per answered call: {"v": 1, "hash", "purpose", "messages", "completion",
"truncated"}. The key is `request_hash(messages, purpose)` (sha256 of canonical JSON; the model and sampling
settings are not part of it). When the same request was recorded several times, replay serves the answers in
recorded order and then keeps serving the last one.

Replayed answers cost nothing: their `dollars` is 0.0, so a ledger around a ReplayClient spends no budget, and
their `latency_s` is the replay's own (near zero), not the recorded one.
"""
from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from cuco_kit.llm.client import (
    Completion,
    LLMClient,
    LLMError,
    LLMReplayMiss,
    LLMTruncated,
    canonical_json,
    request_hash,
)

FORMAT_VERSION = 1


class RecordingClient:
    """Passes calls to `inner` and appends each answer (truncated ones too) to `path`."""

    def __init__(self, inner: LLMClient, path: str | Path) -> None:
        self.inner = inner
        self.path = Path(path)
        self._lock = threading.Lock()

    def _append(self, messages: list[dict[str, Any]], purpose: str, c: Completion, truncated: bool) -> None:
        line = canonical_json({"v": FORMAT_VERSION, "hash": request_hash(messages, purpose), "purpose": purpose,
                               "messages": messages, "completion": dataclasses.asdict(c),
                               "truncated": truncated})
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as f:
                f.write(line + "\n")

    def complete(self, messages: list[dict[str, Any]], *, purpose: str, temperature: float | None = None,
                 max_tokens: int | None = None) -> Completion:
        try:
            c = self.inner.complete(messages, purpose=purpose, temperature=temperature, max_tokens=max_tokens)
        except LLMTruncated as exc:
            self._append(messages, purpose, exc.completion, truncated=True)
            raise
        self._append(messages, purpose, c, truncated=False)
        return c


class ReplayClient:
    """Answers from a recording made by RecordingClient; never touches the network."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise LLMError(f"no LLM recording at {self.path}: record one with RecordingClient first")
        self._answers: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self._served: dict[str, int] = defaultdict(int)
        self._lock = threading.Lock()
        with self.path.open(encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                    if rec.get("v") != FORMAT_VERSION:
                        raise ValueError(f"format version {rec.get('v')!r}, expected {FORMAT_VERSION}")
                    self._answers[rec["hash"]].append(rec)
                except (ValueError, KeyError, AttributeError) as exc:
                    raise LLMError(f"{self.path}:{lineno}: not a recording line ({exc}); re-record the file") \
                        from exc

    def __len__(self) -> int:
        return sum(len(v) for v in self._answers.values())

    def complete(self, messages: list[dict[str, Any]], *, purpose: str, temperature: float | None = None,
                 max_tokens: int | None = None) -> Completion:
        start = time.monotonic()
        h = request_hash(messages, purpose)
        with self._lock:
            recs = self._answers.get(h)
            if not recs:
                purposes = sorted({r["purpose"] for rs in self._answers.values() for r in rs})
                raise LLMReplayMiss(
                    f"replay miss: no recorded answer for call '{purpose}' (request {h[:12]}) in {self.path}, "
                    f"which holds {len(self)} answer(s) for purposes {purposes}. The prompt changed since the "
                    "recording (templates, seed or history): record again against a server.")
            rec = recs[min(self._served[h], len(recs) - 1)]
            self._served[h] += 1
        fields = {f.name for f in dataclasses.fields(Completion)}
        data = {k: v for k, v in rec["completion"].items() if k in fields}
        c = dataclasses.replace(Completion(**data), dollars=0.0, latency_s=time.monotonic() - start)
        if rec.get("truncated"):
            raise LLMTruncated(f"LLM call '{purpose}' (replayed): the recorded answer was cut at the token limit",
                               completion=c)
        return c
