"""Price table: model -> (input $ per million tokens, output $ per million tokens).

The figures are list prices published by the providers (2025) for a few common models; providers change them,
so check your provider's pricing page and pass your own table through `LLMConfig.prices` or
`Ledger(prices=...)` when it matters. A model not in the table (a local vLLM/Ollama model, say) gets
`dollars=None`: it is not counted as free, its tokens count against the ledger's token budget instead.
"""
from __future__ import annotations

import re
from collections.abc import Mapping

PriceTable = Mapping[str, tuple[float, float]]

PRICES: dict[str, tuple[float, float]] = {
    "gpt-4o": (2.50, 10.00),
    "gpt-4o-mini": (0.15, 0.60),
    "gpt-4.1": (2.00, 8.00),
    "gpt-4.1-mini": (0.40, 1.60),
    "gpt-4.1-nano": (0.10, 0.40),
    "gpt-5": (1.25, 10.00),
    "gpt-5-mini": (0.25, 2.00),
    "gpt-5-nano": (0.05, 0.40),
    "o3": (2.00, 8.00),
    "o4-mini": (1.10, 4.40),
    "claude-sonnet-4": (3.00, 15.00),
    "claude-opus-4": (15.00, 75.00),
    "text-embedding-3-small": (0.02, 0.0),
    "text-embedding-3-large": (0.13, 0.0),
}

# Dated snapshots ("gpt-4o-mini-2024-07-18", "claude-sonnet-4-20250514") cost what their base model costs;
# any other suffix ("gpt-4o-audio-preview") is a different product and stays unknown.
_SNAPSHOT = re.compile(r"-(\d{4}-\d{2}-\d{2}|\d{8}|\d{4})$")


def lookup(model: str, prices: PriceTable | None = None) -> tuple[float, float] | None:
    """The (input, output) $/Mtok of `model`, or None when unknown.

    `prices` entries override the built-in table. A provider prefix ("openai/gpt-4o") is ignored.
    """
    table: dict[str, tuple[float, float]] = dict(PRICES)
    if prices:
        table.update(prices)
    for name in (model, model.rsplit("/", 1)[-1]):
        if name in table:
            return table[name]
        m = _SNAPSHOT.search(name)
        if m and name[: m.start()] in table:
            return table[name[: m.start()]]
    return None


def cost(model: str, prompt_tokens: int | None, completion_tokens: int | None,
         prices: PriceTable | None = None) -> float | None:
    """Dollars for one call, or None when the model's price or the token counts are unknown."""
    price = lookup(model, prices)
    if price is None or prompt_tokens is None or completion_tokens is None:
        return None
    return (prompt_tokens * price[0] + completion_tokens * price[1]) / 1e6
