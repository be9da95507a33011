"""`ScriptedClient`: an LLMClient that answers from a fixture script in process, without HTTP or the openai package.

For machines that lack `openai` (the GPU device image) and for runs that need scripted answers but no server. It
serves the same `Scripted` entries as the fake server (fake_server.py), chosen the same way (`match` on the last
user message, else in order), and labels every answer a fixture: model "fixture-<entry name>", `fixture=True`.
Kinds "text" and "truncated" are served (a truncated entry raises LLMTruncated with its text, as a real cut answer
does); token counts are the fake server's approximation (whitespace-separated words).
"""
from __future__ import annotations

from typing import Any

from cuco_kit.llm import prices as _prices
from cuco_kit.llm.client import Completion, LLMError, LLMRequestRejected, LLMTruncated
from cuco_kit.llm.fake_server import Scripted, approx_tokens, content_text, pick
from cuco_kit.llm.openai_client import LLMConfig


class ScriptedClient:
    def __init__(self, script: list[Scripted], *, model: str = "fixture",
                 prices: dict[str, tuple[float, float]] | None = None) -> None:
        bad = [e.name for e in script if e.kind not in ("text", "truncated")]
        if bad:
            raise LLMError(f"ScriptedClient serves text and truncated fixtures only; not {bad}")
        self.script = list(script)
        # base_url is never contacted: the config carries the model name and prices for the ledger.
        self.config = LLMConfig(base_url="http://127.0.0.1:9/v1", model=model, prices=prices)
        self.requests: list[list[dict[str, Any]]] = []

    def complete(self, messages: list[dict[str, Any]], *, purpose: str, temperature: float | None = None,
                 max_tokens: int | None = None) -> Completion:
        self.requests.append(messages)
        last_user = next((content_text(m.get("content")) for m in reversed(messages) if m.get("role") == "user"), "")
        e = pick(self.script, last_user)
        if e is None:
            raise LLMRequestRejected(f"LLM call '{purpose}': fixture script exhausted: no scripted answer left for "
                                     f"{last_user[:80]!r}", status=400)
        pt = sum(approx_tokens(content_text(m.get("content"))) for m in messages)
        ct = approx_tokens(e.text)
        model = self.config.model or "fixture"
        c = Completion(text=e.text, model=f"fixture-{e.name}", prompt_tokens=pt, completion_tokens=ct, latency_s=0.0,
                       finish_reason="length" if e.kind == "truncated" else "stop",
                       dollars=_prices.cost(model, pt, ct, self.config.prices), fixture=True)
        if e.kind == "truncated":
            raise LLMTruncated(f"LLM call '{purpose}': the answer was cut at the token limit ({ct} tokens)",
                               completion=c)
        return c
