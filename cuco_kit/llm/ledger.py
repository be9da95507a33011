"""The usage and cost ledger, with a hard dollar budget and a token budget for models of unknown price.

Every call made through a `LedgeredClient` is recorded, whether it succeeded, was truncated, failed or was
refused, in memory (`Ledger.entries`, for notebooks) and, when a store is given, through
`store.add_llm_call(...)`. Dollars come from the completion when the client priced it, else from the price
table (the answer's model, else the model that was asked for).

The budget is hard: before a call is sent, the ledger RESERVES its worst case (an upper bound on the prompt's
tokens, from the messages' bytes, plus the completion's `max_tokens`, at the asked model's price) and refuses
the call when the reservation does not fit next to what is spent and what calls in flight have reserved. When
the call ends, its reservation is released and its real cost counted. So concurrent calls cannot together
overshoot. A server that reports more than a call was allowed (more completion tokens than `max_tokens`, more
prompt tokens than the prompt's bytes) is not believed and not followed: the call is counted at its reservation
(tokens and dollars clamped to what it allowed; the reported figures go into the call's error column), and the
ledger sends no further call, so the total never passes the budget. A call to a
priced model with no `max_tokens` (and none configured) is sent with `DEFAULT_MAX_TOKENS`: without a cap a call
has no worst case.

A model with no known price is never counted as free: its calls count TOKENS (prompt + completion) against
`budget_tokens` (by default `DEFAULT_TOKEN_BUDGET` whenever a dollar budget is set), reserved the same way;
such a call without a cap is sent as it is (a local server's context may be smaller than any cap we would pick)
and reserved as if it had `DEFAULT_MAX_TOKENS`.

With a store, the budget is per DATABASE by default: what every earlier run and command spent in that store
counts, so a second `cuco fastpath` on the same database does not get a fresh budget. With `per_run=True` (the
search) it is per RUN: what this run spent, in every session of it, counts, so a resumed run does not get a fresh
budget either, and another run in the same file has its own. Every client that shares one `Ledger` (the
search's mutators and evaluation-side helpers alike) draws from the same budget.

Errors are redacted (redact.py) before they are kept or stored: whatever client raised them, no configured key
and nothing shaped like a credential reaches the store's error column.
"""
from __future__ import annotations

import dataclasses
import logging
import math
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
    canonical_json,
    request_hash,
)
from cuco_kit.llm.redact import redact

log = logging.getLogger("cuco_kit.llm")

# The completion cap sent with a call that names none (and whose client configures none).
DEFAULT_MAX_TOKENS = 16384
# Tokens that calls to models of unknown price may use when a dollar budget is set and no token budget is given:
# about what $5 buys at a mid-range model's price.
DEFAULT_TOKEN_BUDGET = 1_000_000
# Tokens a chat template adds per message (role markers) and per request, on top of the content.
_TOKENS_PER_MESSAGE = 8
_TOKENS_PER_REQUEST = 8


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


@dataclass(frozen=True)
class Reservation:
    """The worst case of one call in flight, held against the budget until the call ends."""

    model: str
    price: tuple[float, float] | None  # input, output $/Mtok; None: unknown, the call counts tokens
    prompt_tokens: int  # upper bound
    max_tokens: int
    dollars: float  # worst-case dollars (0 when the price is unknown)
    capped: bool = True  # max_tokens was sent with the call (a server may be held to it)

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.max_tokens


def prompt_tokens_bound(messages: list[dict[str, Any]]) -> int:
    """An upper bound on the prompt tokens of `messages`: the UTF-8 bytes of each message's JSON plus the chat
    template's overhead. Byte-level tokenizers (BPE with byte fallback) never make more tokens than bytes."""
    return _TOKENS_PER_REQUEST + sum(len(canonical_json(m).encode("utf-8")) + _TOKENS_PER_MESSAGE
                                     for m in messages)


def _store_totals(store: Any, run_id: int | None = None) -> tuple[float, int]:
    """(dollars, tokens of unpriced calls) the store holds over its whole database, or for one run when
    `run_id` is given; (0, 0) without a store."""
    calls = getattr(store, "llm_calls", None)
    if calls is None:
        return 0.0, 0
    dollars, tokens = 0.0, 0
    for row in (calls() if run_id is None else calls(run_id)):
        if row["dollars"] is None:
            tokens += int(row["prompt_tokens"] or 0) + int(row["completion_tokens"] or 0)
        else:
            dollars += float(row["dollars"])
    return dollars, tokens


