"""An `LLMClient` for any OpenAI-compatible chat server (OpenAI, vLLM, Ollama, LM Studio, ...).

Point it elsewhere with two environment variables: `OPENAI_BASE_URL` (e.g. http://localhost:8000/v1 for vLLM,
http://localhost:11434/v1 for Ollama, http://localhost:1234/v1 for LM Studio) and `CUCO_MODEL` (the model name
the server knows). `OPENAI_API_KEY` is needed for api.openai.com only; local servers get a dummy key.

Retries are ours, not the SDK's (it runs with max_retries=0): 429, 5xx, timeouts, connection errors and
malformed bodies are retried with exponential backoff and jitter (a server's Retry-After is honoured up to the
cap), every retry is logged on the "cuco_kit.llm" logger, and the sleep and random source can be injected so
tests run in milliseconds. Other 4xx answers are not retried: the same request would fail the same way.

Every error message (raised, logged, and so stored by the ledger) is redacted (redact.py): the configured key and
anything shaped like a credential become [redacted], and the SDK's own exception, whose text may quote the key,
is not chained to ours.

`openai` is imported lazily so the engine imports without it.
"""
from __future__ import annotations

import json
import logging
import math
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlparse

from cuco_kit.llm import prices as _prices
from cuco_kit.llm.client import (
    Completion,
    LLMError,
    LLMRequestRejected,
    LLMTruncated,
    LLMUnavailable,
)
from cuco_kit.llm.redact import redact, remember

log = logging.getLogger("cuco_kit.llm")

DEFAULT_BASE_URL = "https://api.openai.com/v1"
# A cheap, widely available model; override with LLMConfig.model or $CUCO_MODEL.
DEFAULT_MODEL = "gpt-4o-mini"
DEFAULT_EMBEDDING_MODEL = "text-embedding-3-small"
# Local servers ignore the key, but the SDK insists on one.
LOCAL_DUMMY_KEY = "not-needed"

T = TypeVar("T")


@dataclass
class LLMConfig:
    """Where and how to call the model. `None` fields are filled from the environment when the config is made:
    base_url <- $OPENAI_BASE_URL (else api.openai.com), api_key <- $OPENAI_API_KEY, model <- $CUCO_MODEL
    (else DEFAULT_MODEL), embedding_model <- $CUCO_EMBEDDING_MODEL (else DEFAULT_EMBEDDING_MODEL)."""

    base_url: str | None = None
    api_key: str | None = field(default=None, repr=False)  # never shown in notebooks or logs
    model: str | None = None
    embedding_model: str | None = None
    timeout_s: float = 120.0
    max_retries: int = 4
    backoff_base_s: float = 1.0
    backoff_cap_s: float = 30.0
    # Overrides/extends cuco_kit.llm.prices.PRICES: model -> (input $/Mtok, output $/Mtok).
    prices: dict[str, tuple[float, float]] | None = None
    # Used when a call passes None.
    temperature: float | None = None
    max_tokens: int | None = None
    # OpenAI's reasoning models want "max_completion_tokens"; most local servers know "max_tokens".
    max_tokens_param: str = "max_tokens"
    # OpenAI's reasoning models refuse a temperature: False leaves it out of every request.
    send_temperature: bool = True
    # Sent as "reasoning_effort" ("low", "medium", "high") when set; None sends nothing.
    reasoning_effort: str | None = None
    # The model's context window in tokens, when known: callers size answers to fit next to the prompt.
    context_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.base_url is None:
            self.base_url = os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL
        if self.api_key is None:
            self.api_key = os.environ.get("OPENAI_API_KEY") or None
        remember(self.api_key)
        if self.model is None:
            self.model = os.environ.get("CUCO_MODEL") or DEFAULT_MODEL
        if self.embedding_model is None:
            self.embedding_model = os.environ.get("CUCO_EMBEDDING_MODEL") or DEFAULT_EMBEDDING_MODEL
        if self.timeout_s <= 0:
            raise LLMError(f"LLMConfig.timeout_s must be > 0, got {self.timeout_s}")
        if self.max_retries < 0:
            raise LLMError(f"LLMConfig.max_retries must be >= 0, got {self.max_retries}")
        if self.backoff_base_s < 0 or self.backoff_cap_s < 0:
            raise LLMError("LLMConfig.backoff_base_s and backoff_cap_s must be >= 0")
        if self.max_tokens_param not in ("max_tokens", "max_completion_tokens"):
            raise LLMError(f"LLMConfig.max_tokens_param must be 'max_tokens' or 'max_completion_tokens', "
                           f"got {self.max_tokens_param!r}")

    def resolved_api_key(self) -> str:
        """The key to send: the configured one, or a dummy for servers other than api.openai.com."""
        if self.api_key:
            return self.api_key
        host = urlparse(self.base_url or "").hostname or ""
        if host == "openai.com" or host.endswith(".openai.com"):
            raise LLMError(f"no API key for {self.base_url}: set OPENAI_API_KEY, or set OPENAI_BASE_URL to a "
                           "local OpenAI-compatible server (vLLM, Ollama, LM Studio)")
        return LOCAL_DUMMY_KEY


