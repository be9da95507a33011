"""The one-method LLM client protocol, its result type, its errors and the request hash.

Everything that talks to a model (fast path, judge, search mutators, evaluation-side helpers) depends on
`LLMClient` only, so the OpenAI-compatible client, the ledger, recording and replay can be stacked freely:
`LedgeredClient(RecordingClient(OpenAICompatibleClient(cfg), path), ledger)`.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from cuco_kit.errors import CucoError


@dataclass(frozen=True)
class Completion:
    """One model answer. Token counts are what the server reported (None when it reported none)."""

    text: str
    model: str
    prompt_tokens: int | None
    completion_tokens: int | None
    latency_s: float
    finish_reason: str | None
    dollars: float | None = None
    # True when the answer came from a labelled test fixture (the fake server), so viewers can badge it.
    fixture: bool = False
    # HTTP attempts it took (1 = no retry); latency_s covers all of them, i.e. what the caller waited.
    attempts: int = 1


@runtime_checkable
class LLMClient(Protocol):
    def complete(
        self,
        messages: list[dict[str, Any]],
        *,
        purpose: str,
        temperature: float | None = None,
        max_tokens: int | None = None,
    ) -> Completion:
        """Send chat `messages` ([{"role": ..., "content": ...}]) and return the answer.

        `purpose` names why the call is made ("fastpath.stage_a", "judge", "mutate.diff", ...); the ledger
        groups costs by it and replay keys answers on it.
        """
        ...


class LLMError(CucoError):
    """A model call failed; the message says why and what to do."""


class LLMBudgetExceeded(LLMError):
    """The ledger's dollar budget is spent; the call was refused before anything was sent."""


class LLMUnavailable(LLMError):
    """The server could not be reached or kept failing (429/5xx/timeouts) after all retries."""

    def __init__(self, message: str, *, attempts: int = 0) -> None:
        super().__init__(message)
        self.attempts = attempts


class LLMTruncated(LLMError):
    """The answer stopped at the token limit (finish_reason "length"). The partial answer is kept,
    because it was paid for and the ledger records it."""

    def __init__(self, message: str, *, completion: Completion) -> None:
        super().__init__(message)
        self.completion = completion


class LLMRequestRejected(LLMError):
    """The server refused the request itself (a 4xx other than 429): wrong model, key or parameters.
    Not retried: the same request would fail the same way."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class LLMReplayMiss(LLMError):
    """Replay was asked for a request that the recording does not hold."""


def canonical_json(obj: object) -> str:
    """JSON with sorted keys and no whitespace, so equal requests give equal bytes."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def request_hash(messages: list[dict[str, Any]], purpose: str) -> str:
    """sha256 (hex) of the canonical JSON of the messages and the purpose.

    Sampling settings and the model are left out on purpose: a recording made with one model replays for a
    notebook configured with another, and a replay must not break because a temperature default moved.
    """
    payload = canonical_json({"messages": messages, "purpose": purpose})
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()