class Ledger:
    """Counts tokens, latency and dollars of LLM calls and enforces the budgets (see the module doc).

    `budget_dollars`: hard dollar budget (None: none). `budget_tokens`: tokens that calls to models of unknown
    price may use (None: `DEFAULT_TOKEN_BUDGET` when a dollar budget is set, else no limit).
    `already_spent` / `already_spent_tokens`: dollars and unpriced tokens spent before this ledger existed; by
    default what the store holds over its whole database, or over run `run_id` with `per_run` (0 without a
    store).
    """

    def __init__(self, store: LLMCallSink | None = None, run_id: int | None = None,
                 budget_dollars: float | None = None, *, budget_tokens: int | None = None,
                 prices: _prices.PriceTable | None = None, already_spent: float | None = None,
                 already_spent_tokens: int | None = None, per_run: bool = False) -> None:
        if budget_dollars is not None and not (budget_dollars >= 0 and math.isfinite(budget_dollars)):
            raise ValueError(f"budget_dollars must be a finite number >= 0 or None, got {budget_dollars}")
        if budget_tokens is not None and budget_tokens < 0:
            raise ValueError(f"budget_tokens must be >= 0 or None, got {budget_tokens}")
        self.store = store
        self.run_id = run_id
        self.budget_dollars = budget_dollars
        self.budget_tokens = budget_tokens if budget_tokens is not None or budget_dollars is None \
            else DEFAULT_TOKEN_BUDGET
        self.prices = prices
        if already_spent is None or already_spent_tokens is None:
            # The budget is per database: a resumed run, or another command on the same file, draws from it too.
            db_dollars, db_tokens = _store_totals(store, run_id if per_run else None)
            already_spent = db_dollars if already_spent is None else already_spent
            already_spent_tokens = db_tokens if already_spent_tokens is None else already_spent_tokens
        self._spent = float(already_spent)
        self._tokens = int(already_spent_tokens)
        self._reserved_dollars = 0.0
        self._reserved_tokens = 0
        self._entries: list[LedgerEntry] = []
        self._overbilled = ""  # why no further call is sent: a server reported more than a call allowed
        self._lock = threading.Lock()

    # -- reading --------------------------------------------------------------------------------------------
    @property
    def spent_dollars(self) -> float:
        with self._lock:
            return self._spent

    @property
    def spent_tokens(self) -> int:
        """Tokens of calls at unknown price (the ones the token budget counts)."""
        with self._lock:
            return self._tokens

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
        """calls, failed, prompt/completion tokens, dollars spent (priced calls, database-wide with a store),
        unpriced calls and their tokens."""
        es = self.entries
        return {
            "calls": len(es),
            "failed": sum(not e.ok for e in es),
            "prompt_tokens": sum(e.prompt_tokens or 0 for e in es),
            "completion_tokens": sum(e.completion_tokens or 0 for e in es),
            "dollars": self.spent_dollars,
            "unpriced_calls": sum(e.dollars is None and (e.prompt_tokens or 0) > 0 for e in es),
            "unpriced_tokens": self.spent_tokens,
        }

    def exhausted(self, model: str) -> str | None:
        """Why no call to `model` can be sent at all now (one line), or None while there is budget left."""
        with self._lock:
            if self._overbilled:
                return self._overbilled
            if self.budget_dollars is not None and self._spent >= self.budget_dollars:
                return (f"the LLM budget is spent: ${self._spent:.4f} of ${self.budget_dollars:.4f} (the budget "
                        "counts every call in the database); raise the LLM dollar budget to continue")
            if _prices.lookup(model, self.prices) is None and self.budget_tokens is not None \
                    and self._tokens >= self.budget_tokens:
                return (f"the LLM token budget is spent: model {model!r} has no known price, so its calls count "
                        f"tokens, and {self._tokens} of {self.budget_tokens} are used; raise the token budget or "
                        "add the model's price to the price table")
        return None

    # -- writing --------------------------------------------------------------------------------------------
    def reserve(self, model: str, messages: list[dict[str, Any]], max_tokens: int, purpose: str, *,
                capped: bool = True) -> Reservation:
        """Hold the worst case of a call to `model` against the budget, or raise LLMBudgetExceeded (nothing is
        held then). ``capped``: the call is sent with ``max_tokens`` (else it is only reserved as if it were).
        Every reservation must be settled by `record(..., reservation=r)`."""
        price = _prices.lookup(model, self.prices)
        bound = prompt_tokens_bound(messages)
        worst = 0.0 if price is None else (bound * price[0] + max_tokens * price[1]) / 1e6
        r = Reservation(model, price, bound, max_tokens, worst, capped)
        with self._lock:
            why = self._refusal(r, purpose)
            if why is not None:
                raise LLMBudgetExceeded(why)
            self._reserved_dollars += r.dollars
            self._reserved_tokens += r.tokens if price is None else 0
        return r

    def _refusal(self, r: Reservation, purpose: str) -> str | None:
        if self._overbilled:
            return self._overbilled
        if self.budget_dollars is not None:
            held = self._spent + self._reserved_dollars
            if self._spent >= self.budget_dollars or held + r.dollars > self.budget_dollars:
                return (f"LLM budget: call '{purpose}' to {r.model} could cost up to ${r.dollars:.4f} "
                        f"({r.prompt_tokens} prompt + {r.max_tokens} completion tokens at most), and "
                        f"${self._spent:.4f} of ${self.budget_dollars:.4f} is spent (${self._reserved_dollars:.4f} "
                        "more held by calls in flight); the call was not sent. Raise the LLM dollar budget to "
                        "continue.")
        if r.price is None and self.budget_tokens is not None:
            held_tokens = self._tokens + self._reserved_tokens
            if held_tokens + r.tokens > self.budget_tokens:
                return (f"LLM token budget: model {r.model!r} has no known price, so its calls count tokens; call "
                        f"'{purpose}' could use up to {r.tokens} and {self._tokens} of {self.budget_tokens} are used "
                        f"({self._reserved_tokens} more held by calls in flight); the call was not sent. Raise the "
                        "token budget or add the model's price to the price table.")
        return None

    def release(self, reservation: Reservation) -> None:
        """Give a reservation back without counting a call (the call never ended)."""
        with self._lock:
            self._release(reservation)

    def _release(self, r: Reservation) -> None:
        self._reserved_dollars = max(0.0, self._reserved_dollars - r.dollars)
        if r.price is None:
            self._reserved_tokens = max(0, self._reserved_tokens - r.tokens)

    def record(self, *, purpose: str, model: str, prompt_tokens: int | None, completion_tokens: int | None,
               latency_s: float, dollars: float | None, ok: bool, error: str | None,
               request_hash: str, reservation: Reservation | None = None) -> LedgerEntry:
        """Count one call (and release its reservation, if it had one)."""
        error = redact(error) if error else error
        if dollars is None:
            dollars = _prices.cost(model, prompt_tokens, completion_tokens, self.prices)
        if dollars is None and reservation is not None and reservation.price is not None \
                and prompt_tokens is not None and completion_tokens is not None:
            # The server named its model differently (a dated snapshot, a local alias): the price of the model
            # that was asked for is what this call costs.
            dollars = (prompt_tokens * reservation.price[0] + completion_tokens * reservation.price[1]) / 1e6
        over = _overbilled(reservation, prompt_tokens, completion_tokens, dollars) if reservation else ""
        if reservation is not None and over:
            # Not believed: counted at what the call was allowed, and no further call goes to such a server.
            prompt_tokens = min(prompt_tokens or 0, reservation.prompt_tokens)
            if reservation.capped:
                completion_tokens = min(completion_tokens or 0, reservation.max_tokens)
            if dollars is not None and reservation.price is not None:
                dollars = min(dollars, reservation.dollars)
            error = f"{error}; {over}" if error else over
            log.warning("LLM call '%s': %s", purpose, over)
        unpriced_tokens = (prompt_tokens or 0) + (completion_tokens or 0) if dollars is None else 0
        entry = LedgerEntry(purpose=purpose, model=model, prompt_tokens=prompt_tokens,
                            completion_tokens=completion_tokens, latency_s=latency_s, dollars=dollars, ok=ok,
                            error=error, request_hash=request_hash, at=time.time())
        with self._lock:
            if reservation is not None:
                self._release(reservation)
            if over and not self._overbilled:
                self._overbilled = (f"LLM budget: the server reported more than call '{purpose}' allowed ({over}); "
                                    "what it bills cannot be bounded, so no further LLM call is sent (check the "
                                    "server's max_tokens handling, then run again)")
            self._entries.append(entry)
            if dollars:
                self._spent += dollars
            self._tokens += unpriced_tokens
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


