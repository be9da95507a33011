"""Record model answers once, replay them later without a server (notebooks in CI, demos, debugging).

The recording is JSON lines, one per answered call: {"v": 1, "hash", "purpose", "messages", "completion",
"truncated"}; a call the server refused or never answered is a line with "error": {"type", "message"} and no
completion, and replay raises the same kind of error, so a run whose model failed now and then replays the same
way. The key is `request_hash(messages, purpose)` (sha256 of canonical JSON; the model and sampling
settings are not part of it). When the same request was recorded several times, replay serves the answers in
recorded order and then keeps serving the last one.

`CallLog` is the folder form the commands and the workbench use: `--record DIR` / `--replay DIR` keep the calls
in DIR/llm_calls.jsonl.

Replayed answers cost nothing: their `dollars` is 0.0, so a ledger around a ReplayClient spends no budget, and
their `latency_s` is the replay's own (near zero), not the recorded one.
"""
from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cuco_kit.llm.client import (
    Completion,
    LLMClient,
    LLMError,
    LLMReplayMiss,
    LLMRequestRejected,
    LLMTruncated,
    LLMUnavailable,
    canonical_json,
    request_hash,
)

FORMAT_VERSION = 1


class RecordingClient:
    """Passes calls to `inner` and appends each answer (truncated ones too) to `path`."""

    def __init__(self, inner: LLMClient, path: str | Path, *, lock: threading.Lock | None = None) -> None:
        self.inner = inner
        self.path = Path(path)
        # Clients that record into one file share one lock (CallLog's), so their lines never interleave.
        self._lock = lock or threading.Lock()

    @property
    def config(self) -> Any:
        """The recorded client's config (the ledger reads its model and prices through it)."""
        return getattr(self.inner, "config", None)

    def _append(self, messages: list[dict[str, Any]], purpose: str, c: Completion | None, truncated: bool,
                error: LLMError | None = None) -> None:
        rec: dict[str, Any] = {"v": FORMAT_VERSION, "hash": request_hash(messages, purpose), "purpose": purpose,
                               "messages": messages, "completion": dataclasses.asdict(c) if c else None,
                               "truncated": truncated}
        if error is not None:
            rec["error"] = {"type": type(error).__name__, "message": str(error)}
        line = canonical_json(rec)
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
        except (LLMRequestRejected, LLMUnavailable) as exc:
            self._append(messages, purpose, None, truncated=False, error=exc)
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
        err = rec.get("error")
        if err:
            message = f"(replayed) {err.get('message', '')}"
            if err.get("type") == LLMUnavailable.__name__:
                raise LLMUnavailable(message)
            raise LLMRequestRejected(message)
        fields = {f.name for f in dataclasses.fields(Completion)}
        data = {k: v for k, v in rec["completion"].items() if k in fields}
        c = dataclasses.replace(Completion(**data), dollars=0.0, latency_s=time.monotonic() - start)
        if rec.get("truncated"):
            raise LLMTruncated(f"LLM call '{purpose}' (replayed): the recorded answer was cut at the token limit",
                               completion=c)
        return c


RECORDING_FILE = "llm_calls.jsonl"  # the recording's name inside a --record / --replay folder


class _Replayed:
    """One role's view of a shared ReplayClient: answers from the recording, carries the replaced client's
    `config` (so the ledger names the configured model) and reports a miss to its CallLog before raising it."""

    def __init__(self, log: CallLog, replay: ReplayClient, config: Any) -> None:
        self._log = log
        self._replay = replay
        self.config = config

    def complete(self, messages: list[dict[str, Any]], *, purpose: str, temperature: float | None = None,
                 max_tokens: int | None = None) -> Completion:
        try:
            return self._replay.complete(messages, purpose=purpose, temperature=temperature, max_tokens=max_tokens)
        except LLMReplayMiss as exc:
            self._log.missed(exc)
            raise


class CallLog:
    """Where a run's LLM calls are recorded to, or replayed from: a folder holding `llm_calls.jsonl`.

    `CallLog.record(folder)` appends every answer (a resumed run adds to the same file); `CallLog.replay(folder)`
    answers every call from it without a server. `wrap(client)` gives the client to use in either mode, so one
    parameter serves the CLI (`--record` / `--replay`) and the notebooks' workbench. Every role's client replays
    from one shared recording. A replay miss (a call the recording does not hold) is kept in `misses` and
    `on_miss` is called, so a search can stop and say which call it was.
    """

    def __init__(self, mode: str, folder: str | Path) -> None:
        if mode not in ("record", "replay"):
            raise LLMError(f"LLM call log mode {mode!r}: use 'record' or 'replay'")
        self.mode = mode
        self.folder = Path(folder)
        self.misses: list[str] = []
        self.on_miss: Callable[[], Any] | None = None
        self._replay: ReplayClient | None = None
        self._lock = threading.Lock()
        if mode == "replay":
            if not self.path.is_file():
                raise LLMError(f"no LLM recording in {self.folder} (no {RECORDING_FILE}): record one with --record "
                               f"{self.folder} against a server first")
            self._replay = ReplayClient(self.path)
        elif self.folder.exists() and not self.folder.is_dir():
            raise LLMError(f"cannot record LLM calls into {self.folder}: it is a file, not a folder")

    @classmethod
    def record(cls, folder: str | Path) -> CallLog:
        return cls("record", folder)

    @classmethod
    def replay(cls, folder: str | Path) -> CallLog:
        return cls("replay", folder)

    @property
    def path(self) -> Path:
        return self.folder / RECORDING_FILE

    def wrap(self, client: LLMClient | None) -> LLMClient:
        """The client to call instead of `client`: recording through it, or replaying (then `client` is never
        called and may be None)."""
        if self._replay is not None:
            return _Replayed(self, self._replay, getattr(client, "config", None))
        if client is None:
            raise LLMError("recording LLM calls needs a client to record (a server to ask)")
        return RecordingClient(client, self.path, lock=self._lock)

    def missed(self, exc: LLMReplayMiss) -> None:
        with self._lock:
            first = not self.misses
            self.misses.append(str(exc))
        if first and self.on_miss is not None:
            self.on_miss()

    def __repr__(self) -> str:
        return f"CallLog({self.mode!r}, {str(self.folder)!r})"
