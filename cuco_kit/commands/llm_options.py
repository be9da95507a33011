"""What the LLM-using commands (`cuco search --mutator llm|mixed`, `cuco fastpath`) share: the LLM flags (timeout,
retries, dollar and token budgets), their validation, the check that the server answers before any work starts,
the budget left in the database, and a breaker that stops a search whose LLM keeps failing.

Not a command itself: `cuco_kit.cli.COMMANDS` does not list it.
"""
from __future__ import annotations

import argparse
import http.client
import math
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlparse

from cuco_kit.errors import BadInput, CucoError
from cuco_kit.llm import Completion, LedgerEntry, LLMClient, LLMConfig, LLMRequestRejected, LLMUnavailable
from cuco_kit.llm.ledger import DEFAULT_TOKEN_BUDGET, Ledger, LLMCallSink
from cuco_kit.search.budget import DEFAULT_LLM_DOLLARS
from cuco_kit.terminal import one_line

LLM_HINT = ("point cuco at an OpenAI-compatible server: export OPENAI_BASE_URL=http://localhost:8000/v1 (vLLM; "
            "Ollama: http://localhost:11434/v1, LM Studio: http://localhost:1234/v1) and OPENAI_API_KEY (any value "
            "for a local server), and name the model with CUCO_MODEL")
DEFAULT_BUDGET_DOLLARS = DEFAULT_LLM_DOLLARS
MAX_RETRIES = 20
MAX_TIMEOUT_S = 3600.0
# Budgets far above what a search spends (the paper's bound is $10 a workload): a larger one is a typo.
MAX_BUDGET_DOLLARS = 10_000.0
MAX_TOKEN_BUDGET = 10**10
PROBE_TIMEOUT_S = 10.0  # the reachability check waits at most this long (or --llm-timeout, when shorter)
BREAKER_FAILURES = 3  # consecutive unanswered calls after which a search stops asking the LLM


def add_llm_arguments(parser: argparse.ArgumentParser, scope: str = "database") -> None:
    """The LLM flags; ``scope`` says what the budgets count ("run": this run in every session; "database": every
    call in --db; "import": this command's calls)."""
    counts = {"run": "what this run spent in earlier sessions counts",
              "database": "what earlier runs in --db spent counts",
              "import": "only this command's calls count"}[scope]
    g = parser.add_argument_group("LLM")
    g.add_argument("--llm-timeout", type=float, default=LLMConfig.timeout_s, metavar="SECONDS",
                   help=f"seconds to wait for one answer (default {LLMConfig.timeout_s:g})")
    g.add_argument("--llm-retries", type=int, default=LLMConfig.max_retries, metavar="N",
                   help=f"retries of a call that timed out or failed (default {LLMConfig.max_retries})")
    g.add_argument("--llm-budget", type=float, default=DEFAULT_BUDGET_DOLLARS, metavar="DOLLARS",
                   help=f"LLM dollar budget, per {scope}: {counts} (default {DEFAULT_BUDGET_DOLLARS:g})")
    g.add_argument("--llm-token-budget", type=int, default=DEFAULT_TOKEN_BUDGET, metavar="TOKENS",
                   help=f"tokens that calls to a model of unknown price may use, per {scope} (such a model is "
                        f"never counted as free; default {DEFAULT_TOKEN_BUDGET})")


def check_llm_arguments(args: argparse.Namespace) -> None:
    """BadInput (one line) for a nonsense LLM flag."""
    t = args.llm_timeout
    if not (math.isfinite(t) and 0 < t <= MAX_TIMEOUT_S):
        raise BadInput(f"--llm-timeout {t:g}: must be more than 0 and at most {MAX_TIMEOUT_S:g} seconds")
    if not 0 <= args.llm_retries <= MAX_RETRIES:
        raise BadInput(f"--llm-retries {args.llm_retries}: must be between 0 and {MAX_RETRIES}")
    if not (math.isfinite(args.llm_budget) and 0 < args.llm_budget <= MAX_BUDGET_DOLLARS):
        raise BadInput(f"--llm-budget {args.llm_budget:g}: must be more than 0 and at most {MAX_BUDGET_DOLLARS:g} "
                       "dollars")
    if not 0 < args.llm_token_budget <= MAX_TOKEN_BUDGET:
        raise BadInput(f"--llm-token-budget {args.llm_token_budget}: must be more than 0 and at most "
                       f"{MAX_TOKEN_BUDGET} tokens")