def make_openai(config: LLMConfig) -> Any:
    """An `openai.OpenAI` client for `config` with the SDK's own retries off (we retry, see module doc)."""
    try:
        import openai
    except ImportError as exc:  # pragma: no cover - openai is a declared dependency
        raise LLMError("the 'openai' package is needed for LLM calls: pip install openai") from exc
    return openai.OpenAI(base_url=config.base_url, api_key=config.resolved_api_key(),
                         timeout=config.timeout_s, max_retries=0)


def backoff_delay(attempt: int, config: LLMConfig, rng: random.Random | Any = random,
                  retry_after: float | None = None) -> float:
    """Seconds to wait after failed attempt number `attempt` (1-based): exponential, capped, with "equal
    jitter" (half fixed, half random) so parallel workers spread out but never retry instantly. A server's
    Retry-After raises the wait (capped too)."""
    ceiling = min(config.backoff_cap_s, config.backoff_base_s * (2 ** (attempt - 1)))
    delay = ceiling / 2 + rng.uniform(0, ceiling / 2)
    if retry_after is not None and math.isfinite(retry_after) and retry_after > 0:
        delay = max(delay, min(retry_after, config.backoff_cap_s))
    return delay


def _retry_after(response: Any) -> float | None:
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    for name, divisor in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            return float(value) / divisor
        except ValueError:
            continue  # an HTTP date: rare from model servers, fall back to our own backoff
    return None


def _classify(exc: BaseException) -> tuple[str, float | None]:
    """(why, retry_after) for a retryable failure; raises the mapped error for a final one; re-raises
    anything that is not a transport/server failure (a bug should surface as itself)."""
    import openai

    if isinstance(exc, openai.APITimeoutError):
        return "timed out", None
    if isinstance(exc, openai.APIConnectionError):
        return redact(f"connection error ({exc.__cause__ or exc})"), None
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        if status == 429 or status >= 500:
            return redact(f"HTTP {status}: {exc.message}"), _retry_after(exc.response)
        hint = " (check OPENAI_API_KEY)" if status in (401, 403) else (
            " (check the model name: LLMConfig.model or $CUCO_MODEL)" if status == 404 else "")
        # from None: the SDK's exception quotes the server's answer, which may quote the key
        raise LLMRequestRejected(redact(f"the LLM server refused the request: HTTP {status}: {exc.message}{hint}"),
                                 status=status) from None
    if isinstance(exc, (json.JSONDecodeError, openai.APIResponseValidationError)):
        # A 200 with a body that is not the expected JSON: usually a proxy or an overloaded local server.
        return redact(f"malformed response ({exc})"), None
    raise exc


