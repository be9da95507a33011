"""The usage and cost ledger with a hard dollar budget.

Every call made through a `LedgeredClient` is recorded, whether it succeeded, was truncated, failed or was
refused, in memory (`Ledger.entries`, for notebooks) and, when a store is given, through
`store.add_llm_call(...)`. Dollars come from the completion when the client priced it, else from the price
table; an unknown model gives dollars None (tokens only).

The budget is hard in this sense: a call is refused before anything is sent once the spent dollars reach the
budget. Every client that shares one `Ledger` (the search's mutators and evaluation-side helpers alike) draws
from the same budget. Calls already in flight when the budget is reached still finish, so the overshoot is at
most the cost of the calls running at that moment. Calls to models with no known price count 0 dollars (a
warning is logged once per model when a budget is set).

Errors are redacted (redact.py) before they are kept or stored: whatever client raised them, no configured key
and nothing shaped like a credential reaches the store's error column.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Protocol

from cuco_kit.llm import prices as _prices
from cuco_kit.llm.client import (
    Completion,
    LLMBudgetExceeded,
    LLMClient,
    LLMTruncated,
    request_hash,
)
from cuco_kit.llm.redact import redact

log = logging.getLogger("cuco_kit.llm")


class LLMCallSink(Protocol):
    """What the ledger needs from a store (cuco_kit.store.Store provides it)."""

    def add_llm_call(self, *, run_id: int | None, model: str, purpose: str, prompt_tokens: int | None,
                     completion_tokens: int, latency_s: float, dollars: float | None, ok: bool,
                     error: str, request_hash: str) -> Any: ...


@dataclass(frozen=True)
class LedgerEntry:
    purpose: str
    model: str
    prompt_tokens: int | None
    completion_tokens: int | None
    latency_s: float
    dollars: float | None
    ok: bool
    error: str | None
    request_hash: str
    at: float  # time.time() when the call ended


class Ledger:
    """Counts tokens, latency and dollars of LLM calls and enforces a dollar budget.

    `already_spent`: dollars spent before this ledger existed; by default, for a store and a run_id, what the
    store's `llm_dollars(run_id)` says (so a resumed run does not get a fresh budget), else 0.
    """

    def __init__(self, store: LLMCallSink | None = None, run_id: int | None = None,
                 budget_dollars: float | None = None, *, prices: _prices.PriceTable | None = None,
                 already_spent: float | None = None) -> None:
        if budget_dollars is not None and budget_dollars < 0:
            raise ValueError(f"budget_dollars must be >= 0 or None, got {budget_dollars}")
        self.store = store
        self.run_id = run_id
        self.budget_dollars = budget_dollars
        self.prices = prices
        if already_spent is None:
            # A resumed run keeps drawing from the same budget: start from what the store says it spent.
            loader = getattr(store, "llm_dollars", None)
            already_spent = float(loader(run_id)) if loader is not None and run_id is not None else 0.0
        self._spent = float(already_spent)
        self._entries: list[LedgerEntry] = []
        self._unpriced_warned: set[str] = set()
        self._lock = threading.Lock()

    # -- reading --------------------------------------------------------------------------------------------
    @property
    def spent_dollars(self) -> float:
        with self._lock:
            return self._spent

    @property
    def remaining_dollars(self) -> float | None:
        if self.budget_dollars is None:
            return None
        return max(0.0, self.budget_dollars - self.spent_dollars)

    @property
    def entries(self) -> list[LedgerEntry]:
        with self._lock:
            return list(self._entries)

    def totals(self) -> dict[str, Any]:
        """calls, failed, prompt/completion tokens, dollars spent (priced calls only), unpriced calls."""
        es = self.entries
        return {
            "calls": len(es),
            "failed": sum(not e.ok for e in es),
            "prompt_tokens": sum(e.prompt_tokens or 0 for e in es),
            "completion_tokens": sum(e.completion_tokens or 0 for e in es),
            "dollars": self.spent_dollars,
            "unpriced_calls": sum(e.dollars is None and (e.prompt_tokens or 0) > 0 for e in es),
        }

    # -- writing --------------------------------------------------------------------------------------------
    def check_budget(self, purpose: str) -> None:
        """Raise LLMBudgetExceeded when the budget is spent."""
        if self.budget_dollars is None:
            return
        spent = self.spent_dollars
        if spent >= self.budget_dollars:
            raise LLMBudgetExceeded(
                f"LLM budget spent: ${spent:.4f} of ${self.budget_dollars:.4f}; call '{purpose}' was not sent. "
                "Raise the run's LLM dollar budget to continue.")

    def record(self, *, purpose: str, model: str, prompt_tokens: int | None, completion_tokens: int | None,
               latency_s: float, dollars: float | None, ok: bool, error: str | None,
               request_hash: str) -> LedgerEntry:
        error = redact(error) if error else error
        if dollars is None:
            dollars = _prices.cost(model, prompt_tokens, completion_tokens, self.prices)
        if dollars is None and prompt_tokens and self.budget_dollars is not None and model not in \
                self._unpriced_warned:
            self._unpriced_warned.add(model)
            log.warning("no price known for model %r: its calls are recorded in tokens only and do not count "
                        "against the $%.2f budget (add it to the price table to count them)", model,
                        self.budget_dollars)
        entry = LedgerEntry(purpose=purpose, model=model, prompt_tokens=prompt_tokens,
                            completion_tokens=completion_tokens, latency_s=latency_s, dollars=dollars, ok=ok,
                            error=error, request_hash=request_hash, at=time.time())
        with self._lock:
            self._entries.append(entry)
            if dollars:
                self._spent += dollars
            if self.store is not None:
                # Under the lock so the store's rows come in the same order as the in-memory entries.
                # The store's columns are NOT NULL: a call that never got an answer has 0 tokens there
                # (the in-memory entry keeps None) and no error is "".
                self.store.add_llm_call(run_id=self.run_id, model=model, purpose=purpose,
                                        prompt_tokens=prompt_tokens or 0, completion_tokens=completion_tokens or 0,
                                        latency_s=latency_s, dollars=dollars, ok=ok, error=error or "",
                                        request_hash=request_hash)
        return entry

    def wrap(self, inner: LLMClient) -> LedgeredClient:
        return LedgeredClient(inner, self)


def _model_of(client: Any) -> str:
    """Best guess of the model a failed call was meant for (the answer that would name it never came)."""
    for obj in (client, getattr(client, "inner", None)):
        config = getattr(obj, "config", None)
        model = getattr(config, "model", None)
        if model:
            return str(model)
    return "unknown"


class LedgeredClient:
    """An `LLMClient` that checks the budget before and records every call after, in `ledger`."""

    def __init__(self, inner: LLMClient, ledger: Ledger) -> None:
        self.inner = inner
        self.ledger = ledger

    def complete(self, messages: list[dict], *, purpose: str, temperature: float | None = None,
                 max_tokens: int | None = None) -> Completion:
        rh = request_hash(messages, purpose)
        try:
            self.ledger.check_budget(purpose)
        except LLMBudgetExceeded as exc:
            self.ledger.record(purpose=purpose, model=_model_of(self.inner), prompt_tokens=None,
                               completion_tokens=None, latency_s=0.0, dollars=0.0, ok=False,
                               error=f"refused: {exc}", request_hash=rh)
            raise
        start = time.monotonic()
        try:
            c = self.inner.complete(messages, purpose=purpose, temperature=temperature, max_tokens=max_tokens)
        except LLMTruncated as exc:
            # Paid for: tokens and dollars count.
            t = exc.completion
            self.ledger.record(purpose=purpose, model=t.model, prompt_tokens=t.prompt_tokens,
                               completion_tokens=t.completion_tokens, latency_s=t.latency_s, dollars=t.dollars,
                               ok=False, error=f"truncated: {exc}", request_hash=rh)
            raise
        except Exception as exc:
            self.ledger.record(purpose=purpose, model=_model_of(self.inner), prompt_tokens=None,
                               completion_tokens=None, latency_s=time.monotonic() - start, dollars=None,
                               ok=False, error=f"{type(exc).__name__}: {exc}", request_hash=rh)
            raise
        entry = self.ledger.record(purpose=purpose, model=c.model, prompt_tokens=c.prompt_tokens,
                                   completion_tokens=c.completion_tokens, latency_s=c.latency_s,
                                   dollars=c.dollars, ok=True, error=None, request_hash=rh)
        if c.dollars is None and entry.dollars is not None:
            c = dataclasses.replace(c, dollars=entry.dollars)
        return c