def _overbilled(r: Reservation, prompt_tokens: int | None, completion_tokens: int | None,
                dollars: float | None) -> str:
    """What a call's reported usage claims beyond its reservation ("" when nothing): the reported figures, and
    what the ledger counts instead."""
    # An uncapped call (a local model of unknown price) may answer at any length: only its prompt is bounded.
    over_tokens = (prompt_tokens or 0) > r.prompt_tokens or (r.capped and (completion_tokens or 0) > r.max_tokens)
    over_dollars = dollars is not None and r.price is not None and dollars > r.dollars + 1e-12
    if not (over_tokens or over_dollars):
        return ""
    cost = f", ${dollars:.4f}" if dollars is not None else ""
    worst = f", ${r.dollars:.4f}" if r.price is not None else ""
    return (f"reported {prompt_tokens} prompt + {completion_tokens} completion tokens{cost}, more than the "
            f"{r.prompt_tokens} + {r.max_tokens}{worst} it allowed; counted as allowed")


def _config_value(client: Any, name: str) -> Any:
    """A field of the client's LLMConfig (or of the client it wraps); None when neither has one."""
    for obj in (client, getattr(client, "inner", None)):
        value = getattr(getattr(obj, "config", None), name, None)
        if value:
            return value
    return None


class LedgeredClient:
    """An `LLMClient` that reserves each call's worst case before sending it and records what it cost after,
    in `ledger`."""

    def __init__(self, inner: LLMClient, ledger: Ledger) -> None:
        self.inner = inner
        self.ledger = ledger

    def complete(self, messages: list[dict[str, Any]], *, purpose: str, temperature: float | None = None,
                 max_tokens: int | None = None) -> Completion:
        rh = request_hash(messages, purpose)
        # The best guess of the model before an answer names it: the configured one.
        model = str(_config_value(self.inner, "model") or "unknown")
        cap = max_tokens or _config_value(self.inner, "max_tokens")
        if cap is None and _prices.lookup(model, self.ledger.prices) is not None:
            cap = DEFAULT_MAX_TOKENS  # a paid call needs a worst case; a local server keeps its own default
        try:
            reservation = self.ledger.reserve(model, messages, int(cap or DEFAULT_MAX_TOKENS), purpose,
                                              capped=cap is not None)
        except LLMBudgetExceeded as exc:
            self.ledger.record(purpose=purpose, model=model, prompt_tokens=None, completion_tokens=None,
                               latency_s=0.0, dollars=0.0, ok=False, error=f"refused: {exc}", request_hash=rh)
            raise
        start = time.monotonic()
        try:
            c = self.inner.complete(messages, purpose=purpose, temperature=temperature, max_tokens=cap)
        except LLMTruncated as exc:
            # Paid for: tokens and dollars count.
            t = exc.completion
            self.ledger.record(purpose=purpose, model=t.model, prompt_tokens=t.prompt_tokens,
                               completion_tokens=t.completion_tokens, latency_s=t.latency_s, dollars=t.dollars,
                               ok=False, error=f"truncated: {exc}", request_hash=rh, reservation=reservation)
            raise
        except Exception as exc:
            self.ledger.record(purpose=purpose, model=model, prompt_tokens=None, completion_tokens=None,
                               latency_s=time.monotonic() - start, dollars=None, ok=False,
                               error=f"{type(exc).__name__}: {exc}", request_hash=rh, reservation=reservation)
            raise
        except BaseException:
            self.ledger.release(reservation)  # interrupted: nothing to record, but nothing stays held
            raise
        entry = self.ledger.record(purpose=purpose, model=c.model, prompt_tokens=c.prompt_tokens,
                                   completion_tokens=c.completion_tokens, latency_s=c.latency_s,
                                   dollars=c.dollars, ok=True, error=None, request_hash=rh, reservation=reservation)
        if c.dollars is None and entry.dollars is not None:
            c = dataclasses.replace(c, dollars=entry.dollars)
        return c