def call_with_retries(send: Callable[[], T], config: LLMConfig, *, what: str,
                      sleep: Callable[[float], None] = time.sleep,
                      rng: random.Random | Any = random) -> tuple[T, int]:
    """Run `send()` with our retry policy; return (its result, attempts used).

    Raises LLMUnavailable after max_retries retries, LLMRequestRejected at once on a non-retryable 4xx.
    """
    attempts = config.max_retries + 1
    why = "no attempt made"
    for attempt in range(1, attempts + 1):
        try:
            return send(), attempt
        except Exception as exc:  # noqa: BLE001 - classified below; non-API errors are re-raised by _classify
            why, retry_after = _classify(exc)
            if attempt == attempts:
                break
            delay = backoff_delay(attempt, config, rng, retry_after)
            log.warning("%s: attempt %d/%d failed: %s; retrying in %.2f s", what, attempt, attempts, why, delay)
            sleep(delay)
    raise LLMUnavailable(redact(f"{what}: the LLM server at {config.base_url} failed {attempts} time(s), last: "
                                f"{why}. Check that the server is up (OPENAI_BASE_URL) or raise "
                                "LLMConfig.max_retries/timeout_s."), attempts=attempts)


def _check_messages(messages: list[dict[str, Any]]) -> None:
    if not isinstance(messages, list) or not messages:
        raise LLMError("messages must be a non-empty list of {'role': ..., 'content': ...} dicts")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise LLMError(f"messages[{i}] must be a dict with 'role' and 'content', got {m!r:.80}")


class OpenAICompatibleClient:
    """`LLMClient` over the `openai` SDK. Thread-safe (the SDK's HTTP client is)."""

    def __init__(self, config: LLMConfig | None = None, *, sleep: Callable[[float], None] = time.sleep,
                 rng: random.Random | None = None) -> None:
        self.config = config if config is not None else LLMConfig()
        self._sleep = sleep
        self._rng = rng if rng is not None else random.Random()
        self._client = make_openai(self.config)

    def __repr__(self) -> str:
        return f"OpenAICompatibleClient(base_url={self.config.base_url!r}, model={self.config.model!r})"

    def complete(self, messages: list[dict[str, Any]], *, purpose: str, temperature: float | None = None,
                 max_tokens: int | None = None) -> Completion:
        _check_messages(messages)
        kwargs: dict[str, Any] = {}
        temp = temperature if temperature is not None else self.config.temperature
        if temp is not None and self.config.send_temperature:
            kwargs["temperature"] = temp
        if self.config.reasoning_effort:
            kwargs["reasoning_effort"] = self.config.reasoning_effort
        limit = max_tokens if max_tokens is not None else self.config.max_tokens
        if limit is not None:
            kwargs[self.config.max_tokens_param] = limit

        def send() -> tuple[Any, Any]:
            raw = self._client.chat.completions.with_raw_response.create(
                model=self.config.model, messages=messages, **kwargs)
            return raw.parse(), raw.headers

        start = time.monotonic()
        (resp, headers), attempts = call_with_retries(
            send, self.config, what=f"LLM call '{purpose}'", sleep=self._sleep, rng=self._rng)
        latency = time.monotonic() - start
        if not resp.choices:
            raise LLMError(f"LLM call '{purpose}': the server returned no choices (model {resp.model!r})")
        choice = resp.choices[0]
        usage = resp.usage
        model = resp.model or self.config.model or ""
        pt = usage.prompt_tokens if usage is not None else None
        ct = usage.completion_tokens if usage is not None else None
        completion = Completion(
            text=choice.message.content or "",
            model=model,
            prompt_tokens=pt,
            completion_tokens=ct,
            latency_s=latency,
            finish_reason=choice.finish_reason,
            dollars=_prices.cost(model, pt, ct, self.config.prices),
            fixture=(headers.get("x-cuco-fixture") == "true" or resp.system_fingerprint == "fixture"),
            attempts=attempts,
        )
        log.debug("LLM call '%s': model=%s tokens=%s/%s latency=%.2fs attempts=%d", purpose, model, pt, ct,
                  latency, attempts)
        if choice.finish_reason == "length":
            raise LLMTruncated(
                f"LLM call '{purpose}': the answer was cut at the token limit ({ct} tokens); raise max_tokens "
                "or ask for a shorter answer (e.g. SEARCH/REPLACE edits instead of a full rewrite)",
                completion=completion)
        return completion