def llm_config(args: argparse.Namespace, model: str | None = None) -> LLMConfig:
    """The LLMConfig for the command's flags (server and model from the environment, see LLMConfig)."""
    return LLMConfig(model=model, timeout_s=args.llm_timeout, max_retries=args.llm_retries)


def check_llm_reachable(base_url: str, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Raise CucoError (one line, with the how-to) unless an HTTP server answers at the LLM server's address.

    GET <base_url>/models with no key: any HTTP answer (200, 401, 404, ...) means a server is there; nothing
    listening, or a server that accepts and says nothing within `timeout_s`, is an error.
    """
    u = urlparse(base_url)
    if not u.hostname or u.scheme not in ("http", "https"):
        raise CucoError(f"LLM server URL {base_url!r} is not an http(s) URL; {LLM_HINT}")
    silent = (f"the LLM server at {base_url} accepted the connection but did not answer within {timeout_s:g} s; "
              f"check that it is up and serving (or raise --llm-timeout); {LLM_HINT}")
    try:
        with urllib.request.urlopen(base_url.rstrip("/") + "/models", timeout=timeout_s):
            pass
    except urllib.error.HTTPError:
        return  # an HTTP status is an answer: something serves there
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, TimeoutError):
            raise CucoError(silent) from None
        why = getattr(exc.reason, "strerror", None) or exc.reason
        raise CucoError(f"no LLM server reachable at {base_url} ({why}); {LLM_HINT}") from None
    except (TimeoutError, http.client.RemoteDisconnected):
        raise CucoError(silent) from None
    except (OSError, http.client.HTTPException) as exc:
        raise CucoError(f"no LLM server reachable at {base_url} ({type(exc).__name__}: {exc}); {LLM_HINT}") \
            from None


def check_budget_left(store: LLMCallSink, model: str, args: argparse.Namespace, db: object) -> None:
    """BadInput when the database has already spent the LLM budget the flags give (nothing would be sent)."""
    why = Ledger(store, None, args.llm_budget, budget_tokens=args.llm_token_budget).exhausted(model)
    if why is not None:
        raise BadInput(f"--db {db}: {why} (--llm-budget, --llm-token-budget)")


def unanswered(entries: Sequence[LedgerEntry]) -> list[LedgerEntry]:
    """The calls that got no answer at all (server down, timed out, refused the request); budget refusals and
    truncated answers are not among them."""
    return [e for e in entries if not e.ok and e.prompt_tokens is None and not (e.error or "").startswith("refused")]


def llm_failure(entries: Sequence[LedgerEntry], base_url: str) -> str | None:
    """One line when the LLM answered none of the calls in `entries` that were sent; None otherwise."""
    failed = unanswered(entries)
    if not failed or any(e.ok or e.prompt_tokens is not None for e in entries):
        return None
    last = one_line(failed[-1].error)[:300]
    what = "was unreachable" if all((e.error or "").startswith(LLMUnavailable.__name__) for e in failed) \
        else "failed"
    return (f"the LLM at {base_url} {what}: all {len(failed)} call(s) got no answer (last: {last}); no LLM "
            f"proposal was made. Check the server and model (OPENAI_BASE_URL, CUCO_MODEL); --llm-timeout and "
            "--llm-retries bound the wait")


class LLMBreaker:
    """An LLMClient that passes calls through until `limit` calls in a row got no answer; then it calls
    `on_trip` once (the search stops) and fails every later call at once, without sending it."""

    def __init__(self, inner: LLMClient, limit: int = BREAKER_FAILURES,
                 on_trip: Callable[[], Any] | None = None) -> None:
        self.inner = inner
        self.limit = limit
        self.on_trip = on_trip
        self.failures = 0
        self.tripped = False

    @property
    def config(self) -> Any:
        return getattr(self.inner, "config", None)

    def complete(self, messages: list[dict[str, Any]], *, purpose: str, temperature: float | None = None,
                 max_tokens: int | None = None) -> Completion:
        if self.tripped:
            raise LLMUnavailable(f"LLM call '{purpose}' not sent: the last {self.limit} calls got no answer")
        try:
            c = self.inner.complete(messages, purpose=purpose, temperature=temperature, max_tokens=max_tokens)
        except (LLMUnavailable, LLMRequestRejected):
            self.failures += 1
            if self.failures >= self.limit:
                self.tripped = True
                if self.on_trip is not None:
                    self.on_trip()
            raise
        self.failures = 0
        return c
